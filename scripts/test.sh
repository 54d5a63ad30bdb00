#!/usr/bin/env bash
# The whole test suite: static checks, then unit, integration and end-to-end tests against real
# Redis, PostgreSQL, Slurm (started by the Slurm fixture) and DeepSpeed on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV=$PWD/$VENV ;; esac
export PATH="$VENV/bin:$PATH"
# DeepSpeed's JIT-built ops are tied to the interpreter: one cache per venv avoids rebuilds.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$VENV/torch_extensions}

# A cached venv may hold an editable install of another checkout: point it at this one.
python -m pip install --quiet --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true

scripts/services.sh
ZEROPILOT_HELM=$(scripts/tools.sh helm); export ZEROPILOT_HELM  # the chart tests need it
# A real Kubernetes control plane (etcd, API server, controller manager, scheduler), found the
# way envtest finds it; and Debian's Chromium for the console's browser tests.
KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$(scripts/kube-binaries.sh)}; export KUBEBUILDER_ASSETS
scripts/browser.sh

echo "== static checks"
ruff check .
ruff format --check .
mypy
lint-imports --no-cache

# DeepSpeed compiles its CPU communication op on first use: 6.5 min on this 2-core machine under
# load, which once ran the first end-to-end test past its timeout. Built once per venv, here.
if [ ! -e "$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/deepspeed_shm_comm.so" ]; then
    echo "== building DeepSpeed's CPU communication op (once per venv)"
    python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()" 2>&1 |
        tail -n 2
fi

echo "== tests"
started=$SECONDS
if (($# > 0)); then
    # A chosen subset: one run, as asked.
    status=0
    python -m pytest -ra --durations=15 "$@" || status=$?
else
    # The whole suite as two runs side by side: the tests that need the machine's one Slurm
    # cluster or the Kubernetes control plane, and the rest (tests/conftest.py, --part). Most of
    # a test's time is spent waiting on processes, not on the CPU, so this saves wall time.
    # Each run has its own Redis database: a Celery worker of one must not take the other's tasks.
    export PYTHONUNBUFFERED=1  # lines come out as they are written, prefixed by their part
    part() {
        local name=$1 redis=$2
        ZEROPILOT_TEST_REDIS=$redis python -m pytest -ra --durations=15 --part "$name" 2>&1 |
            sed -u "s/^/[$name] /"
        return "${PIPESTATUS[0]}"
    }
    part clusters "${ZEROPILOT_TEST_REDIS_CLUSTERS:-redis://127.0.0.1:6379/10}" & clusters=$!
    part rest "${ZEROPILOT_TEST_REDIS:-redis://127.0.0.1:6379/11}" & rest=$!
    status=0
    wait "$clusters" || status=$?
    wait "$rest" || status=$?
fi
echo "== tests took $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
if ((status != 0)); then
    # A run killed from outside prints no summary: leave what the machine says about it.
    echo "== pytest exited $status; memory and the kernel's last kills:"
    free -m || true
    df -h /dev/shm || true  # DeepSpeed's CPU all-reduce buffers live there (workers/backends/shm.py)
    kills=$(dmesg 2>/dev/null | grep -E "oom-kill:" | tail -n 8 || true)
    # The tests provoke kills inside a memory cgroup on purpose (Slurm's --mem); a kill with
    # CONSTRAINT_NONE means the whole machine ran out of memory, which no test intends.
    echo "-- machine-wide (unexpected):"
    grep -v CONSTRAINT_MEMCG <<<"$kills" | grep . || echo "   none"
    echo "-- inside a memory cgroup (the Slurm OOM test provokes these on purpose):"
    grep CONSTRAINT_MEMCG <<<"$kills" | sed -E 's/.*(task=[^,]*,pid=[0-9]+).*/   \1/' | grep . ||
        echo "   none"
fi
exit "$status"
