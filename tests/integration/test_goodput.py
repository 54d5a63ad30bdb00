"""Goodput from a known timeline written through the real database: a failure whose steps past
its checkpoint are redone, a stop that saves, and the run that finishes; every bucket checked
to the second in the job's detail (2 GPUs, one step a second)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session, select
from typer.testing import CliRunner

from service.api.team_report import team_report
from service.core.attempt_kinds import AttemptKind
from service.core.clusters import LOCAL_PROFILE
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.models import Job, Team, utcnow
from service.db.session import get_engine
from service.db.transitions import move_job
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec
from tests.integration.timeline import TOKENS_PER_STEP, Timeline
from tests.unit.scripted_api import ScriptedApi
from zeropilot.cli import app


def write_known_timeline(settings: Settings, job_id: str) -> datetime:
    """Write the timeline, starting an hour ago; its start."""
    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        t0 = utcnow() - timedelta(hours=1)
        rows = Timeline(session, job, t0, settings.data_dir)
        first = job_store.current_attempt(session, job)
        assert first is not None
        # Attempt 1: 30 s to start; steps 1-10, a 2 s save of step 10; steps to 15; an NCCL
        # timeout ends it at 50 s. Steps 11-15 are redone.
        rows.run(first, started=0)
        rows.step(first, 1, reported=31)
        rows.step(first, 10, reported=40)
        ten = rows.save(first, 10, written=42, seconds=2)
        rows.step(first, 15, reported=47)
        rows.end(first, AttemptStatus.FAILED, at=50, failure_class="NCCL_TIMEOUT")
        # Attempt 2 waits 50 s to be placed (no GPU time), starts in 19 s, saves step 20 in
        # 3 s, is stopped during step 21, saves it in 4 s and exits at 140 s.
        second = rows.then(first, AttemptKind.DISRUPTION, ten)
        rows.run(second, started=100)
        rows.step(second, 11, reported=120)
        rows.step(second, 20, reported=129)
        rows.save(second, 20, written=132, seconds=3)
        rows.step(second, 21, reported=133)
        stop = rows.save(second, 21, written=137, seconds=4)
        rows.end(second, AttemptStatus.PREEMPTED, at=140, runtime_failure_tag="PREEMPTED")
        # Attempt 3 resumes from the stop's save: 9 s to start, steps 22-30, a 1 s final save,
        # exits 2 s later.
        third = rows.then(second, AttemptKind.STOP, stop)
        rows.run(third, started=200)
        rows.step(third, 22, reported=210)
        rows.step(third, 30, reported=218)
        rows.save(third, 30, written=219, seconds=1)
        rows.end(third, AttemptStatus.SUCCEEDED, at=221)
        for old, new in [
            ("QUEUED", "LAUNCHING"),
            ("LAUNCHING", "RUNNING"),
            ("RUNNING", "SUCCEEDED"),
        ]:
            move_job(session, job, JobStatus(old), JobStatus(new), "")
        session.commit()
    return t0


@pytest.fixture(scope="module")
def timeline_job(
    shared_client: TestClient, shared_tokens: dict[str, str], shared_settings: Settings
) -> dict[str, Any]:
    created = shared_client.post(
        "/v1/jobs", json=tiny_spec("goodput"), headers=auth(shared_tokens["alice"])
    )
    assert created.status_code == 201, created.text
    before = productive_exported(shared_client)
    t0 = write_known_timeline(shared_settings, created.json()["id"])
    shown = shared_client.get(
        f"/v1/jobs/{created.json()['id']}", headers=auth(shared_tokens["alice"])
    )
    assert shown.status_code == 200, shown.text
    job: dict[str, Any] = shown.json()
    return {**job, "t0": t0, "exported_before": before}


def productive_exported(client: TestClient) -> float:
    """/metrics' productive GPU-seconds of team vision's ended jobs on the local cluster."""
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            wanted = {"cluster": "local", "team": "vision", "cause": "productive"}
            if sample.name == "zeropilot_gpu_seconds_total" and sample.labels == wanted:
                return float(sample.value)
    return 0.0


def test_every_bucket_of_a_failure_a_redo_and_a_stop(timeline_job: dict[str, Any]) -> None:
    goodput = timeline_job["goodput"]
    by_attempt = {a["number"]: a for a in goodput["attempts"]}
    # GPU-seconds are wall seconds x 2 GPUs.
    assert by_attempt[1]["gpu_seconds"] == 2 * 50
    assert by_attempt[1]["productive_gpu_seconds"] == 2 * 10  # steps 1-10
    assert by_attempt[1]["lost_gpu_seconds"] == {
        "startup": 2 * 30, "checkpointing": 2 * 2, "redone": 2 * 5, "hang": 0,
        "stop_save": 0, "ending": 2 * 3,
    }  # fmt: skip
    assert by_attempt[2]["gpu_seconds"] == 2 * 40  # the 50 s it waited to be placed: none
    assert by_attempt[2]["productive_gpu_seconds"] == 2 * 11  # steps 11-21
    assert by_attempt[2]["lost_gpu_seconds"] == {
        "startup": 2 * 19, "checkpointing": 2 * 3, "redone": 0, "hang": 0,
        "stop_save": 2 * 7, "ending": 0,
    }  # fmt: skip
    assert by_attempt[3]["productive_gpu_seconds"] == 2 * 9  # steps 22-30
    assert by_attempt[3]["lost_gpu_seconds"]["startup"] == 2 * 9
    assert by_attempt[3]["lost_gpu_seconds"]["ending"] == 2 * 2
    assert goodput["gpu_seconds"] == 2 * 111
    assert goodput["productive_gpu_seconds"] == 2 * 30  # every one of the 30 steps, once
    assert goodput["goodput"] == pytest.approx(30 / 111)


def test_metrics_export_an_ended_jobs_gpu_seconds_by_cause(
    timeline_job: dict[str, Any], shared_client: TestClient
) -> None:
    added = productive_exported(shared_client) - timeline_job["exported_before"]
    assert added == pytest.approx(2 * 30)


def test_mfu_from_the_measured_pace_and_the_peak(timeline_job: dict[str, Any]) -> None:
    goodput = timeline_job["goodput"]
    assert goodput["tokens_per_s"] == TOKENS_PER_STEP
    # tiny_spec on the local profile (CPU ranks, 1 TFLOP/s each): 3 x forward FLOPs per token.
    hidden, layers, vocab, seq = 64, 2, 128, 32
    block = 12 * hidden * hidden + 13 * hidden  # attention and a 4x MLP, with biases and norms
    forward = 2 * layers * block + 2 * layers * seq * hidden * 1.0 + 2 * vocab * hidden
    assert goodput["mfu"] == pytest.approx(TOKENS_PER_STEP * 3 * forward / (2 * 1e12), rel=0.05)


def test_the_team_report_counts_the_window(
    timeline_job: dict[str, Any], shared_client: TestClient, shared_tokens: dict[str, str]
) -> None:
    alice = auth(shared_tokens["alice"])
    whole = shared_client.get("/v1/teams/vision/report?since=7d", headers=alice).json()
    assert whole["jobs"] == 1
    assert whole["gpu_hours"] == pytest.approx(2 * 111 / 3600)
    assert whole["productive_gpu_hours"] == pytest.approx(2 * 30 / 3600)
    assert whole["lost_gpu_hours"]["redone"] == pytest.approx(2 * 5 / 3600)
    assert whole["cost_usd"] is None and whole["unpriced_gpu_hours"] == whole["gpu_hours"]
    # From 45 s on: attempt 1's last 5 s (2 redone, 3 ending), attempts 2 and 3 whole.
    since = (timeline_job["t0"] + timedelta(seconds=45)).isoformat()
    cut = shared_client.get("/v1/teams/vision/report", params={"since": since}, headers=alice)
    assert cut.json()["gpu_hours"] == pytest.approx(2 * (5 + 40 + 21) / 3600)
    assert cut.json()["lost_gpu_hours"]["redone"] == pytest.approx(2 * 2 / 3600)


def test_the_report_prices_the_hours_and_guards_other_teams(
    timeline_job: dict[str, Any],
    shared_client: TestClient,
    shared_tokens: dict[str, str],
    shared_settings: Settings,
) -> None:
    priced = {"local": LOCAL_PROFILE.model_copy(update={"usd_per_gpu_hour": 3.6})}
    with Session(get_engine(shared_settings.database_url)) as session:
        team = session.exec(select(Team).where(Team.name == "vision")).one()
        shown = team_report(session, team, timeline_job["t0"], utcnow(), priced)
    assert shown.cost_usd == pytest.approx(3.6 * 2 * 111 / 3600)  # $0.001 a GPU-second
    assert shown.lost_cost_usd == pytest.approx(3.6 * 2 * 81 / 3600)
    bob = auth(shared_tokens["bob"])
    assert shared_client.get("/v1/teams/vision/report", headers=bob).status_code == 403
    odd = shared_client.get("/v1/teams/speech/report?since=a+week", headers=bob)
    (refused,) = odd.json()["detail"]
    assert odd.status_code == 422 and refused["loc"] == ["query", "since"]
    assert "7d, 12h, 30m" in refused["msg"]


def test_status_and_report_print_them(
    timeline_job: dict[str, Any],
    shared_client: TestClient,
    shared_tokens: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI, given the API's real answers (served as recorded), prints every number."""
    job = {k: v for k, v in timeline_job.items() if k not in ("t0", "exported_before")}
    report = shared_client.get("/v1/teams/vision/report", headers=auth(shared_tokens["alice"]))
    api = ScriptedApi([(200, {}, job), (200, {}, report.json())])
    try:
        monkeypatch.setenv("ZEROPILOT_URL", api.url)
        monkeypatch.setenv("ZEROPILOT_TOKEN", "zp_t")
        status = CliRunner().invoke(app, ["status", job["id"]], terminal_width=200)
        shown = CliRunner().invoke(app, ["report", "--team", "vision"], terminal_width=200)
    finally:
        api.server.shutdown()
    assert (
        "GPU time: 0.062 GPU-h held, 27.0% productive; lost: startup 52.3%, saves 5.4%, "
        "redone 4.5%, saving at a stop 6.3%, ending 4.5%" in status.output
    ), status.output
    assert "attempt 2: 80 GPU-s, 22 productive; lost: startup 47.5%" in status.output
    assert "MFU: " in status.output
    assert (
        "1 jobs, 0.062 GPU-hours" in shown.output and "lost to redone: 0.003 GPU-h" in shown.output
    )
