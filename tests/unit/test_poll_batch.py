"""What a batched poll reads from one answer for many jobs, and which answers the reconcile
pass can leave unwritten. Pure: the texts are in the forms the real commands print (the real
cluster's are checked in tests/integration/test_slurm_poll_many.py)."""

from __future__ import annotations

import pytest

from service.core.states import AttemptStatus, JobStatus
from workers.backends.base import BackendState, BackendStatus
from workers.backends.slurm_commands import parse_exit_code, parse_sacct_jobs, parse_squeue
from workers.watched import Watched, unchanged

SQUEUE = (
    "41                      |PENDING                 |0               |JobHeldUser\n"
    "42                      |RUNNING                 |0               |None\n"
    "43                      |FAILED                  |768             |NonZeroExitCode\n"
    "44                      |CANCELLED               |15              |None\n"
)


def test_squeue_lines_read_as_scontrol_fields_with_the_wait_status_decoded() -> None:
    jobs = parse_squeue(SQUEUE)

    assert sorted(jobs) == ["41", "42", "43", "44"]
    assert jobs["41"] == {"JobId": "41", "JobState": "PENDING", "ExitCode": "0:0",
                          "Reason": "JobHeldUser"}  # fmt: skip
    assert parse_exit_code(jobs["43"]["ExitCode"]) == 3  # 768 = 3 << 8
    assert parse_exit_code(jobs["44"]["ExitCode"]) == 128 + 15  # killed by SIGTERM


def test_one_sacct_answer_for_several_jobs_is_read_job_by_job() -> None:
    text = (
        "50|FAILED|1:0|None\n50.batch|FAILED|1:0|\n50.0|OUT_OF_MEMORY|0:125|\n"
        "51|COMPLETED|0:0|None\n51.batch|COMPLETED|0:0|\n"
    )

    jobs = parse_sacct_jobs(text)

    assert jobs["50"]["JobState"] == "OUT_OF_MEMORY"  # a step's OOM is the job's
    assert jobs["51"] == {"JobState": "COMPLETED", "ExitCode": "0:0", "Reason": "None"}


def watched(attempt: str, job: str, native: str = "", message: str = "",
            stopping_for: str | None = None) -> Watched:  # fmt: skip
    return Watched("a1", "ref", "c", attempt, native, message, job, stopping_for)


@pytest.mark.parametrize(
    ("row", "status", "expected"),
    [
        (watched(AttemptStatus.RUNNING, JobStatus.RUNNING),
         BackendStatus(BackendState.RUNNING), True),
        (watched(AttemptStatus.LAUNCHING, JobStatus.LAUNCHING),
         BackendStatus(BackendState.RUNNING), False),  # it starts running: write that
        (watched(AttemptStatus.LAUNCHING, JobStatus.LAUNCHING, "Pending", "Resources"),
         BackendStatus(BackendState.PENDING, native_state="Pending", reason="Resources"), True),
        (watched(AttemptStatus.LAUNCHING, JobStatus.LAUNCHING, "Pending", "Resources"),
         BackendStatus(BackendState.PENDING, native_state="Pending", reason="Priority"), False),
        (watched(AttemptStatus.RUNNING, JobStatus.RUNNING),
         BackendStatus(BackendState.SUCCEEDED, 0), False),
        (watched(AttemptStatus.RUNNING, JobStatus.CANCELLED),
         BackendStatus(BackendState.RUNNING), False),  # the stop is sent again
        (watched(AttemptStatus.RUNNING, JobStatus.RUNNING, stopping_for="j2"),
         BackendStatus(BackendState.RUNNING), False),  # preempted: the stop goes on
    ],
)  # fmt: skip
def test_only_answers_that_change_nothing_are_left_unwritten(
    row: Watched, status: BackendStatus, expected: bool
) -> None:
    assert unchanged(row, status) is expected
