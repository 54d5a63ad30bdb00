"""Submit throughput and latency: zeropilot's POST /v1/jobs beside ``sbatch --hold``, same run.

Both systems get the same treatment: measured at backlog 0, then filled with ``--backlog`` jobs
that stay queued (zeropilot: admitted, QUEUED, no worker runs them; Slurm: held), then measured
again. Each measurement sends ``--submits`` submits from 1 and from 4 concurrent clients and
reports submits/s and p50/p99 latency; it is repeated ``--rounds`` times, the two systems taking
turns (the order flips each round), because this machine's speed drifts from minute to minute.
One table of every row at the end, load average beside each, then each round's ratio
(zeropilot / sbatch) and their median per backlog and client count.

zeropilot's clients are the SDK's (``zeropilot.client.Client``, one per client process,
keep-alive), as a script submitting a sweep has them: each submit sends an Idempotency-Key and
parses the answer.

zeropilot: a fresh PostgreSQL database (dropped at the end) and Redis DB 14 unless given; the API
is started here as ``tests/e2e/stack.py`` does (uvicorn, ZEROPILOT_* variables) with
``--api-workers`` processes, or pointed at with ``--api-url`` and ``--token``.
Slurm: a controller of its own in ``--slurm-dir`` on ports of its own with a MaxJobCount above
the backlog (the shared test cluster keeps Slurm's default of 10,000 jobs, and other sessions
use it). Held jobs never reach a node, so no slurmd is started.

Usage: python bench/submit_throughput.py [--backlog 10000] [--submits 400] [--rounds 3]
  [--pin-api-workers]
  [--no-slurm]; a small run: --backlog 500 --submits 100 --rounds 1; the measured team under a
  quota: --quota 1000000
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.submit_backends import (
    ensure_munged,
    fill_zeropilot_backlog,
    start_slurmctld,
    zeropilot_users,
)
from zeropilot.client import Client

REPO = Path(__file__).resolve().parents[1]
ADMIN_DSN = os.environ.get(
    "ZEROPILOT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass(frozen=True)
class Result:
    system: str
    backlog: int
    clients: int
    submits: int
    seconds: float
    latencies: list[float]
    load: str
    round: int

    @property
    def rate(self) -> float:
        return self.submits / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_clients(
    submit_one: Callable[[int], None], submits: int, clients: int
) -> tuple[float, list[float]]:
    """Send ``submits`` submits from ``clients`` processes (forked: each its own interpreter,
    as separate scripts or ``sbatch`` runs are, so no client waits for another's GIL); return
    (wall seconds, latencies). Each process first sends one submit not counted (its
    connection), and the clock starts when all are ready."""
    context = multiprocessing.get_context("fork")
    taken = context.Value("i", 0)  # the next submit's index, shared
    returned = context.SimpleQueue()
    ready = context.Barrier(clients + 1)

    def client(number: int) -> None:
        latencies: list[float] = []
        try:
            submit_one(submits + number)  # warm, not counted
            ready.wait()
            while True:
                with taken.get_lock():
                    index = taken.value
                    taken.value += 1
                if index >= submits:
                    break
                started = time.perf_counter()
                submit_one(index)
                latencies.append(time.perf_counter() - started)
            returned.put(latencies)
        except BaseException as exc:  # told to the parent, which waits for every client
            ready.abort()
            returned.put(f"a client failed: {exc!r}")
        os._exit(0)  # no finalizers: the parent's database connections are shared fds here

    processes = [context.Process(target=client, args=(n,)) for n in range(clients)]
    for process in processes:
        process.start()
    ready.wait(timeout=120)
    started = time.perf_counter()
    answers = [returned.get() for _ in processes]
    seconds = time.perf_counter() - started
    for answer in answers:
        if isinstance(answer, str):
            raise RuntimeError(answer)
    latencies = [latency for answer in answers for latency in answer]
    for process in processes:
        process.join()
    return seconds, latencies


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def job_spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": "train_tiny.py",
        "working_dir": str(REPO / "examples"),
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        "training": {"sequence_length": 32, "global_batch_size": 8, "precision": "fp32"},
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
    }


class ZeropilotClient:
    """One SDK client per client process (keep-alive), as a script submitting in a loop has."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.clients: dict[int, Client] = {}

    def submit(self, index: int) -> None:
        client = self.clients.get(os.getpid())  # a forked client opens its own connection
        if client is None:
            client = self.clients[os.getpid()] = Client(self.url, self.token, timeout=60)
        job = client.submit(job_spec(f"bench-{index}"), tries=1)
        if job["status"] != "QUEUED":
            raise RuntimeError(f"job {job['id']} is {job['status']}: {job['message']}")


def sbatch_submit(conf: Path, script: Path) -> Callable[[int], None]:
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def submit(index: int) -> None:
        argv = ["sbatch", "--hold", "--parsable", f"--job-name=bench-{index}", str(script)]
        if subprocess.run(argv, env=env, capture_output=True).returncode != 0:
            ensure_munged()  # a test session sharing this machine may have stopped its munged
            subprocess.run(argv, env=env, check=True, capture_output=True)

    return submit


def measure(
    systems: list[tuple[str, Callable[[int], None]]],
    backlog: int,
    args: argparse.Namespace,
) -> list[Result]:
    """Every system at every client count, ``--rounds`` times, the systems taking turns, after
    ``--warm`` unmeasured submits each from the most clients: every API worker's connections,
    prepared statements and caches, and PostgreSQL's catalog caches in its new backends."""
    for _name, submit in systems:
        if args.warm:
            run_clients(submit, args.warm, max(args.clients))
    results = []
    for number in range(args.rounds):
        for name, submit in systems if number % 2 == 0 else systems[::-1]:
            for clients in args.clients:
                seconds, latencies = run_clients(submit, args.submits, clients)
                result = Result(
                    name, backlog, clients, args.submits, seconds, latencies, load_average(), number
                )
                print(row(result), flush=True)
                results.append(result)
    return results


def ratios(results: list[Result]) -> list[str]:
    """Per backlog and client count: each round's zeropilot/sbatch rate, and their median."""
    lines = []
    for backlog in sorted({r.backlog for r in results}):
        for clients in sorted({r.clients for r in results}):
            rate = {
                (r.system, r.round): r.rate
                for r in results
                if (r.backlog, r.clients) == (backlog, clients)
            }
            rounds = sorted({number for _system, number in rate})
            each = [rate["zeropilot", n] / rate["sbatch", n] for n in rounds]
            lines.append(
                f"backlog {backlog:>6}, {clients} client(s): zeropilot/sbatch "
                f"{' '.join(f'{x:.2f}' for x in each)}   median {statistics.median(each):.2f}x"
            )
    return lines


def row(result: Result) -> str:
    return (
        f"{result.system:<10} {result.round:>5} {result.backlog:>8} {result.clients:>7} "
        f"{result.submits:>7} "
        f"{result.rate:>9.1f} {result.percentile(0.5) * 1000:>8.1f} "
        f"{result.percentile(0.99) * 1000:>8.1f}   {result.load}"
    )


HEADER = (
    f"{'system':<10} {'round':>5} {'backlog':>8} {'clients':>7} {'submits':>7} {'submits/s':>9} "
    f"{'p50 ms':>8} {'p99 ms':>8}   load average"
)


@contextmanager
def bench_database() -> Iterator[str]:
    name = f"zp_bench_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_DSN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        from service.db.session import get_engine

        get_engine(f"{base}/{name}").dispose()
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pin_workers(parent: int) -> None:
    """Each uvicorn worker, every thread of it, on a CPU of its own, in turn (a worker's
    threads hand the GIL to each other: on one core, its caches stay warm)."""
    cpus = sorted(os.sched_getaffinity(0))
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    workers = [p for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    for index, child in enumerate(sorted(int(pid) for pid in workers)):
        for thread in Path(f"/proc/{child}/task").iterdir():
            os.sched_setaffinity(int(thread.name), {cpus[index % len(cpus)]})


@contextmanager
def api_process(
    database_url: str, redis_url: str, workers: int, data_dir: Path, pin: bool = False
) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "ZEROPILOT_DATA_DIR": str(data_dir),
        "ZEROPILOT_DB__URL": database_url,
        "ZEROPILOT_BROKER__URL": redis_url,
        "ZEROPILOT_AUTH__SECRET_KEY": "bench-secret",
        "ZEROPILOT_API__PORT": str(port),
        "PROMETHEUS_MULTIPROC_DIR": str(data_dir / "prometheus"),
    }
    (data_dir / "prometheus").mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "uvicorn", "--factory", "service.api.app:create_app",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
            "--workers", str(workers)]  # fmt: skip
    with (data_dir / "api.log").open("ab") as log:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        if pin:
            pin_workers(process.pid)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_ready(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the API did not become ready")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backlog", type=int, default=10_000, help="jobs queued before the second measurement"
    )
    parser.add_argument("--submits", type=int, default=400, help="submits per measurement")
    parser.add_argument(
        "--rounds", type=int, default=3, help="measurements of each row, the systems taking turns"
    )
    parser.add_argument(
        "--warm", type=int, default=200, help="unmeasured submits per system before round 0"
    )
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4])
    parser.add_argument("--api-workers", type=int, default=2, help="uvicorn --workers")
    parser.add_argument(
        "--pin-api-workers", action="store_true", help="each API worker on a CPU of its own"
    )
    parser.add_argument("--api-url", help="an API already running (then --token is needed)")
    parser.add_argument("--token", help="a member's token for --api-url")
    parser.add_argument("--database-url", help="the database of --api-url, to fill the backlog")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--slurm-dir", type=Path, default=Path("/tmp/zp-bench-slurm"))
    parser.add_argument("--no-slurm", action="store_true")
    parser.add_argument(
        "--quota",
        type=int,
        help="GPU quota of the measured team: each submit then takes the admission turn and "
        "reads the counters (give one its jobs never reach, or they start to wait)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    results: list[Result] = []
    print(HEADER, flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="zp-bench-") as tmp,
        _sbatch(args) as sbatch,
        _zeropilot(args, Path(tmp)) as (client, database_url),
    ):
        systems = [("zeropilot", client.submit)] + ([("sbatch", sbatch)] if sbatch else [])
        results += measure(systems, 0, args)
        fill_backlogs(args.backlog, database_url, sbatch)
        results += measure(systems, args.backlog, args)
    redis.Redis.from_url(args.redis_url).flushdb()
    print("\n" + HEADER)
    for result in results:
        print(row(result))
    if sbatch:
        print()
        print("\n".join(ratios(results)))


def fill_backlogs(jobs: int, database_url: str, sbatch: Callable[[int], None] | None) -> None:
    started = time.perf_counter()
    fill_zeropilot_backlog(database_url, jobs)
    print(f"zeropilot: {jobs} jobs waiting, stored in {time.perf_counter() - started:.0f} s")
    if sbatch:
        started = time.perf_counter()
        run_clients(sbatch, jobs, 4)
        print(f"slurm: {jobs} jobs held, submitted in {time.perf_counter() - started:.0f} s")


@contextmanager
def _sbatch(args: argparse.Namespace) -> Iterator[Callable[[int], None] | None]:
    if args.no_slurm:
        yield None
        return
    with start_slurmctld(args.slurm_dir) as conf:
        script = args.slurm_dir / "held.sh"
        script.write_text("#!/bin/sh\n# held by the bench, never run\ntrue\n")
        yield sbatch_submit(conf, script)


@contextmanager
def _zeropilot(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[ZeropilotClient, str]]:
    redis.Redis.from_url(args.redis_url).flushdb()
    if args.api_url:
        yield ZeropilotClient(args.api_url, args.token), args.database_url
        return
    with bench_database() as database_url:
        token = zeropilot_users(database_url, args.quota)
        api = api_process(
            database_url, args.redis_url, args.api_workers, tmp, pin=args.pin_api_workers
        )
        with api as url:
            yield ZeropilotClient(url, token), database_url


if __name__ == "__main__":
    main()
