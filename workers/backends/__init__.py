"""Backends by cluster kind; each module exposes submit, poll, logs and cancel (see base)."""

from __future__ import annotations

import importlib
from types import ModuleType

from service.core.clusters import BackendKind

_MODULES = {
    BackendKind.LOCAL: "workers.backends.local",
    BackendKind.SLURM: "workers.backends.slurm",
    BackendKind.KUBERNETES: "workers.backends.kubernetes",
}


def get_backend(kind: str) -> ModuleType:
    """The backend module for a cluster kind, imported on first use."""
    try:
        return importlib.import_module(_MODULES[BackendKind(kind)])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"no backend for cluster kind {kind!r}") from exc
