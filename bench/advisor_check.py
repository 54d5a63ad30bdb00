"""The advisor against real runs, H200 and CPU side by side; exits 1 below the targets.

Memory targets: H200 at least 95% of runs within ±10% of the band from peak allocated to peak
reserved and no unsafe verdict at 16/24/40/48/80/94/139.8 GiB; CPU grid no worse than the
CPU calibration (152/155 within ±10%, no unsafe verdict). Time targets: step time within ±20%
on the runs alone on the GPU; choice regret <= 1.05 in every group compared fairly (runs with
at most one neighbour). See bench/accuracy.py and bench/timing.py for the definitions.
Usage: python bench/advisor_check.py [--rows]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import (
    BUDGETS_GIB,
    GIB,
    failures,
    h200_rows,
    initialize_errors,
    summaries,
    unsafe_budgets,
)
from gpu_runs import H200_RUNS, load_gpu_runs
from timing import (
    alone_errors,
    identical_pairs,
    neighbour_errors,
    regrets,
    time_failures,
    time_summary,
)


def print_table(gpu_runs: Path) -> int:
    results = summaries(gpu_runs)
    print(f"{'grid':22} {'within ±10%':>12} {'median err':>11} {'worst err':>10} {'unsafe':>7}")
    for s in results.values():
        within = f"{s.within}/{s.runs}"
        print(
            f"{s.name:22} {within:>12} {s.median_error:>10.1f}% {s.worst_error:>+9.1f}% "
            f"{s.unsafe:>7}"
        )
    print(f"unsafe: says fits at {', '.join(map(str, BUDGETS_GIB))} GiB (H200) or at the smallest")
    print("budget it calls enough (CPU), where the real run needs more")
    init = [e for _, e in initialize_errors(gpu_runs)]
    if init:
        within = sum(abs(e) <= 10.0 for e in init)
        print(
            f"initialize peak (allocated)  {within}/{len(init)} within ±10%, median "
            f"{statistics.median(abs(e) for e in init):.1f}%, worst {max(init, key=abs):+.1f}%"
        )
    t = time_summary(gpu_runs)
    print(f"\n{'step time':34} {'runs':>5} {'median err':>11} {'worst err':>10}")
    alone = len(alone_errors(load_gpu_runs(gpu_runs)))
    print(
        f"{'alone on the GPU (the fit)':34} {alone:>5} {t.alone_median:>10.1%} "
        f"{t.alone_worst:>+10.1%}"
    )
    print(
        f"{'equal neighbours, one scale/group':34} {t.neighbour_runs:>5} "
        f"{t.neighbour_median:>10.1%} {t.neighbour_worst:>+10.1%}"
    )
    print(
        f"choice regret: worst {t.fair_worst_regret:.3f} over {t.fair_groups} fair groups "
        f"(<= 1 neighbour) x {len(BUDGETS_GIB)} budgets; {t.unsafe} choices that do not fit"
    )
    missed = failures(results) + time_failures(t)
    for line in missed:
        print(f"BELOW TARGET: {line}")
    return 1 if missed else 0


def print_time_rows(gpu_runs: Path) -> None:
    runs = load_gpu_runs(gpu_runs)
    print(f"\n{'GPU run':44} {'nbrs':>4} {'step s':>7} {'predicted':>9} {'err':>7} {'in group':>8}")
    scaled = dict((r.label, e) for r, e in neighbour_errors(runs))
    for run in sorted(runs, key=lambda r: (r.group, r.concurrent, r.label)):
        predicted = run.predict_time().seconds
        error = predicted / run.step_seconds - 1
        group = f"{scaled[run.label]:+.1%}" if run.label in scaled else ""
        print(
            f"{run.label:44} {run.concurrent:>4} {run.step_seconds:>7.3f} {predicted:>9.3f} "
            f"{error:>+7.1%} {group:>8}"
        )
    print("\nregret (fastest that really fits / the advisor's choice, both measured)")
    for r in regrets(runs):
        fair = "fair" if r.fair else "unfair"
        name, seq, mb = r.group
        print(
            f"{name:10} s={seq} mb={mb} nbrs={r.concurrent} {r.budget_gib:>6} GiB {fair:6} "
            f"{r.regret:6.3f}  chose {r.chosen.split('mb=')[0] or '-':24} best "
            f"{r.best.split('mb=')[0] or '-'}{'  UNSAFE' if r.unsafe else ''}"
        )
    print("\nthe same work on one GPU (ZeRO-1 / ZeRO-2 step time, same neighbours): the noise")
    for label, concurrent, ratio in identical_pairs(runs):
        print(f"{label:44} nbrs={concurrent} {ratio:.3f}")


def print_rows(gpu_runs: Path) -> None:
    print(f"\n{'GPU run':50} {'alloc':>7} {'reserved':>9} {'predicted':>10} {'err':>6}  phase")
    for run, predicted, error in h200_rows(gpu_runs):
        unsafe = unsafe_budgets(run)
        flag = f"  UNSAFE at {unsafe}" if unsafe else ""
        print(
            f"{run.label:50} {run.allocated / GIB:>7.2f} {run.reserved / GIB:>9.2f} "
            f"{predicted / GIB:>10.2f} {error:>+5.1f}%  {run.predict().phase}{flag}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", action="store_true", help="also print every GPU run")
    parser.add_argument(
        "--runs", type=Path, default=H200_RUNS, help="GPU runs, JSON lines (bench/gpu_probe.py)"
    )
    args = parser.parse_args()
    code = print_table(args.runs)
    if args.rows:
        print_rows(args.runs)
        print_time_rows(args.runs)
    sys.exit(code)


if __name__ == "__main__":
    main()
