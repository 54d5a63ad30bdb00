"""Renderers shared by the backends: the DeepSpeed hostfile and the ssh-less launcher command.

Every value here ends up in an argv list, never in a shell string; backends that must write a
shell script (Slurm) quote each element themselves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def render_hostfile(hosts: Sequence[str], slots: int) -> str:
    """DeepSpeed's hostfile: one ``<host> slots=<n>`` line per node, in node-rank order."""
    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    return "".join(f"{host} slots={slots}\n" for host in hosts)


def launcher_argv(
    *,
    python: str,
    hostfile: str,
    node_rank: str,
    master_addr: str,
    master_port: str,
    entrypoint: str,
    args: Sequence[str],
    ds_config: str,
) -> list[str]:
    """The per-node command: DeepSpeed's launcher in ssh-less mode, then the training script."""
    return [
        python,
        "-m",
        "deepspeed.launcher.runner",
        "--no_ssh",
        "--hostfile",
        hostfile,
        "--node_rank",
        node_rank,
        "--master_addr",
        master_addr,
        "--master_port",
        master_port,
        entrypoint,
        *args,
        "--deepspeed_config",
        ds_config,
    ]


# An attempt's folder holds its runtime token (launch.json, Slurm's node script): only the
# service's own user may read it. Files are created with these modes, never chmod-ed later.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700; missing parents as usual) unless it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file that is mode 0600 from the moment it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def write_json_once(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Write ``payload`` unless the file exists; return what the file holds (idempotent renders)."""
    if not path.exists():
        draft = path.with_name(f".{path.name}.{os.getpid()}")
        write_private(draft, json.dumps(payload, indent=2, sort_keys=True))
        try:  # a hard link never replaces: the first writer wins, concurrent ones read its file
            path.hardlink_to(draft)
        except FileExistsError:
            pass
        finally:
            draft.unlink(missing_ok=True)
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded
