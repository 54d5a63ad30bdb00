"""The console's timeline (/console/api/timeline) through the real application: a job holding
its team's GPUs until its predicted end, and the waiting jobs from their stored predicted starts
to their ends, in admission order, with why a start or end is not known."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.settings import Settings
from tests.integration.helpers import auth, three_users, tiny_spec


def at(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def submit(client: TestClient, token: str, name: str, steps: int | None) -> dict[str, Any]:
    spec = tiny_spec(name)
    if steps is not None:
        spec["training"]["steps"] = steps
    response = client.post("/v1/jobs", json=spec, headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_the_timeline_shows_the_holder_until_its_end_and_the_waiting_jobs_after_it(
    settings: Settings, client: TestClient
) -> None:
    tokens = three_users(settings.database_url)
    quota = {"gpu_quota": 2}  # vision holds one 2-GPU job at a time
    assert client.patch("/v1/teams/vision", json=quota, headers=auth(tokens["root"])).is_success
    running = submit(client, tokens["alice"], "v-running", steps=600)
    following = submit(client, tokens["alice"], "v-next", steps=100)
    endless = submit(client, tokens["alice"], "v-endless", steps=None)
    behind = submit(client, tokens["alice"], "v-behind", steps=50)
    # A quota change runs the admission pass, which predicts every waiting job.
    assert client.patch("/v1/teams/vision", json=quota, headers=auth(tokens["root"])).is_success

    shown = client.get("/console/api/timeline", headers=auth(tokens["alice"])).json()
    now = at(shown["now"])
    [local] = shown["clusters"]
    assert local["cluster"] == "local"
    [holder] = local["holding"]
    assert (holder["id"], holder["status"], holder["start_at"]) == (running["id"], "QUEUED", None)
    step_s = running["plan"]["step_seconds"]
    # Not started: its 600 steps at the plan's step time, counted from now.
    expected_end = now + timedelta(seconds=600 * step_s)
    assert abs((at(holder["end_at"]) - expected_end).total_seconds()) < 0.001
    planned = f"600 steps left at {step_s:.3g} s (planned)"
    assert holder["basis"] == f"end: {planned}; not started yet (QUEUED)"
    assert [b["name"] for b in local["waiting"]] == ["v-next", "v-endless", "v-behind"]
    nxt, open_ended, last = local["waiting"]
    assert abs((at(nxt["start_at"]) - at(holder["end_at"])).total_seconds()) < 2
    next_run = 100 * following["plan"]["step_seconds"]
    ran = (at(nxt["end_at"]) - at(nxt["start_at"])).total_seconds()
    assert ran == pytest.approx(next_run, abs=0.001)
    assert open_ended["id"] == endless["id"] and open_ended["end_at"] is None
    assert at(open_ended["start_at"]) == at(nxt["end_at"])
    unknown = "run: its length is not known (no training.steps, no time limit)"
    assert open_ended["basis"].endswith(unknown)
    assert (last["id"], last["start_at"], last["end_at"]) == (behind["id"], None, None)
    assert last["basis"] == "start not known: it waits for a job of unknown length"

    others = client.get("/console/api/timeline", headers=auth(tokens["bob"])).json()
    assert others["clusters"] == []  # bob's team holds and waits for nothing
    every = client.get("/console/api/timeline", headers=auth(tokens["root"])).json()
    [seen] = every["clusters"]  # an admin sees every team's
    assert [b["id"] for b in seen["holding"] + seen["waiting"]] == [
        running["id"], following["id"], endless["id"], behind["id"],
    ]  # fmt: skip
