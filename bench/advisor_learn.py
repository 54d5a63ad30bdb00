"""The advisor learning from the H200 runs in order: learn from the runs before, predict the next.

Order: the line order of bench/data/h200_runs.jsonl (a copy of
../shared/data/h200-2026-11-30/runs.jsonl). The runs carry no timestamps; the file lists them
as they were made (the two runs alone on the GPU first, then the 134M model with three or four
neighbours, then the 1.1B model), and that is the order taken here. Each run becomes an
``Observation`` (median step of steps 2-4 as the file gives it, ``concurrent`` as neighbours,
``train_reserved`` as an exact reserved peak); run ``i`` is predicted by ``fit`` of runs
``0 .. i-1`` (service/core/advisor/calibration.py) and by today's constants.

- Step time: predicted / measured - 1, over every run predicted from at least one before it,
  and over the later half (each learning from at least 22 runs).
- Memory: predicted reserved (total less the CUDA context) against ``train_reserved``; an
  unsafe verdict says fits at 16 ... 139.8 GiB (less the headroom) where the real reserved peak
  plus the context does not (bench/accuracy.py's definition).
- Choice regret (bench/timing.py's definition) in each (model, sequence, micro-batch,
  concurrent) group of two or more runs, with the constants fitted on the runs made before the
  group's first run; fair where the runs had at most one neighbour.

Usage: python bench/advisor_learn.py [--rows]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import BUDGETS_GIB, GIB
from gpu_runs import H200_RUNS, GpuRun, load_gpu_runs
from timing import FAIR_CONCURRENT, Regret, regret_at

from service.core.advisor.calibration import ClusterCalibration, Observation, fit
from service.core.advisor.calibration_memory import need_of
from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.workload import usable_device_bytes

LATER_FROM = 22  # the later half: runs that learn from at least this many
NEIGHBOUR_CHECK = Path(__file__).resolve().parent / "data" / "gpu_neighbour_check-2026-12-04.txt"


def observation(index: int, run: GpuRun) -> Observation:
    return Observation(
        key=f"#{index} {' '.join(run.label.split())}",
        work=run.work,
        layout=run.layout,
        step_seconds=run.step_seconds,
        neighbours=run.concurrent,
        peak_bytes=run.reserved,
        peak_kind="reserved",
    )


@dataclass(frozen=True)
class Prediction:
    index: int
    run: GpuRun
    time_before: float  # predicted / measured - 1, today's constants
    time_after: float  # the same with the constants fitted on the runs before
    memory_before: float  # predicted reserved / measured reserved - 1
    memory_after: float
    unsafe_before: list[float]  # budgets where it says fits and the run does not
    unsafe_after: list[float]
    beyond_before: bool  # needs more than the prediction plus the headroom's error allowance
    beyond_after: bool
    calibration: ClusterCalibration


def time_error(run: GpuRun, constants: Calibration) -> float:
    return run.predict_time(constants).seconds / run.step_seconds - 1


def memory_error(run: GpuRun, constants: Calibration) -> float:
    reserved = run.predict(constants).per_gpu.total - constants.overhead.gpu_context_bytes
    return reserved / run.reserved - 1


def unsafe_budgets(run: GpuRun, constants: Calibration) -> list[float]:
    total = run.predict(constants).per_gpu.total
    needs = run.reserved + CALIBRATION.overhead.gpu_context_bytes
    offload = run.layout.offload_optimizer
    usable = [(b, usable_device_bytes(int(b * GIB), offload=offload)) for b in BUDGETS_GIB]
    return [b for b, u in usable if total <= u and needs > b * GIB]


def beyond_allowance(o: Observation, constants: Calibration) -> bool:
    need = need_of(o, constants)
    return need is not None and need.share > 0


def predictions(runs: list[GpuRun]) -> list[Prediction]:
    observations = [observation(i, r) for i, r in enumerate(runs)]
    rows = []
    for i in range(1, len(runs)):
        cal, run, o = fit(observations[:i]), runs[i], observations[i]
        rows.append(
            Prediction(
                i, run,
                time_error(run, CALIBRATION), time_error(run, cal.constants),
                memory_error(run, CALIBRATION), memory_error(run, cal.constants),
                unsafe_budgets(run, CALIBRATION), unsafe_budgets(run, cal.constants),
                beyond_allowance(o, CALIBRATION), beyond_allowance(o, cal.constants),
                cal,
            )
        )  # fmt: skip
    return rows


def summary_line(name: str, errors: list[float]) -> str:
    median = statistics.median(abs(e) for e in errors)
    return f"{name:54} {len(errors):>4} {median:>10.1%} {max(errors, key=abs):>+10.1%}"


def print_time(rows: list[Prediction]) -> None:
    print(f"{'step time, predicted / measured - 1':54} {'runs':>4} {'median':>10} {'worst':>10}")
    later = [r for r in rows if r.index >= LATER_FROM]
    for name, chosen in (("every run from the runs before", rows), ("later half", later)):
        print(summary_line(f"{name}: today's constants", [r.time_before for r in chosen]))
        print(summary_line(f"{name}: calibrated", [r.time_after for r in chosen]))


def print_memory(rows: list[Prediction]) -> None:
    print(f"\n{'memory, predicted reserved / measured - 1':54} {'under':>5} {'worst under':>12} "
          f"{'beyond headroom':>16} {'unsafe verdicts':>16}")  # fmt: skip
    for name, after in (("today's constants", False), ("calibrated", True)):
        errors = [r.memory_after if after else r.memory_before for r in rows]
        beyond = sum(r.beyond_after if after else r.beyond_before for r in rows)
        unsafe = sum(len(r.unsafe_after if after else r.unsafe_before) for r in rows)
        under = [e for e in errors if e < 0]
        worst = f"{min(under):+.1%}" if under else "-"
        print(f"{name:54} {len(under):>5} {worst:>12} {beyond:>16} {unsafe:>16}")
    shares = sorted({round(r.calibration.memory.gpu_share, 3) for r in rows})
    print(f"memory share applied over the runs: {', '.join(f'{s:+.3f}' for s in shares)}")


def group_regrets(runs: list[GpuRun], others: bool = False) -> list[tuple[Regret, Regret]]:
    """(today's, calibrated) regret per group and budget, calibrated on the runs made before
    the group's first run, or (``others``) on every run outside the group."""
    observations = [observation(i, r) for i, r in enumerate(runs)]
    groups: dict[tuple[tuple[str, int, int], int], list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        groups[(run.group, run.concurrent)].append(i)
    rows = []
    for (group, concurrent), indices in sorted(groups.items()):
        if len(indices) < 2:
            continue
        members = [runs[i] for i in indices]
        learned_from = [o for i, o in enumerate(observations) if i not in indices]
        learned = fit(learned_from if others else observations[: indices[0]]).constants
        for budget in BUDGETS_GIB:
            today = regret_at(group, concurrent, members, budget)
            rows.append((today, regret_at(group, concurrent, members, budget, learned)))
    return rows


def print_regret(rows: list[tuple[Regret, Regret]], learned_from: str) -> None:
    print(f"\nchoice regret (fair: <= {FAIR_CONCURRENT} neighbour), calibrated on {learned_from}")
    for fair in (True, False):
        chosen = [(a, b) for a, b in rows if a.fair == fair]
        groups = sorted({(a.group, a.concurrent) for a, _ in chosen})
        worst_today = max(a.regret for a, _ in chosen)
        worst_after = max(b.regret for _, b in chosen)
        unsafe = sum(b.unsafe for _, b in chosen)
        print(f"{'fair' if fair else 'unfair'}: {len(groups)} groups x {len(BUDGETS_GIB)} "
              f"budgets, worst today {worst_today:.3f}, calibrated {worst_after:.3f}, "
              f"{unsafe} calibrated choices that do not fit")  # fmt: skip


def print_groups(rows: list[tuple[Regret, Regret]]) -> None:
    for fair in (True, False):
        groups = sorted({(a.group, a.concurrent) for a, _ in rows if a.fair == fair})
        names = [f"{name} s={seq} mb={mb} nbrs={n}" for (name, seq, mb), n in groups]
        print(f"{'fair' if fair else 'unfair'} groups: {'; '.join(names)}")


def print_regret_rows(rows: list[tuple[Regret, Regret]]) -> None:
    print("\nregret by group and budget: today / calibrated, and the calibrated choice")
    for today, after in rows:
        name, seq, mb = after.group
        chose = after.chosen.split("mb=")[0].strip() or "-"
        print(
            f"{name:10} s={seq} mb={mb} nbrs={after.concurrent} {after.budget_gib:>6} GiB "
            f"{'fair' if after.fair else 'unfair':6} {today.regret:.3f} / {after.regret:.3f}  "
            f"chose {chose}{'  UNSAFE' if after.unsafe else ''}"
        )


def print_final(runs: list[GpuRun]) -> None:
    cal = fit([observation(i, r) for i, r in enumerate(runs)])
    print(f"\nfitted on all {cal.observations} runs (typical error {cal.typical_error:.1%})")
    for name, multiplier in cal.multipliers.items():
        mark = "identified" if name in cal.identified else "prior"
        top = ", ".join(f"{m.observation} {m.log_shift:+.3f}" for m in cal.moves_of(name)[:2])
        print(f"  {name:30} x{multiplier:.3f} {mark:10} {top}")
    print(f"  memory: {cal.memory.reason}")


def print_device_check(runs: list[GpuRun]) -> None:
    """The device efficiency the one alone forward+backward implies (bench/gpu_neighbour_check.py
    on a lent H200), beside today's and the one fitted on the shared runs."""
    if not NEIGHBOUR_CHECK.exists():
        return
    line = next(t for t in NEIGHBOUR_CHECK.read_text().splitlines() if t.startswith("{"))
    check = json.loads(line)
    run = next(r for r in runs if r.group == ("llama-1.1b", 2048, 4) and r.layout.stage == 0)
    device = run.predict_time().device_seconds  # forward and backward at today's efficiency
    alone = CALIBRATION.speeds.mfu_max * device / check["alone_s"]
    fitted = fit([observation(i, r) for i, r in enumerate(runs)]).constants.speeds.mfu_max
    slowdown = statistics.median(check["one_neighbour_s"]) / check["alone_s"]
    print(
        f"\nmfu_max: today {CALIBRATION.speeds.mfu_max:.3f}, fitted on the 44 shared runs "
        f"{fitted:.3f}, implied by llama-1.1b 4 x 2048 forward+backward alone on an H200 "
        f"{alone:.3f} ({check['alone_s'] * 1e3:.1f} ms; {slowdown:.2f}x with one identical "
        "neighbour)"
    )
    print("the H200 runs' neighbour: measured / (that forward+backward alone + the update)")
    for r in runs:
        lay = r.layout
        plain = not (lay.checkpointing or lay.offload_optimizer) and lay.stage in (0, 2)
        if r.group == ("llama-1.1b", 2048, 4) and plain:
            ratio = r.step_seconds / (check["alone_s"] + r.predict_time().serial_seconds)
            print(f"  {' '.join(r.label.split())} nbrs={r.concurrent}: {ratio:.2f}")


def print_rows(rows: list[Prediction]) -> None:
    print(f"\n{'run (file order)':46} {'nbrs':>4} {'step s':>7} {'today':>7} {'learned':>8} "
          f"{'mem today':>9} {'learned':>8}")  # fmt: skip
    for r in rows:
        print(
            f"{'#' + str(r.index) + ' ' + ' '.join(r.run.label.split()):46} "
            f"{r.run.concurrent:>4} {r.run.step_seconds:>7.3f} {r.time_before:>+7.1%} "
            f"{r.time_after:>+8.1%} {r.memory_before:>+9.1%} {r.memory_after:>+8.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", action="store_true", help="also print every run and budget")
    parser.add_argument("--runs", type=Path, default=H200_RUNS, help="GPU runs, JSON lines")
    args = parser.parse_args()
    runs = load_gpu_runs(args.runs)
    rows = predictions(runs)
    print_time(rows)
    print_memory(rows)
    regrets = group_regrets(runs)
    print_regret(regrets, "the runs before each group")
    print_regret(group_regrets(runs, others=True), "every run outside the group")
    print_groups(regrets)
    print_final(runs)
    print_device_check(runs)
    if args.rows:
        print_rows(rows)
        print_regret_rows(regrets)


if __name__ == "__main__":
    main()
