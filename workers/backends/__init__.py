"""Backends by cluster kind; each module exposes submit, poll, logs and cancel (see base)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # not at run time: base imports pydantic, which the supervisor must not
    from workers.backends import kubernetes, local, slurm
    from workers.backends.base import Backend

    # mypy proves here that each backend module implements the protocol
    _CHECKED: tuple[Backend, ...] = (local, slurm, kubernetes)

# By service.core.clusters.BackendKind's values, which are not imported here: the local
# supervisor, a module of this package started for every attempt, then starts without
# pydantic (its import was most of the supervisor's 0.1 s start).
_MODULES = {
    "local": "workers.backends.local",
    "slurm": "workers.backends.slurm",
    "kubernetes": "workers.backends.kubernetes",
}


def get_backend(kind: str) -> Backend:
    """The backend module for a cluster kind, imported on first use."""
    module = _MODULES.get(str(kind))  # a BackendKind member's str is its value
    if module is None:
        raise ValueError(f"no backend for cluster kind {kind!r}")
    return cast("Backend", importlib.import_module(module))
