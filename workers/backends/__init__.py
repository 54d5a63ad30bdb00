"""Backends by cluster kind; each module exposes submit, poll, logs and cancel (see base)."""

from __future__ import annotations

import importlib
from types import ModuleType

# By service.core.clusters.BackendKind's values, which are not imported here: the local
# supervisor, a module of this package started for every attempt, then starts without
# pydantic (its import was most of the supervisor's 0.1 s start).
_MODULES = {
    "local": "workers.backends.local",
    "slurm": "workers.backends.slurm",
    "kubernetes": "workers.backends.kubernetes",
}


def get_backend(kind: str) -> ModuleType:
    """The backend module for a cluster kind, imported on first use."""
    module = _MODULES.get(str(kind))  # a BackendKind member's str is its value
    if module is None:
        raise ValueError(f"no backend for cluster kind {kind!r}")
    return importlib.import_module(module)
