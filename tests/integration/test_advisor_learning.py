"""The advisor learning from finished attempts, through the API, the database and the learning
task: an attempt's reported steps become an observation, five observations refit the cluster,
and the next submit's reason quotes the calibration; an admin freezes and resets it.

The attempts run through the API and the state machine, not DeepSpeed: what is learnt from is
what the ranks report (bench/advisor_learn_cpu.py runs the real ranks)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.core.states import AttemptStatus
from service.db import calibrations
from service.db.models import Attempt, AttemptObservation
from service.db.session import get_engine
from service.db.transitions import move_attempt
from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from workers.learning import learn

# Each step's tokens/s as train_tiny reports it: 8 sequences of 32 tokens over the step's time
STEP_SECONDS = [0.9, 0.3, 0.1, 0.051, 0.05, 0.049, 0.05, 0.052, 0.05, 0.048, 0.05, 0.05]
TOKENS = 8 * 32


@pytest.fixture(autouse=True)
def fresh_copies() -> None:
    calibrations.forget()  # another test's cluster of the same name must not be remembered


def submitted(client: TestClient, token: str, name: str = "tiny-gpt") -> Any:
    answer = client.post("/v1/jobs", json=tiny_spec(name), headers=auth(token))
    assert answer.status_code == 201, answer.text
    return answer.json()


def run_to_success(
    client: TestClient, settings: Settings, attempt_id: str, slower: float = 1.0
) -> None:
    """The attempt runs, its rank 0 reports every step (``slower`` times ``STEP_SECONDS``),
    and it exits 0."""
    move(settings, attempt_id, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING)
    move(settings, attempt_id, AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)
    report_steps(client, settings, attempt_id, slower)
    move(settings, attempt_id, AttemptStatus.RUNNING, AttemptStatus.SUCCEEDED)


def move(settings: Settings, attempt_id: str, old: AttemptStatus, new: AttemptStatus) -> None:
    with Session(get_engine(settings.database_url)) as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        exited = {"exit_code": 0} if new == AttemptStatus.SUCCEEDED else {}
        assert move_attempt(session, attempt, old, new, f"to {new}", **exited)
        session.commit()


def report_steps(
    client: TestClient, settings: Settings, attempt_id: str, slower: float = 1.0
) -> None:
    points = [
        {"step": n, "loss": 1.0, "tokens_per_s": TOKENS / (s * slower),
         "memory_peak_bytes": 700_000_000}
        for n, s in enumerate(STEP_SECONDS, start=1)
    ]  # fmt: skip
    token = attempt_token(settings.secret_key(), attempt_id)
    url = f"/v1/runtime/attempts/{attempt_id}/metrics/batch"
    assert (
        client.post(url, json=points, headers=auth(token)).status_code == 200
    )  # with the interval


def test_finished_attempts_calibrate_the_cluster_and_the_next_plan_says_so(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    first = submitted(client, tokens["alice"])
    assert "not calibrated here yet" in first["advice_reason"]
    run_to_success(client, settings, first["attempts"][0]["id"])

    learn(settings)

    with Session(get_engine(settings.database_url)) as session:
        observed = session.get(AttemptObservation, first["attempts"][0]["id"])
        assert observed is not None
        session.expunge(observed)
    assert observed.skipped == ""
    assert observed.step_seconds == pytest.approx(0.05)  # the median after 3 warm-up steps
    assert (observed.steady_steps, observed.neighbours) == (9, 0)
    assert (observed.peak_bytes, observed.peak_kind) == (700_000_000, "resident")
    assert observed.predicted_step_seconds == first["plan"]["step_seconds"]
    calibrated = "/v1/clusters/local/calibration"
    shown = client.get(calibrated, headers=auth(tokens["alice"])).json()
    assert shown["observations"] == 0  # one run: below the 5 a refit waits for

    for number, slower in enumerate([1.02, 0.98, 1.01, 0.99]):  # four more runs like it
        job = submitted(client, tokens["alice"], f"tiny-gpt-{number}")
        run_to_success(client, settings, job["attempts"][0]["id"], slower)
    learn(settings)

    shown = client.get(calibrated, headers=auth(tokens["alice"])).json()
    assert shown["observations"] == 5
    assert shown["typical_error"] < 0.05  # five runs of one plan within 2% of each other
    scraped = client.get("/metrics").text
    assert 'zeropilot_advisor_calibration_runs{cluster="local"} 5.0' in scraped
    # the five plans were made with today's constants: 0.017 s against 0.05 s measured
    error = _gauge(scraped, "zeropilot_advisor_step_time_prediction_error")
    assert error == pytest.approx(1 - first["plan"]["step_seconds"] / 0.05, abs=0.02)
    advice = client.post("/v1/advice", json=tiny_spec(), headers=auth(tokens["bob"])).json()
    assert "calibrated on 5 runs of this cluster" in advice["reason"]  # advice reads it too
    later = submitted(client, tokens["alice"], "tiny-gpt-later")
    assert "calibrated on 5 runs of this cluster" in later["advice_reason"]
    # Today's constants said 3x too fast; calibrated, the plan's step follows the measured
    # 0.05 s within the runs' own 2% spread and what the prior still pulls back
    assert first["plan"]["step_seconds"] < 0.5 * 0.05
    assert later["plan"]["step_seconds"] == pytest.approx(0.05, rel=0.1)

    root = auth(tokens["root"])
    freezing = {"frozen": True}
    assert client.patch(calibrated, json=freezing, headers=auth(tokens["alice"])).status_code == 403
    assert client.patch(calibrated, json=freezing, headers=root).json()["frozen"] is True
    reset = client.delete(calibrated, headers=root).json()
    assert (reset["observations"], reset["multipliers"], reset["frozen"]) == (0, {}, True)
    after_reset = submitted(client, tokens["alice"], "tiny-gpt-after-reset")
    assert "not calibrated here yet" in after_reset["advice_reason"]

    odd = {**shown, "multipliers": {"mfu_maximum": 0.5}}
    assert client.put(calibrated, json=odd, headers=root).status_code == 422
    imported = client.put(calibrated, json=shown, headers=root).json()  # an export, as it was
    assert (imported["imported_from"], imported["observations"]) == ("local", 5)
    assert imported["multipliers"] == shown["multipliers"]
    started = submitted(client, tokens["alice"], "tiny-gpt-imported")
    assert "calibrated on 5 runs of cluster local (imported)" in started["advice_reason"]
    assert started["plan"]["step_seconds"] == later["plan"]["step_seconds"]


def _gauge(scraped: str, name: str) -> float:
    line = next(x for x in scraped.splitlines() if x.startswith(f'{name}{{cluster="local"}}'))
    return float(line.rsplit(" ", 1)[1])


def test_attempts_that_ran_side_by_side_on_the_local_host_count_each_other(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    ids = [submitted(client, tokens["alice"], f"side-{n}")["attempts"][0]["id"] for n in (1, 2)]
    for attempt_id in ids:  # both start before either ends
        move(settings, attempt_id, AttemptStatus.QUEUED, AttemptStatus.LAUNCHING)
        move(settings, attempt_id, AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)
    for attempt_id in ids:
        report_steps(client, settings, attempt_id)
        move(settings, attempt_id, AttemptStatus.RUNNING, AttemptStatus.SUCCEEDED)
    alone = submitted(client, tokens["alice"], "alone")["attempts"][0]["id"]
    run_to_success(client, settings, alone)

    learn(settings)

    with Session(get_engine(settings.database_url)) as session:
        shared = [session.get(AttemptObservation, i) for i in [*ids, alone]]
    assert [o.neighbours if o else None for o in shared] == [1, 1, 0]
