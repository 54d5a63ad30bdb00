"""A team quota through real processes and the CLI: the second job waits, then the worker's
periodic admission pass lets it start once the first has finished."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from sqlmodel import Session

from service.db.session import get_engine
from service.db.users import create_user
from tests.e2e.stack import Api, Stack
from tests.e2e.test_cli import zeropilot
from tests.integration.helpers import tiny_spec

pytestmark = pytest.mark.slow


def test_a_job_over_the_quota_starts_when_the_first_finishes(
    stack: Stack, api: Api, token: str, postgres_url: str, tmp_path: Path
) -> None:
    with Session(get_engine(postgres_url)) as session:
        admin = create_user(session, "root", "ops", is_admin=True)
        session.commit()
    quota = zeropilot(stack, admin, "teams", "set", "vision", "--gpu-quota", "2")
    assert quota.returncode == 0, quota.stderr
    assert (
        "team vision: quota 2 GPUs, borrow limit none, share 1, checkpoint roots none; holds 0"
        " GPUs (borrowed 0, lent 0), 0 job(s) waiting" in quota.stdout
    )
    stack.start_worker("w1")

    first = api.submit(tiny_spec("first", steps=10))  # 1 node x 2 ranks: the whole quota
    second_spec = tmp_path / "second.yaml"
    second_spec.write_text(yaml.safe_dump(tiny_spec("second", steps=10)))
    teams = json.loads(zeropilot(stack, token, "teams", "list", "--json").stdout)
    assert teams == [
        {
            "name": "vision",
            "gpu_quota": 2,
            "gpu_share": 1,
            "gpus_held": 2,
            "gpu_borrow_limit": None,
            "gpus_borrowed": 0,
            "gpus_lent": 0,
            "jobs_waiting": 0,
            "checkpoint_roots": [],
        }
    ]

    held_back = api.submit(tiny_spec("held-back", steps=10))
    shown = zeropilot(stack, token, "status", held_back["id"]).stdout
    assert "PENDING" in shown and "waiting: team vision holds 2 of its 2-GPU quota" in shown
    api.http.post(f"/v1/jobs/{held_back['id']}/cancel")

    waited = zeropilot(stack, token, "submit", str(second_spec), "--wait")

    assert waited.returncode == 0, waited.stdout + waited.stderr + stack.logs()
    out = waited.stdout
    assert "... waiting: team vision holds 2 of its 2-GPU quota; this job needs 2" in out
    assert out.index("waiting: team vision") < out.index("admitted") < out.index("SUCCEEDED")
    first = api.job(first["id"])
    second = api.job(json.loads(zeropilot(stack, token, "list", "--json").stdout)["data"][0]["id"])
    assert (first["status"], second["status"]) == ("SUCCEEDED", "SUCCEEDED")
    admitted = next(
        e for e in second["events"] if e["subject"] == "job" and e["to_status"] == "QUEUED"
    )
    assert at(admitted["created_at"]) >= at(first["finished_at"])  # not before GPUs were free


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
