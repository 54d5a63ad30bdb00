"""The memory model's measured error on the H200 runs: what a GPU budget must keep free.

For each run: how far the prediction (``total``, CUDA context included) falls short of what the
run really needed (its peak reserved plus the context), in bytes and as a share of the need.
The largest shortfall in bytes and the largest share among runs above 16 GiB are the numbers
behind ``GPU_ERROR_BYTES`` and ``GPU_ERROR_SHARE`` (constants.py). Usage:
python bench/advisor_headroom.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import GIB
from gpu_runs import load_gpu_runs

from service.core.advisor.constants import CALIBRATION, GPU_ERROR_BYTES, GPU_ERROR_SHARE


def main() -> None:
    context = CALIBRATION.overhead.gpu_context_bytes
    rows = []
    for run in load_gpu_runs():
        need = run.reserved + context
        short = need - run.predict().per_gpu.total
        rows.append((run.label, need, short))
    worst_bytes = max(rows, key=lambda r: r[2])
    large = [r for r in rows if r[1] > 16 * GIB]
    worst_share = max(large, key=lambda r: r[2] / r[1])
    print(f"runs: {len(rows)}; predicted below the real need in {sum(r[2] > 0 for r in rows)}")
    print(f"largest shortfall: {worst_bytes[2] / GIB:.2f} GiB ({worst_bytes[0]})")
    print(f"largest share above 16 GiB: {worst_share[2] / worst_share[1]:.2%} ({worst_share[0]})")
    print(f"kept free on a GPU: {GPU_ERROR_BYTES / GIB:.2f} GiB + {GPU_ERROR_SHARE:.0%}")


if __name__ == "__main__":
    main()
