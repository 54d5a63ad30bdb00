"""Submit to done on the embedded stack, against the same DeepSpeed launch by hand.

Starts ``zeropilot up`` on a fresh data folder (SQLite, the SQLite broker, a Celery worker with
beat, the local backend), then runs ``--pairs`` alternated pairs:

- **zeropilot**: ``zeropilot submit examples/tiny-gpt.yaml --wait``, the whole CLI process;
- **by hand**: the node command that attempt's supervisor ran (its ``launch.json``: the
  DeepSpeed launcher, ``train_tiny.py``, the rendered ds_config), in the same folder, with the
  ``ZEROPILOT_*`` reporting variables left out and a fresh checkpoint folder.

Also per zeropilot run: the time from the ranks' exit (``result.json``'s ``at``, written by the
supervisor as the last rank ends) to the job's SUCCEEDED in the database (its event's time).

    python bench/submit_to_done.py [--pairs 5] [--spec examples/tiny-gpt.yaml]

Prints each pair and the medians: the ratio of the medians, and the median of each pair's ratio
(the two runs of a pair share the machine's load of the moment, so it drifts less).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--spec", type=Path, default=REPO / "examples" / "tiny-gpt.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zp-bench-") as folder:
        env = _environment(Path(folder))
        server = start_up(env)
        try:
            rows = [_pair(env, args.spec, Path(folder), number) for number in range(args.pairs)]
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    ours = statistics.median(r["zeropilot_s"] for r in rows)
    hand = statistics.median(r["by_hand_s"] for r in rows)
    lags = [r["end_to_db_s"] for r in rows]
    lag = statistics.median(lags)
    # Each pair's two runs share the machine's load of the moment: their ratio drifts less.
    paired = statistics.median(r["zeropilot_s"] / r["by_hand_s"] for r in rows)
    print(f"median: zeropilot {ours:.2f} s, by hand {hand:.2f} s, ratio of medians"
          f" {ours / hand:.3f}, median of pair ratios {paired:.3f}; ranks' exit to SUCCEEDED"
          f" {lag:.2f} s (max {max(lags):.2f})")  # fmt: skip


def _environment(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROPILOT_")}
    env.update(
        ZEROPILOT_DATA_DIR=str(folder / "data"),
        XDG_CONFIG_HOME=str(folder / "config"),
        ZEROPILOT_API__PORT=str(free_port()),
    )
    return env


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_up(env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = Path(env["ZEROPILOT_DATA_DIR"]).parent / "up.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "zeropilot.cli", "up"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 180
    while "zeropilot is up" not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit(f"zeropilot up did not start:\n{log.read_text()}")
        time.sleep(0.5)
    return server


def _pair(env: dict[str, str], spec: Path, folder: Path, number: int) -> dict[str, float]:
    started, began_at = time.monotonic(), time.time()
    done = subprocess.run(
        [sys.executable, "-m", "zeropilot.cli", "submit", str(spec), "--wait"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    ours, ended_at = time.monotonic() - started, time.time()
    if done.returncode != 0:
        raise SystemExit(f"zeropilot submit failed:\n{done.stdout}\n{done.stderr}")
    job = latest_job(env)
    attempt_dir = Path(env["ZEROPILOT_DATA_DIR"]) / "attempts" / job["attempts"][-1]["backend_name"]
    exited_at = json.loads((attempt_dir / "result.json").read_text())["at"]
    succeeded = next(
        e for e in job["events"] if e["subject"] == "job" and e["to_status"] == "SUCCEEDED"
    )
    recorded_at = _event_time(succeeded)
    hand = _by_hand(
        json.loads((attempt_dir / "launch.json").read_text()), folder / f"hand-{number}"
    )
    row = {"zeropilot_s": ours, "by_hand_s": hand, "end_to_db_s": recorded_at - exited_at}
    marks = {
        "cli start": began_at,
        "job stored": _event_time(job["events"][0]),
        "supervisor up": float((attempt_dir / "started").read_text()),
        "ranks' exit": exited_at,
        "SUCCEEDED": recorded_at,
        "cli exit": ended_at,
    }
    steps = list(marks.items())
    split = ", ".join(f"{b[0]} +{b[1] - a[1]:.2f}" for a, b in itertools.pairwise(steps))
    print(f"pair {number + 1}: zeropilot {ours:.2f} s, by hand {hand:.2f} s,"
          f" ranks' exit to SUCCEEDED {row['end_to_db_s']:.2f} s; {split}", flush=True)  # fmt: skip
    return row


def _event_time(event: dict[str, Any]) -> float:
    at = datetime.fromisoformat(event["created_at"])
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def latest_job(env: dict[str, str]) -> dict[str, Any]:
    listed = subprocess.run(
        [sys.executable, "-m", "zeropilot.cli", "list", "--limit", "1", "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job_id = json.loads(listed.stdout)["data"][0]["id"]
    shown = subprocess.run(
        [sys.executable, "-m", "zeropilot.cli", "status", job_id, "--json"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    job: dict[str, Any] = json.loads(shown.stdout)
    return job


def _by_hand(launch: dict[str, Any], checkpoints: Path) -> float:
    """The supervisor's node command, run here with no zeropilot around it."""
    env = {k: v for k, v in launch["env"].items() if not k.startswith("ZEROPILOT_")}
    env["ZEROPILOT_CHECKPOINT_DIR"] = str(checkpoints)  # where train_tiny saves, not the job's
    checkpoints.mkdir(parents=True)
    started = time.monotonic()
    for node in launch["nodes"]:
        subprocess.run(node["argv"], cwd=launch["cwd"], env=env, capture_output=True, check=True)
    elapsed = time.monotonic() - started
    shutil.rmtree(checkpoints, ignore_errors=True)
    return elapsed


if __name__ == "__main__":
    main()
