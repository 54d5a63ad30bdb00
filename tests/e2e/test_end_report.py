"""The local supervisor reports its attempt's end as the ranks exit: with the workers' periodic
pass an hour away, the job still ends SUCCEEDED, so the report (not a poll) recorded it.

Real processes: the API (uvicorn), a Celery worker with beat, the local supervisor, DeepSpeed's
launcher and two gloo ranks of ``examples/train_tiny.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.stack import Api, Stack
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def test_the_end_is_recorded_from_the_supervisors_report_not_the_next_pass(
    stack: Stack, api: Api
) -> None:
    stack.start_worker("w1", reconcile_interval_s="3600")  # no pass while the job runs
    job = api.submit(tiny_spec("reported", steps=5))

    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack)

    assert done["status"] == "SUCCEEDED", done["message"] + stack.logs()
    (attempt,) = done["attempts"]
    assert attempt["runtime_evidence"]["ended_reported"] is True
    result = json.loads((stack.data_dir / "attempts" / attempt["backend_name"] / "result.json")
                        .read_text())  # fmt: skip
    assert result["exit_codes"] == {"0": 0}
    assert attempt["finished_at"] is not None
