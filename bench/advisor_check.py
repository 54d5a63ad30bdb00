"""The advisor against real runs, H200 and CPU side by side; exits 1 below the targets.

Targets: H200 at least 95% of runs within ±10% of the band from peak allocated to peak
reserved and no unsafe verdict at 16/24/40/48/80/94/139.8 GiB; CPU grid no worse than the
CPU calibration (152/155 within ±10%, no unsafe verdict). See bench/accuracy.py for the
definitions. Usage: python bench/advisor_check.py [--rows]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import BUDGETS_GIB, GIB, failures, h200_rows, summaries, unsafe_budgets
from gpu_runs import H200_RUNS


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
    missed = failures(results)
    for line in missed:
        print(f"BELOW TARGET: {line}")
    return 1 if missed else 0


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
    sys.exit(code)


if __name__ == "__main__":
    main()
