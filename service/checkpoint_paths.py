"""Where a job's checkpoints live, and whether a checkpoint lies there.

The worker gives every attempt its folder as ``ZEROPILOT_CHECKPOINT_DIR``: the job's own folder
under the service's data, or the spec's ``checkpoint.dir`` when that lies inside one of the
team's checkpoint roots (set by an admin). The fence around it has two halves: a root the
service trusts (resolved when checked), and the job's part below it, taken as written, so a
link the job made there is followed only to see that it leads out. A checkpoint is checked when
reported and again when an attempt is about to resume from it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Fence:
    root: str  # the service's data folder or a team's checkpoint root: trusted
    below: str  # the job's folder under it, as written: what the job may change

    @property
    def folder(self) -> str:
        return os.path.normpath(os.path.join(self.root, self.below))

    def holds(self, path: str) -> bool:
        """Whether ``path`` is the job's folder or below it, as the filesystem resolves it now."""
        if not os.path.isabs(path):
            return False
        try:
            folder = os.path.normpath(os.path.join(os.path.realpath(self.root), self.below))
            return within(folder, os.path.realpath(path))
        except ValueError:  # a lone surrogate or NUL: no file can have that name
            return False


def within(folder: str, path: str) -> bool:
    """Whether ``path`` is ``folder`` or below it, as written (no filesystem access)."""
    folder, path = os.path.normpath(folder), os.path.normpath(path)
    return os.path.commonpath([folder, path]) == folder


def resolve_dir(data_dir: Path, configured: str | None, working_dir: str | None) -> str | None:
    """A ``checkpoint.dir`` as an absolute path (a relative one is read from the working_dir,
    where the training process starts), or None when the spec names none."""
    if not configured:
        return None
    return os.path.normpath(os.path.join(working_dir or data_dir, configured))


def configured_dir(data_dir: Path, spec: dict[str, Any]) -> str | None:
    """``resolve_dir`` for a stored spec."""
    checkpoint = spec.get("checkpoint") or {}
    return resolve_dir(data_dir, checkpoint.get("dir"), spec.get("working_dir"))


def checkpoint_dir(data_dir: Path, job_id: str, spec: dict[str, Any]) -> str:
    """The folder the job's attempts save into."""
    return configured_dir(data_dir, spec) or str(data_dir / "jobs" / job_id / "checkpoints")


def root_holding(folder: str, roots: Sequence[str]) -> str | None:
    """The first of ``roots`` that ``folder`` lies in, as written."""
    return next((root for root in roots if within(root, folder)), None)


def job_fence(
    data_dir: Path, job_id: str, spec: dict[str, Any], roots: Sequence[str]
) -> Fence | None:
    """The fence for the job's checkpoints; None when its ``checkpoint.dir`` lies in none of
    its team's roots (anymore), so that no checkpoint of it is accepted."""
    configured = configured_dir(data_dir, spec)
    if configured is None:
        return Fence(str(data_dir), os.path.join("jobs", job_id, "checkpoints"))
    root = root_holding(configured, roots)
    return Fence(root, os.path.relpath(configured, root)) if root is not None else None


def outside_roots(folder: str, team: str, roots: Sequence[str]) -> str:
    """Why a ``checkpoint.dir`` is refused, with what would be accepted."""
    allowed = f"its roots are {', '.join(roots)}" if roots else "it has none"
    return (
        f"{folder} is not inside a checkpoint root of team {team} ({allowed}; an admin sets them"
        f" with `zeropilot teams set {team} --checkpoint-root PATH`); leave checkpoint.dir out"
        " to keep checkpoints in the job's own folder"
    )


def roots_conflict(
    roots: Sequence[str], data_dir: Path, others: dict[str, Sequence[str]]
) -> str | None:
    """Why a team may not have these roots: one holding (or inside) the service's data folder
    or another team's root would let its jobs name those files as their checkpoints."""
    data = os.path.realpath(data_dir)
    for root in roots:
        real = os.path.realpath(root)
        if _overlap(real, data):
            return f"{root} overlaps the service's data folder {data_dir}, which holds every job"
        for team, theirs in others.items():
            if clash := next((o for o in theirs if _overlap(real, os.path.realpath(o))), None):
                return f"{root} overlaps {clash}, a checkpoint root of team {team}"
    return None


def _overlap(one: str, other: str) -> bool:
    return within(one, other) or within(other, one)
