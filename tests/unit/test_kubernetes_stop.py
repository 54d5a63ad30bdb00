"""The graceful stop's reading of a Job and its pods (workers.backends.kubernetes_stop)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from workers.backends.base import BackendState, BackendStatus
from workers.backends.kubernetes_stop import (
    Stop,
    needs_stopping,
    stop_annotation,
    stop_is_overdue,
    stop_requested,
    stopped_status,
    stopping_status,
)

NOW = datetime(2026, 12, 2, 14, 0, 0, tzinfo=UTC)


def job(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "zp-a1", "annotations": annotations}, "spec": {}}


def pod(phase: str, deletion_grace: int | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "zp-a1-0-x"}
    if deletion_grace is not None:
        metadata |= {"deletionTimestamp": "2026-12-02T14:00:05Z",
                     "deletionGracePeriodSeconds": deletion_grace}  # fmt: skip
    return {"metadata": metadata, "status": {"phase": phase}}


def test_the_annotation_reads_back_as_the_stop_with_its_grace_rounded_up() -> None:
    stop = stop_requested(job(stop_annotation(4.2, NOW)))

    assert stop == Stop(NOW, 5)
    assert stop_requested(job()) is None
    assert stop_requested(job({"zeropilot.dev/stop-requested-at": "soon"})) is None


def test_a_stop_is_overdue_only_well_after_its_grace() -> None:
    stop = Stop(NOW, 30)

    assert not stop_is_overdue(stop, NOW + timedelta(seconds=60))
    assert stop_is_overdue(stop, NOW + timedelta(seconds=91))


def test_a_pod_is_deleted_again_only_when_that_shortens_its_grace() -> None:
    assert needs_stopping(pod("Running"), 4)
    assert needs_stopping(pod("Running", deletion_grace=30), 4)  # the spec's default, longer
    assert not needs_stopping(pod("Running", deletion_grace=4), 4)  # this stop's, sent before
    assert not needs_stopping(pod("Failed"), 4)


def test_a_stopping_job_runs_and_a_stopped_one_is_cancelled_with_its_exit_codes() -> None:
    stop = Stop(NOW, 4)
    failed = BackendStatus(BackendState.FAILED, 75, "Error", "BackoffLimitExceeded", "", {0: 75})
    done = BackendStatus(BackendState.SUCCEEDED, 0, "Complete")

    stopping = stopping_status(stop)
    stopped = stopped_status(failed, stop)

    assert (stopping.state, stopping.native_state) == (BackendState.RUNNING, "Stopping")
    assert "the training has 4 s to save before SIGKILL" in stopping.reason
    assert (stopped.state, stopped.exit_code, stopped.node_exit_codes) == (
        BackendState.CANCELLED, 75, {0: 75},
    )  # fmt: skip
    assert stopped.reason == "stopped by zeropilot with a 4 s grace: BackoffLimitExceeded"
    assert stopped_status(done, stop) is done  # it finished before the stop reached it
