"""Where a job's checkpoints live, and whether a reported checkpoint lies there.

The worker gives every attempt this folder as ``ZEROPILOT_CHECKPOINT_DIR``; the API accepts a
checkpoint report only for a path inside it, after resolving ``..`` and symbolic links, so an
attempt's token cannot make another job's (or team's) files this job's resume point.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def checkpoint_dir(data_dir: Path, job_id: str, spec: dict[str, Any]) -> str:
    """The spec's ``checkpoint.dir``, else the job's folder under the data folder. A relative
    ``dir`` is read from the working_dir, where the training process starts."""
    configured = (spec.get("checkpoint") or {}).get("dir")
    if not configured:
        return str(data_dir / "jobs" / job_id / "checkpoints")
    return os.path.join(spec.get("working_dir") or data_dir, configured)


def lies_within(folder: str, path: str) -> bool:
    """Whether ``path`` is ``folder`` or below it, both read as the filesystem resolves them."""
    if not os.path.isabs(path):
        return False
    try:
        real_folder, real_path = os.path.realpath(folder), os.path.realpath(path)
    except ValueError:  # a lone surrogate or NUL: no file can have that name
        return False
    return os.path.commonpath([real_folder, real_path]) == real_folder
