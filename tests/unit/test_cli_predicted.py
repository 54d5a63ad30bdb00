"""What `zeropilot status` and `zeropilot list` print of a job's predicted start."""

from __future__ import annotations

from datetime import UTC, datetime

from zeropilot.cli_predicted import prediction_lines, start_cell

NOW = datetime(2026, 12, 4, 15, 49, 15, tzinfo=UTC)
WAITING = {
    "status": "PENDING",
    "predicted_start_at": "2026-12-04T15:49:46Z",
    "predicted_end_at": None,
    "prediction_basis": "start: cluster local's 2-GPU cap frees enough when job r ends",
    "predicted_at": "2026-12-04T15:49:14Z",
}


def test_a_waiting_job_shows_its_predicted_start_end_basis_and_age() -> None:
    assert prediction_lines(WAITING, NOW) == [
        "predicted start: 2026-12-04 15:49:46 UTC (in 31 s), end: not known",
        "  rests on: start: cluster local's 2-GPU cap frees enough when job r ends",
        "  predicted at 2026-12-04 15:49:14 UTC (1 s ago)",
    ]
    assert start_cell(WAITING) == "2026-12-04 15:49:46 UTC"
    assert start_cell({**WAITING, "predicted_start_at": None}) == "?"  # not known


def test_a_started_job_shows_how_far_it_was_from_its_first_prediction() -> None:
    started = {"status": "RUNNING", "start_prediction_error_s": -125.4,
               "first_predicted_start_at": "2026-12-04T15:51:00+00:00"}  # fmt: skip

    assert prediction_lines(started, NOW) == [
        "started 2 min 5 s early against its first prediction, 2026-12-04 15:51:00 UTC"
    ]
    assert start_cell(started) == "-"
    assert prediction_lines({"status": "SUCCEEDED"}, NOW) == []  # admitted at submit
