"""The small interface every cluster backend implements: submit, poll, logs, cancel.

A backend module exposes these functions (see ``Backend``). ``poll_many`` answers for many
attempts of one cluster at once with a constant number of cluster calls (one listing per
cluster or namespace, not one request per attempt); ``poll`` is the one-attempt case.
``submit`` is idempotent: the request carries a deterministic ``name`` and a second submit with
the same name finds the first launch instead of starting another. Errors carry intent:
``PermanentError`` ends the attempt, ``TemporaryError`` asks the caller to retry later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass, classify_failure


class PermanentError(Exception):
    """The launch cannot succeed as asked (bad image, rejected spec, missing command)."""


class TemporaryError(Exception):
    """The cluster could not be reached or was busy; retry, not before ``delay_s`` (what the
    cluster asked for, e.g. a 429's Retry-After; 0: the caller's own back-off decides)."""

    def __init__(self, message: str, delay_s: float = 0.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start one attempt; all of it already validated."""

    name: str  # deterministic, DNS-1123 safe: the backend's object/job name
    attempt_dir: Path  # rendered files (ds_config.json, hostfile) and logs live here
    nodes: int
    procs_per_node: int
    entrypoint: str  # the training script, relative to working_dir or absolute
    args: tuple[str, ...]  # literal arguments for the entrypoint, never shell-interpreted
    ds_config_path: Path
    env: dict[str, str]  # the job's env plus ZEROPILOT_* runtime variables
    working_dir: Path
    profile: ClusterProfile
    image: str | None = None
    time_limit_s: int | None = None
    python: str | None = None  # interpreter whose deepspeed launcher runs the job (local/slurm)
    stop_grace_s: float = 30.0  # SIGTERM to SIGKILL when stopped (service.core.stopping)


class BackendState(StrEnum):
    PENDING = "PENDING"  # accepted, waiting for resources
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    LOST = "LOST"  # the backend no longer knows the job, or its supervisor vanished

    @property
    def terminal(self) -> bool:
        return self in (self.SUCCEEDED, self.FAILED, self.CANCELLED, self.LOST)


@dataclass
class BackendStatus:
    state: BackendState
    exit_code: int | None = None
    native_state: str = ""  # e.g. Slurm OUT_OF_MEMORY, pod reason OOMKilled
    reason: str = ""  # human words: a pending reason, a termination message
    log_tail: str = ""
    node_exit_codes: dict[int, int] = field(default_factory=dict)

    def failure_class(self, runtime_tag: str | None = None) -> FailureClass:
        """What ended the run, from everything the backend saw and the runtime's own tag."""
        return classify_failure(
            exit_code=self.exit_code,
            native_state=self.native_state,
            reason=self.reason,
            log_tail=self.log_tail,
            runtime_tag=runtime_tag,
        )


class Backend(Protocol):
    def submit(self, request: LaunchRequest) -> str:
        """Start the attempt (or find it already started); return the backend reference."""
        ...

    def poll(self, profile: ClusterProfile, ref: str) -> BackendStatus: ...

    def poll_many(self, profile: ClusterProfile, refs: Sequence[str]) -> dict[str, BackendStatus]:
        """The status of every ref, from one pass over the cluster; a ref whose own reading
        failed is left out (the caller polls it alone, which raises the error)."""
        ...

    def logs(self, profile: ClusterProfile, ref: str, tail_lines: int = 200) -> str: ...

    def log_path(self, ref: str, request: LaunchRequest | None = None) -> str | None:
        """A log file on storage the API can read (the attempt folder), if the backend has one;
        ``request`` is the launch that returned ``ref``."""
        ...

    def dump_stacks(self, profile: ClusterProfile, ref: str) -> str:
        """Ask the attempt's training processes to print their Python stacks into their logs
        (the runtime's SIGUSR1 handler); what was done, or why not, in words."""
        ...

    def cancel(self, profile: ClusterProfile, ref: str, grace_s: float = ...) -> None:
        """Stop every process of the attempt: SIGTERM (the training saves), SIGKILL after
        ``grace_s``; a no-op when it has already ended."""
        ...


def poll_each(
    poll: Callable[[ClusterProfile, str], BackendStatus],
    profile: ClusterProfile,
    refs: Sequence[str],
) -> dict[str, BackendStatus]:
    """``poll_many`` for a backend without a cluster to ask (files on this machine)."""
    statuses = {}
    for ref in refs:
        try:
            statuses[ref] = poll(profile, ref)
        except Exception:  # noqa: S112 (left out: the caller polls it alone and sees why)
            continue
    return statuses
