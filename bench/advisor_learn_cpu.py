"""The advisor learning on this machine: real DeepSpeed CPU ranks through the whole service.

Starts ``zeropilot up`` on a fresh data folder (SQLite, the embedded broker, a Celery worker
with its beat, the local backend, learning every 2 s and refitting after 5 observations), then
submits five jobs of different shapes (``examples/train_tiny.py``: width, depth, sequence,
batch, ZeRO stage), one at a time so none has a neighbour, each with ``--wait``. Once the
service has refitted the local cluster's calibration on them, a sixth shape is submitted: its
plan's step time is predicted with that calibration, and it is measured as the others were
(the median of its steady steps, the service's own observation row).

For each job: the measured step time, today's prediction for the plan that ran (the advisor's
``cpu`` constants) and its error; for the sixth also the calibrated prediction and its error.

    python bench/advisor_learn_cpu.py [--steps 30] [--no-zero0]

``--no-zero0`` runs the ZeRO-0 shapes at ZeRO-1: on these CPU ranks ZeRO-0 measured many times
slower than ZeRO-1 for the same shape (bench/data/cpu_zero0_vs_zero1-2026-12-04.txt), which no
constant of the model can learn; without it the check shows what the other terms learn.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from sqlmodel import Session, select

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.submit_to_done import free_port, latest_job, start_up  # noqa: E402  (one way to start zeropilot up)
from service.core.advisor.calibration import WARMUP_STEPS  # noqa: E402
from service.core.advisor.models import Candidate  # noqa: E402
from service.core.advisor.step_time import predict_step_time  # noqa: E402
from service.core.observing import observation_of  # noqa: E402
from service.core.spec import JobSpec  # noqa: E402
from service.db.models import AttemptObservation, ClusterCalibrationRow  # noqa: E402
from service.db.session import get_engine  # noqa: E402
from service.settings import Settings  # noqa: E402

# (hidden, layers, heads, sequence, global batch, ZeRO stage): host-bound to device-bound
LEARNT = [
    (64, 2, 4, 32, 8, 0),
    (256, 4, 4, 128, 8, 2),
    (128, 4, 4, 64, 16, 1),
    (384, 2, 6, 64, 8, 0),
    (256, 2, 4, 256, 4, 3),
]
SIXTH = (192, 3, 4, 128, 8, 2)
VOCAB = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-zero0", action="store_true", help="ZeRO-1 where a shape says 0")
    args = parser.parse_args()
    if args.no_zero0:
        LEARNT[:] = [(*shape[:5], max(shape[5], 1)) for shape in LEARNT]
    with tempfile.TemporaryDirectory(prefix="zp-learn-") as folder:
        env = _environment(Path(folder))
        server = start_up(env)
        try:
            _run(env, Path(folder), args.steps)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def _run(env: dict[str, str], folder: Path, steps: int) -> None:
    settings = Settings(data_dir=Path(env["ZEROPILOT_DATA_DIR"]))
    profile = settings.cluster_profiles()["local"]
    print(f"{'shape':44} {'plan':26} {'measured':>9} {'today':>9} {'err':>7} {'calibrated':>10}"
          f" {'err':>7}")  # fmt: skip
    for shape in LEARNT:
        job = _submit(env, folder, shape, steps)
        _print_row(settings, profile, shape, job, calibrated=False)
    row = _wait_for_fit(settings, len(LEARNT))
    print(
        f"calibration: {row.observations} runs, typical error {row.typical_error:.1%},"
        f" multipliers {json.dumps(row.multipliers)}; memory: {row.memory_reason}"
    )
    time.sleep(6)  # past the API's 5 s copy of the calibration (service.db.calibrations)
    job = _submit(env, folder, SIXTH, steps)
    _print_row(settings, profile, SIXTH, job, calibrated=True)
    print(f"sixth's reason: {job['advice_reason']}")


def _print_row(
    settings: Settings, profile: Any, shape: tuple[int, ...], job: dict[str, Any], calibrated: bool
) -> None:
    observed = _observation(settings, job["attempts"][-1]["id"])
    spec, plan = JobSpec.model_validate(job["spec"]), Candidate.model_validate(job["plan"])
    assert observed.step_seconds is not None, observed.skipped
    measured = observed.step_seconds
    rebuilt = observation_of("", spec, plan, profile, measured)
    today = predict_step_time(rebuilt.work, rebuilt.layout).seconds
    text = (f"{_label(shape):44} {plan.label():26} {measured * 1e3:7.1f}ms {today * 1e3:7.1f}ms"
            f" {today / measured - 1:+7.1%}")  # fmt: skip
    if calibrated:
        assert plan.step_seconds is not None
        text += f" {plan.step_seconds * 1e3:8.1f}ms {plan.step_seconds / measured - 1:+7.1%}"
    print(f"{text}\n    {_spread(spec, job)}; load average {os.getloadavg()[0]:.1f} on"
          f" {os.cpu_count()} cores", flush=True)  # fmt: skip


def _spread(spec: JobSpec, job: dict[str, Any]) -> str:
    """The steady steps' quartiles: how noisy the machine was while the job ran."""
    paces = [p["tokens_per_s"] for p in sorted(job["metrics"], key=lambda p: p["step"])]
    steps = sorted(s for p in paces[WARMUP_STEPS:] if (s := spec.training.step_seconds(p)))
    q1, _, q3 = statistics.quantiles(steps, n=4)
    return f"{len(steps)} steady steps, quartiles {q1 * 1e3:.1f}-{q3 * 1e3:.1f} ms"


def _label(shape: tuple[int, ...]) -> str:
    hidden, layers, heads, sequence, batch, stage = shape
    return f"h{hidden} L{layers} heads{heads} seq{sequence} batch{batch} ZeRO-{stage}"


def _spec(folder: Path, shape: tuple[int, ...], steps: int) -> Path:
    hidden, layers, heads, sequence, batch, stage = shape
    spec = {
        "name": f"learn-h{hidden}-l{layers}-s{sequence}-b{batch}-z{stage}",
        "entrypoint": "train_tiny.py",
        "working_dir": str(REPO / "examples"),
        "args": (
            f"--steps {steps} --checkpoint-interval {steps} --hidden {hidden} --layers {layers}"
            f" --heads {heads} --vocab {VOCAB} --seq-len {sequence}"
        ).split(),
        "model": {
            "hidden_size": hidden,
            "num_layers": layers,
            "num_heads": heads,
            "vocab_size": VOCAB,
        },
        "training": {
            "sequence_length": sequence,
            "global_batch_size": batch,
            "precision": "fp32",
            "learning_rate": 0.003,
        },
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
        "zero": {"stage": stage},
        "checkpoint": {"interval_steps": steps},
    }
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _submit(env: dict[str, str], folder: Path, shape: tuple[int, ...], steps: int) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "zeropilot.cli", "submit", str(_spec(folder, shape, steps)),
         "--wait"], env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"zeropilot submit failed:\n{done.stdout}\n{done.stderr}")
    return latest_job(env)


def _observation(settings: Settings, attempt_id: str) -> AttemptObservation:
    """The service's own observation of the attempt, once the learning beat has written it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with Session(get_engine(settings.database_url)) as session:
            row = session.get(AttemptObservation, attempt_id)
        if row is not None:
            return row
        time.sleep(1)
    raise SystemExit(f"no observation of attempt {attempt_id} within 60 s")


def _wait_for_fit(settings: Settings, runs: int) -> ClusterCalibrationRow:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with Session(get_engine(settings.database_url)) as session:
            row = session.exec(select(ClusterCalibrationRow)).first()
        if row is not None and row.observations >= runs:
            return row
        time.sleep(1)
    raise SystemExit(f"no calibration fitted on {runs} runs within 120 s")


def _environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROPILOT_")}
    env.update(
        ZEROPILOT_DATA_DIR=str(folder / "data"),
        XDG_CONFIG_HOME=str(folder / "config"),
        ZEROPILOT_API__PORT=str(free_port()),
        ZEROPILOT_WORKERS__LEARN_INTERVAL_S="2",
        ZEROPILOT_WORKERS__REFIT_AFTER=str(len(LEARNT)),
    )
    return env


if __name__ == "__main__":
    main()
