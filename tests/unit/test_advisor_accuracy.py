"""The advisor's accuracy on real runs, checked in CI so that a change to the model that makes
it worse fails here (the same numbers as ``python bench/advisor_check.py``)."""

from __future__ import annotations

from dataclasses import replace

from bench.accuracy import failures, summaries, unsafe_budgets
from bench.gpu_runs import load_gpu_runs
from bench.timing import regrets, time_failures, time_summary


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


def test_the_choice_and_the_step_time_meet_their_targets_on_the_h200_runs() -> None:
    summary = time_summary()

    assert time_failures(summary) == []
    # three groups compared fairly (at most one neighbour): 134M at 1024 alone, 1.1B at
    # 2048 x 4 and 4096 x 2; in each, at every budget, the choice is the fastest run that fits
    assert summary.fair_groups == 3 and summary.fair_worst_regret <= 1.05
    assert abs(summary.alone_worst) <= 0.20 and summary.unsafe == 0


def test_the_1b1_choice_at_40_gib_is_the_measured_fastest() -> None:
    rows = [r for r in regrets(load_gpu_runs()) if r.fair and r.budget_gib == 40]
    by_group = {r.group: r for r in rows if r.group[0] == "llama-1.1b"}

    for group in (("llama-1.1b", 2048, 4), ("llama-1.1b", 4096, 2)):
        assert by_group[group].chosen.startswith("llama-1.1b Z2 mb=")  # no checkpointing
        assert by_group[group].regret == 1.0
