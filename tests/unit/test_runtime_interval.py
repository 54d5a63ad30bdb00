"""The runtime saves at the interval zeropilot gives: the launch's first, then the one each
metrics report's answer carries (checkpoint.interval_steps: auto recomputes it as saves and
interruptions are measured). The API is a scripted server on loopback."""

from __future__ import annotations

import pytest

from tests.unit.scripted_api import ScriptedApi, serve
from zeropilot.runtime import Reporter


def due_steps(reporter: Reporter, steps: range, default: int = 100) -> list[int]:
    due = []
    for step in steps:
        if reporter.checkpoint_due(step, default):
            reporter.checkpoint(step, f"/ckpt/global_step{step}")
            due.append(step)
    return due


def test_it_picks_up_a_new_interval_while_running(
    scripted: list[ScriptedApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    interval = (200, {}, {"checkpoint_interval_steps": 3})
    longer = (200, {}, {"checkpoint_interval_steps": 5})
    saved = (204, {}, {})
    api = serve(scripted, interval, saved, longer)
    monkeypatch.setenv("ZEROPILOT_URL", api.url)
    monkeypatch.setenv("ZEROPILOT_ATTEMPT_ID", "a1")
    monkeypatch.setenv("ZEROPILOT_ATTEMPT_TOKEN", "t")
    monkeypatch.setenv("ZEROPILOT_CHECKPOINT_INTERVAL", "10")  # what the launch chose
    reporter = Reporter.from_env()
    assert reporter.checkpoint_interval == 10

    reporter.metrics(1, loss=1.0)
    reporter.flush()  # the answer: every 3 steps
    assert due_steps(reporter, range(1, 4)) == [3]  # counted from this attempt's first step
    reporter.metrics(4, loss=1.0)
    reporter.flush()  # the answer: every 5 steps
    assert reporter.checkpoint_interval == 5
    assert due_steps(reporter, range(4, 14)) == [8, 13]


def test_outside_zeropilot_it_saves_at_its_own_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROPILOT_CHECKPOINT_INTERVAL", raising=False)
    reporter = Reporter.from_env()
    assert reporter.checkpoint_interval is None
    assert due_steps(reporter, range(1, 41), default=20) == [20, 40]
