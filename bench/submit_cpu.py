"""CPU per submit, by process: the API's workers, PostgreSQL, Redis and the client.

Starts the API as ``bench/submit_throughput.py`` does (fresh database, Redis DB 14, uvicorn with
``--api-workers``), sends ``--submits`` submits from ``--clients`` threads of this process after
a warm-up, and divides each process's CPU time (``utime + stime`` from ``/proc``) over them by
the number of submits. CPU per submit is steadier than a rate on a shared machine whose speed
drifts, but it still moves with it: compare versions run alternately.

``--client sdk`` is ``zeropilot.client.Client`` (an Idempotency-Key, the answer parsed);
``--client raw`` is ``http.client`` on a kept-alive connection, no key, to see the server's
share alone.

Usage: python bench/submit_cpu.py [--submits 2000] [--clients 4] [--client raw|sdk]
  [--api-workers 2]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.submit_backends import zeropilot_users
from bench.submit_throughput import api_process, bench_database, job_spec
from zeropilot.client import Client

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """Seconds of CPU ``pid`` has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def pids(*argv: str) -> list[int]:
    found = subprocess.run(["pgrep", *argv], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def snapshot(api_parent: int) -> dict[str, dict[int, float]]:
    """CPU seconds so far of each process, by role (the client: this process)."""
    workers = pids("-P", str(api_parent)) or [api_parent]  # one worker: uvicorn serves itself
    return {
        "api": {pid: process_cpu(pid) for pid in workers},
        "postgres": {pid: process_cpu(pid) for pid in pids("-x", "postgres")},
        "redis": {pid: process_cpu(pid) for pid in pids("-x", "redis-server")},
        "client": {0: own_cpu()},
    }


def used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two snapshots by the processes alive at the second: one that exited
    in between (a PostgreSQL backend) is left out rather than counted negative."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def submitter(kind: str, url: str, token: str) -> Callable[[int], None]:
    """One client per thread, kept alive."""
    local = threading.local()
    host, port = url.split("//")[1].split(":")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def sdk(index: int) -> None:
        if not hasattr(local, "client"):
            local.client = Client(url, token, timeout=60)
        local.client.submit(job_spec(f"cpu-{index}"), tries=1)

    def raw(index: int) -> None:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection(host, int(port), timeout=60)
        body = json.dumps(job_spec(f"cpu-{index}")).encode()
        local.connection.request("POST", "/v1/jobs", body, headers)
        answer = local.connection.getresponse()
        text = answer.read()
        if answer.status != 201:
            raise RuntimeError(f"submit answered {answer.status}: {text[:300]!r}")

    return raw if kind == "raw" else sdk


def run(submit: Callable[[int], None], submits: int, clients: int) -> float:
    """Wall seconds for ``submits`` submits from ``clients`` threads."""
    counter = iter(range(submits))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            submit(index)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--client", choices=["sdk", "raw"], default="raw")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    redis.Redis.from_url(args.redis_url).flushdb()
    with tempfile.TemporaryDirectory(prefix="zp-cpu-") as tmp, bench_database() as database:
        token = zeropilot_users(database)
        with api_process(database, args.redis_url, args.api_workers, Path(tmp)) as url:
            (api_parent,) = pids("-f", "--", f"--port {url.rsplit(':', 1)[1]}")
            submit = submitter(args.client, url, token)
            run(submit, 50, args.clients)  # warm: connections, prepared statements, caches
            before = snapshot(api_parent)
            seconds = run(submit, args.submits, args.clients)
            after = snapshot(api_parent)
    redis.Redis.from_url(args.redis_url).flushdb()
    per_submit = {name: 1000 * used(before[name], after[name]) / args.submits for name in before}
    print(
        f"{args.client} client, {args.clients} clients, {args.api_workers} API workers: "
        f"{args.submits / seconds:.1f} submits/s; CPU ms per submit: "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in per_submit.items())
        + f", total {sum(per_submit.values()):.2f}"
    )


if __name__ == "__main__":
    main()
