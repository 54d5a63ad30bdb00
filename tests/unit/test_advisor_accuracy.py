"""The advisor's accuracy on real runs, checked in CI so that a change to the model that makes
it worse fails here (the same numbers as ``python bench/advisor_check.py``)."""

from __future__ import annotations

from dataclasses import replace

from bench.accuracy import failures, summaries, unsafe_budgets
from bench.gpu_runs import load_gpu_runs


def test_the_advisor_meets_its_accuracy_targets_on_the_h200_and_cpu_runs() -> None:
    results = summaries()

    assert failures(results) == []
    h200, cpu = results["h200"], results["cpu"]
    assert h200.runs == 44 and h200.within >= 42 and h200.unsafe == 0
    assert cpu.runs == 155 and cpu.within >= 152 and cpu.unsafe == 0


def test_no_real_run_is_called_fit_where_it_needs_more() -> None:
    unsafe = {run.label: unsafe_budgets(run) for run in load_gpu_runs()}

    assert {label: b for label, b in unsafe.items() if b} == {}


def test_a_grid_below_its_target_is_named() -> None:
    results = summaries()
    worse = replace(results["h200"], within=41, unsafe=1)

    missed = failures({**results, "h200": worse})

    assert missed == ["H200 (44 runs): 41/44 within ±10% (target 95%), 1 unsafe (target 0)"]
