"""The console's calibration scatter (/console/api/calibration) through the real application:
each observed run's step time and peak, measured, predicted by the cluster's calibrated
constants, and as planned then; runs newer than the fit marked as such."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.db import calibrations
from service.settings import Settings
from tests.integration.helpers import auth
from tests.integration.observed_runs import SHAPES, finished, submitted
from workers.learning import learn


@pytest.fixture(autouse=True)
def fresh_copies() -> None:
    calibrations.forget()  # another test's cluster of the same name must not be remembered


def test_the_scatter_sets_calibrated_predictions_beside_the_measured_runs(
    client: TestClient, settings: Settings, tokens: dict[str, str]
) -> None:
    empty = client.get("/console/api/calibration", headers=auth(tokens["bob"])).json()
    assert [(c["cluster"], c["observations"], c["runs"]) for c in empty] == [("local", 0, [])]

    # Every job planned with the advisor's own constants, each ran 2.3-2.7x slower
    *jobs, late = [submitted(client, tokens["alice"], shape) for shape in SHAPES]
    for job, shape in zip(jobs, SHAPES, strict=False):
        finished(client, settings, job, shape)
    learn(settings)  # five runs: the first fit
    finished(client, settings, late, SHAPES[5])
    learn(settings)  # recorded, not yet refitted (5 new ones are needed)

    [local] = client.get("/console/api/calibration", headers=auth(tokens["bob"])).json()
    assert (local["cluster"], local["observations"]) == ("local", 5)
    runs = {r["job_id"]: r for r in local["runs"]}
    assert local["runs"][0]["job_id"] == late["id"]  # newest first
    assert not runs[late["id"]]["learnt"] and all(runs[j["id"]]["learnt"] for j in jobs)
    for job, (_h, _s, slower, _p) in zip([*jobs, late], SHAPES, strict=True):
        run = runs[job["id"]]
        planned = job["plan"]["step_seconds"]
        assert run["planned_step_s"] == planned
        assert run["measured_step_s"] == pytest.approx(planned * slower, rel=1e-6)
        assert run["planned_step_error"] == pytest.approx(1 / slower - 1, rel=1e-6)
        # Calibrated on runs 2.3-2.7x slower than planned, the predictions follow them
        assert abs(run["step_error"]) < 0.15
        assert run["step_error"] == pytest.approx(
            run["predicted_step_s"] / run["measured_step_s"] - 1
        )
        assert run["peak_kind"] == "resident" and run["measured_peak_bytes"] > 0
        assert run["plan"].startswith("ZeRO-")
    # The shown typical error is the fit's, over the runs it learnt from
    assert local["typical_error"] < 0.15
