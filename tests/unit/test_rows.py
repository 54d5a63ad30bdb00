"""Rows built without the ORM hold what the model itself would: its defaults, nothing else."""

from __future__ import annotations

import pytest

from service.core.states import AttemptStatus
from service.db.models import Attempt, JobEvent
from service.db.rows import new_row


def test_a_new_row_holds_the_models_defaults_and_the_given_values() -> None:
    values = {"id": "a1", "job_id": "j1", "number": 1, "plan": {"zero_stage": 2}}
    values |= {"backend": "local", "backend_name": "zp-x-j1-a1"}
    row = new_row(Attempt, **values)
    model = Attempt(**values)
    fresh = {"created_at", "updated_at"}  # default factories: the time each was made
    assert {k: v for k, v in row.items() if k not in fresh} == {
        k: v for k, v in model.model_dump().items() if k not in fresh
    }
    assert row["status"] == AttemptStatus.QUEUED and row["failure_evidence"] == {}
    assert row["failure_evidence"] is not new_row(Attempt, **values)["failure_evidence"]


def test_a_new_row_refuses_unknown_and_missing_fields() -> None:
    with pytest.raises(TypeError, match="no fields"):
        new_row(JobEvent, job_id="j1", subject="job", to_status="PENDING", colour="red")
    with pytest.raises(TypeError, match=r"JobEvent\.job_id has no default"):
        new_row(JobEvent, subject="job", to_status="PENDING")
