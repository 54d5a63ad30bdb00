"""The console's calibration page in a real browser: for each observed run of the cluster, a
point at (measured, predicted with the calibrated constants) on the step-time and memory
scatters, its prediction as planned then beside it, the run newer than the fit told apart, and
the fit's summary in words. The runs go through the API and the state machine (no DeepSpeed);
the learning task records and fits them, as the workers' beat would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from service.settings import AuthSettings, BrokerSettings, DatabaseSettings, Settings
from tests.e2e.stack import Stack
from tests.integration.helpers import auth, three_users
from tests.integration.observed_runs import SHAPES, finished, submitted
from workers.learning import learn


def drawn(page: Page, chart: str, kind: str) -> dict[str, dict[str, float]]:
    """Each point of one kind as the browser has it, by attempt: its values and position."""
    points = page.eval_on_selector_all(
        f"{chart} circle.{kind}",
        """els => els.map(e => ({id: e.dataset.attempt, x: +e.dataset.measured,
             y: +e.dataset.predicted, cx: +e.getAttribute('cx'), cy: +e.getAttribute('cy'),
             fresh: e.classList.contains('new')}))""",
    )
    return {p["id"]: p for p in points}


def on_scale(page: Page, chart: str, point: dict[str, float]) -> None:
    """The point sits where its values map on the drawn axes (one scale for both)."""
    s = page.eval_on_selector(
        chart, "svg => Object.fromEntries(Object.entries(svg.dataset).map(([k, v]) => [k, +v]))"
    )
    x = s["left"] + s["width"] * (point["x"] - s["lo"]) / (s["hi"] - s["lo"])
    y = s["top"] + s["height"] * (1 - (point["y"] - s["lo"]) / (s["hi"] - s["lo"]))
    assert point["cx"] == pytest.approx(x, abs=0.01) and point["cy"] == pytest.approx(y, abs=0.01)


def test_the_scatter_draws_each_run_measured_against_predicted(
    page: Page, stack: Stack, postgres_url: str, redis_url: str, tmp_path: Path, artifacts: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path / "learner", db=DatabaseSettings(url=postgres_url),
        broker=BrokerSettings(url=redis_url), auth=AuthSettings(secret_key="e2e-secret"),
    )  # fmt: skip
    tokens = three_users(postgres_url)
    http = httpx.Client(base_url=stack.url, timeout=30)
    *jobs, late = [submitted(http, tokens["alice"], shape) for shape in SHAPES]
    for job, shape in zip(jobs, SHAPES, strict=False):
        finished(http, settings, job, shape)
    learn(settings)  # the first fit, on five runs
    finished(http, settings, late, SHAPES[5])
    learn(settings)  # the sixth is recorded; the fit waits for five new ones
    shown: list[dict[str, Any]] = http.get(
        "/console/api/calibration", headers=auth(tokens["bob"])
    ).json()
    runs = {r["attempt_id"]: r for r in shown[0]["runs"]}

    page.goto(f"{stack.url}/console")
    page.fill("#token", tokens["bob"])
    page.click("#sign-in button[type=submit]")
    page.click("a[data-nav=calibration]")
    card = ".calibration[data-cluster=local]"
    expect(page.locator(f"{card} .summary")).to_contain_text(
        "Calibrated on 5 runs, typical step-time error"
    )
    steps, peaks = "#step-scatter-local", "#peak-scatter-local"
    expect(page.locator(f"{steps} circle.point")).to_have_count(6)
    calibrated, planned = drawn(page, steps, "point"), drawn(page, steps, "planned")
    assert set(calibrated) == set(runs)
    for attempt_id, run in runs.items():
        point = calibrated[attempt_id]
        assert (point["x"], point["y"]) == (run["measured_step_s"], run["predicted_step_s"])
        assert planned[attempt_id]["y"] == run["planned_step_s"]
        on_scale(page, steps, point)
        # Planned 2.3-2.7x too fast; calibrated, on the diagonal within the fit's spread
        assert planned[attempt_id]["cy"] > point["cy"]  # drawn lower: predicted faster
        assert abs(point["y"] / point["x"] - 1) < 0.15
        assert point["fresh"] == (not run["learnt"])
    late_attempt = late["attempts"][0]["id"]
    assert [a for a, p in calibrated.items() if p["fresh"]] == [late_attempt]
    memory = drawn(page, peaks, "point")
    for attempt_id, run in runs.items():
        assert memory[attempt_id]["x"] == run["measured_peak_bytes"]
        assert memory[attempt_id]["y"] == run["predicted_peak_bytes"]
        on_scale(page, peaks, memory[attempt_id])

    page.click(f"{card} details summary")
    row = page.locator(f"{card} tr[data-attempt='{late_attempt}']")
    expect(row).to_contain_text("newer than the fit")
    expect(row).to_contain_text(f"{runs[late_attempt]['measured_step_s'] * 1000:.1f} ms")
    page.click(f"{card} details summary")  # closed again for the picture
    page.locator("main").screenshot(path=artifacts / "calibration.png")  # synthetic runs
