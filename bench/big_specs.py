"""Reads beside another team's big specs: admission, /v1/teams, the queue and job lists.

One team's waiting jobs must not slow every other team's reads. The API is started as
``bench/submit_throughput.py`` starts it (a fresh PostgreSQL database, Redis DB 14 unless given,
uvicorn with ``--api-workers``). Teams: ``small`` (one job admitted, holding its 2-GPU quota,
and two waiting), ``big`` (2-GPU quota, held by one tiny job) and an admin in ``ops``. Each read
is timed ``--repeats`` times on a kept-alive connection, first with nothing else waiting, then
after ``--big-jobs`` jobs of team ``big`` whose specs are ``--spec-kib`` KiB each (an inline
Hugging Face config with a large ``id2label``, as a classifier's config.json has) were
submitted over HTTP and wait. The admission pass is ``service.db.admission.admit_pending``, what
the workers' reconcile runs every few seconds, run in this process on its own connection and
committed. API memory: the workers' resident set now and at its peak (``VmRSS``, ``VmHWM``).

Usage: python bench/big_specs.py [--big-jobs 60] [--spec-kib 1000] [--repeats 10]
  [--api-workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis
from sqlmodel import Session, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.submit_cpu import pids
from bench.submit_throughput import api_process, bench_database, job_spec
from service.core.clusters import LOCAL_PROFILE
from service.db.admission import admit_pending
from service.db.migrate import upgrade
from service.db.models import Team
from service.db.session import get_engine
from service.db.users import create_user

# Each team's quota is 2 GPUs and each tiny job takes 2: the first runs, the rest wait.
SMALL_JOBS = [("s-runs", "small", "QUEUED"), ("s-waits-1", "small", "PENDING"),
              ("s-waits-2", "small", "PENDING"), ("b-runs", "big", "QUEUED")]  # fmt: skip
LABEL_BYTES = 46  # one `"12345": "<32 hex>", ` entry of id2label, about


def big_spec(name: str, kib: int) -> dict[str, Any]:
    """The tiny job described by a GPT-2 config.json that carries ``kib`` KiB of labels."""
    labels = {str(i): secrets.token_hex(16) for i in range(kib * 1024 // LABEL_BYTES)}
    config = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
              "vocab_size": 128, "n_positions": 64, "id2label": labels}  # fmt: skip
    return {**job_spec(name), "model": {"hf_config": config}}


def users(database_url: str) -> dict[str, str]:
    """Tokens of small's and big's members and of the admin; both teams get a 2-GPU quota."""
    upgrade(database_url)
    with Session(get_engine(database_url)) as session:
        tokens = {name: create_user(session, name, name) for name in ("small", "big")}
        tokens["admin"] = create_user(session, "admin", "ops", is_admin=True)
        for team in session.exec(select(Team).where(Team.name != "ops")).all():
            team.gpu_quota = 2
            session.add(team)
        session.commit()
    return tokens


def submit(client: httpx.Client, token: str, spec: dict[str, Any], expect: str) -> None:
    answer = client.post("/v1/jobs", content=json.dumps(spec), headers=_auth(token))
    if answer.status_code != 201 or answer.json()["status"] != expect:
        raise RuntimeError(f"submit answered {answer.status_code}: {answer.text[:300]}")


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def reads(client: httpx.Client, tokens: dict[str, str]) -> dict[str, Callable[[], object]]:
    def get(path: str, who: str, **params: str) -> Callable[[], object]:
        def read() -> object:
            answer = client.get(path, params=params, headers=_auth(tokens[who]))
            answer.raise_for_status()
            return answer.content

        return read

    return {
        "GET /v1/teams (small's member)": get("/v1/teams", "small"),
        "GET /v1/teams (admin, every team)": get("/v1/teams", "admin"),
        "GET /console/api/queue (small's member)": get("/console/api/queue", "small"),
        "GET /console/api/queue (admin)": get("/console/api/queue", "admin"),
        "GET /v1/jobs (small's member)": get("/v1/jobs", "small"),
        "GET /v1/jobs?team=big (admin)": get("/v1/jobs", "admin", team="big"),
    }


def admission_pass(database_url: str) -> Callable[[], object]:
    engine = get_engine(database_url)
    profiles = {LOCAL_PROFILE.name: LOCAL_PROFILE}

    def run() -> object:
        with Session(engine) as session:
            launches = admit_pending(session, profiles)
            session.commit()
        return launches

    return run


def timed(read: Callable[[], object], repeats: int) -> list[float]:
    read()  # warm: this worker's connection, caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    return times


def api_memory_mib(api_parent: int) -> tuple[float, float]:
    """The API workers' resident set now and at its peak, summed, in MiB."""
    now = peak = 0
    for pid in pids("-P", str(api_parent)) or [api_parent]:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        fields = {line.split(":")[0]: line.split()[1] for line in status if line[:2] == "Vm"}
        now, peak = now + int(fields["VmRSS"]), peak + int(fields["VmHWM"])
    return now / 1024, peak / 1024


def measure(label: str, checks: dict[str, Callable[[], object]], repeats: int) -> None:
    print(f"\n{label}   (load average {' '.join(f'{v:.2f}' for v in os.getloadavg())})")
    print(f"{'read':<42} {'median ms':>10} {'max ms':>8}")
    for name, read in checks.items():
        times = timed(read, repeats)
        print(f"{name:<42} {statistics.median(times) * 1000:>10.1f} {max(times) * 1000:>8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big-jobs", type=int, default=60, help="team big's waiting jobs")
    parser.add_argument("--spec-kib", type=int, default=1000, help="size of each one's spec")
    parser.add_argument("--repeats", type=int, default=10, help="timed reads of each kind")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()
    redis.Redis.from_url(args.redis_url).flushdb()
    with tempfile.TemporaryDirectory(prefix="zp-big-") as tmp, bench_database() as database:
        tokens = users(database)
        with (
            api_process(database, args.redis_url, args.api_workers, Path(tmp)) as url,
            httpx.Client(base_url=url, timeout=120) as client,
        ):
            (api_parent,) = pids("-f", "--", f"--port {url.rsplit(':', 1)[1]}")
            for name, team, expect in SMALL_JOBS:
                submit(client, tokens[team], job_spec(name), expect)
            checks = {"admission pass (admit_pending)": admission_pass(database)}
            checks |= reads(client, tokens)
            measure("nothing else waiting", checks, args.repeats)
            before = api_memory_mib(api_parent)
            started = time.perf_counter()
            spec = big_spec("b-big", args.spec_kib)
            for _ in range(args.big_jobs):
                submit(client, tokens["big"], spec, "PENDING")
            size = len(json.dumps(spec)) / 1024
            print(f"\n{args.big_jobs} jobs of team big waiting, {size:.0f} KiB of spec each, "
                  f"submitted in {time.perf_counter() - started:.1f} s")  # fmt: skip
            after_submits = api_memory_mib(api_parent)
            measure(f"beside {args.big_jobs} waiting big specs", checks, args.repeats)
            after = api_memory_mib(api_parent)
    redis.Redis.from_url(args.redis_url).flushdb()
    print("\nAPI workers' memory, MiB (resident, peak): " + "; ".join(
        f"{when} {now:.0f}, {peak:.0f}" for when, (now, peak) in
        [("before the big specs", before), ("after their submits", after_submits),
         ("after the reads beside them", after)]))  # fmt: skip


if __name__ == "__main__":
    main()
