"""The console's timeline in a real browser: per cluster, a bar for each job holding GPUs until
its predicted end and for each waiting job from its predicted start to its end, a "now" line,
and words where a start or an end is not known. Jobs are submitted through the API (no worker:
they hold or wait, nothing trains); one is moved to RUNNING through the state machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect
from sqlmodel import Session

from service.core.states import AttemptStatus, JobStatus
from service.db.jobs import current_attempt
from service.db.models import Job
from service.db.session import get_engine
from service.db.transitions import move_attempt, move_job
from tests.e2e.stack import Stack
from tests.integration.helpers import auth, three_users, tiny_spec


def submitted(http: httpx.Client, token: str, name: str, steps: int | None) -> dict[str, Any]:
    spec = tiny_spec(name)
    if steps is not None:
        spec["training"]["steps"] = steps
    response = http.post("/v1/jobs", json=spec, headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def started(database_url: str, job_id: str) -> None:
    """The job's attempt launched and runs (what the worker would do)."""
    with Session(get_engine(database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        attempt = current_attempt(session, job)
        assert attempt is not None
        for old, new in ((AttemptStatus.QUEUED, AttemptStatus.LAUNCHING),
                         (AttemptStatus.LAUNCHING, AttemptStatus.RUNNING)):  # fmt: skip
            assert move_attempt(session, attempt, old, new, f"to {new}")
        assert move_job(session, job, JobStatus.QUEUED, JobStatus.LAUNCHING, "launching")
        assert move_job(session, job, JobStatus.LAUNCHING, JobStatus.RUNNING, "running")
        session.commit()


def lanes(page: Page, cluster: str) -> list[dict[str, Any]]:
    """Each lane as drawn: its job, label, bar edges (x) and the words beside the bar."""
    return list(
        page.eval_on_selector_all(
            f".timeline[data-cluster={cluster}] g.lane",
            """gs => gs.map(g => {
                const bar = g.querySelector('rect.bar');
                return {job: g.dataset.job, label: g.querySelector('text.label').textContent,
                        start: g.dataset.start, end: g.dataset.end,
                        x0: bar ? +bar.getAttribute('x') : null,
                        x1: bar ? +bar.getAttribute('x') + +bar.getAttribute('width') : null,
                        open: bar ? bar.classList.contains('open') : null,
                        words: (g.querySelector('text.bar-label, text.why') || {}).textContent};
            })""",
        )
    )


def test_the_timeline_draws_holders_until_their_end_and_waiting_jobs_after_them(
    page: Page, stack: Stack, postgres_url: str, artifacts: Path
) -> None:
    tokens = three_users(postgres_url)
    http = httpx.Client(base_url=stack.url, timeout=30)
    quota, admin = {"gpu_quota": 2}, auth(tokens["root"])  # one 2-GPU job per team at a time
    for team in ("vision", "speech"):
        patched = http.patch(f"/v1/teams/{team}", json=quota, headers=admin)
        assert patched.status_code == 200, patched.text
    # Lengths in steps of the tiny plan's predicted ~17 ms: tens of minutes each.
    v_running = submitted(http, tokens["alice"], "v-running", 150_000)
    started(postgres_url, v_running["id"])
    v_next = submitted(http, tokens["alice"], "v-next", 60_000)
    v_endless = submitted(http, tokens["alice"], "v-endless", None)
    v_behind = submitted(http, tokens["alice"], "v-behind", 30_000)
    s_running = submitted(http, tokens["bob"], "s-running", 90_000)
    s_next = submitted(http, tokens["bob"], "s-next", 40_000)
    # A quota change runs the admission pass: every waiting job gets its prediction.
    http.patch("/v1/teams/vision", json=quota, headers=admin)

    page.goto(f"{stack.url}/console")
    page.fill("#token", tokens["root"])
    page.click("#sign-in button[type=submit]")
    page.click("a[data-nav=teams]")
    expect(page.locator(".timeline[data-cluster=local] h3")).to_contain_text(
        "cluster local · 2 holding GPUs, 4 waiting"
    )
    drawn = {lane["job"]: lane for lane in lanes(page, "local")}
    order = [lane["job"] for lane in lanes(page, "local")]
    # Holders first, the sooner end on top; then the waiting jobs in admission order.
    assert order[:2] == [s_running["id"], v_running["id"]]
    assert set(order[2:]) == {v_next["id"], v_endless["id"], v_behind["id"], s_next["id"]}
    assert order.index(v_next["id"]) < order.index(v_endless["id"]) < order.index(v_behind["id"])
    assert drawn[v_running["id"]]["label"] == "v-running · vision · 2 GPUs"

    now = float(page.get_attribute(".timeline[data-cluster=local] line.now", "data-at") or 0)
    for holder in (v_running, s_running):  # from its start (or now) to its predicted end
        lane = drawn[holder["id"]]
        assert lane["x0"] < lane["x1"] and lane["words"].startswith("ends ")
        assert float(lane["end"]) > now
    # Each team's next job starts where its holder ends; the open-ended one after it
    for holder, waiting in ((v_running, v_next), (s_running, s_next)):
        assert abs(drawn[waiting["id"]]["x0"] - drawn[holder["id"]]["x1"]) < 1.0
    assert abs(drawn[v_endless["id"]]["x0"] - drawn[v_next["id"]]["x1"]) < 1.0
    assert drawn[v_endless["id"]]["open"] is True
    assert drawn[v_endless["id"]]["words"] == (
        "end not known: its length is not known (no training.steps, no time limit)"
    )
    behind = drawn[v_behind["id"]]
    assert behind["x0"] is None  # no bar: nothing to draw it from
    assert behind["words"] == "start not known: it waits for a job of unknown length"
    scale = page.eval_on_selector(
        ".timeline[data-cluster=local] svg",
        "svg => Object.fromEntries(Object.entries(svg.dataset).map(([k, v]) => [k, +v]))",
    )
    x_now = scale["left"] + scale["width"] * (now - scale["t0"]) / (scale["t1"] - scale["t0"])
    drawn_now = float(page.get_attribute(".timeline[data-cluster=local] line.now", "x1") or 0)
    assert drawn_now == pytest.approx(x_now, abs=0.01)
    assert drawn[v_running["id"]]["x0"] <= x_now <= drawn[v_running["id"]]["x1"]  # it runs now
    page.locator(".timeline").first.scroll_into_view_if_needed()
    page.locator("main").screenshot(path=artifacts / "timeline.png")  # docs/images keeps a copy
