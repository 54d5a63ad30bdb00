"""The standing fault suite: real faults under the whole stack, and every job launched once.

Each scenario runs the API (uvicorn) and Celery workers as processes on PostgreSQL and Redis,
makes a real fault happen (SIGKILL of a worker mid-launch, FLUSHDB of the broker, the database
refusing connections, two API and two worker processes racing), and checks what an operator
would: every accepted submit is exactly one job, it ends SUCCEEDED, and its program ran once.

The program is a tiny script that appends its job id to a launch record, started through a
stand-in for DeepSpeed's launcher (``LAUNCHER``): the faults under test live in the service's
path (API, broker, database, workers, the local backend's supervisor), and 60 DeepSpeed launchers
would take this 2-core machine minutes. ``test_stack.py`` runs the real launcher.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from threading import Lock
from typing import Any

import httpx
import pytest
import redis

from tests.e2e.faults import database_refusing
from tests.e2e.stack import Api, Stack, free_port

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}

ENTRYPOINT = """\
import os

line = f"{os.environ['ZEROPILOT_JOB_ID']} {os.environ['ZEROPILOT_ATTEMPT_ID']}\\n"
record = os.open(os.environ["LAUNCH_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
os.write(record, line.encode())  # one O_APPEND write: concurrent runs never mix their lines
os.close(record)
"""

LAUNCHER = """\
#!{python} -S
# Stands in for `python -m deepspeed.launcher.runner ... ENTRYPOINT ARGS`: runs ENTRYPOINT once.
import os, sys
argv = sys.argv[1:]
start = argv.index("--master_port") + 2
os.execv(sys.executable, [sys.executable, "-S", *argv[start:]])
"""


@dataclass
class Workload:
    """The tiny job: its spec, the interpreter the workers launch it with, its launch record."""

    folder: Path

    @property
    def record(self) -> Path:
        return self.folder / "launches.txt"

    @property
    def launcher(self) -> Path:
        return self.folder / "launcher"

    def spec(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "entrypoint": "append_launch.py",
            "working_dir": str(self.folder),
            "env": {"LAUNCH_RECORD": str(self.record)},
            "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
            "training": {"sequence_length": 32, "global_batch_size": 4, "precision": "fp32"},
            "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 1},
        }

    def launches(self) -> Counter[str]:
        """How many times each job's program ran, by job id."""
        text = self.record.read_text() if self.record.exists() else ""
        return Counter(line.split()[0] for line in text.splitlines())


@pytest.fixture
def workload(tmp_path: Path) -> Workload:
    made = Workload(tmp_path / "workload")
    made.folder.mkdir()
    (made.folder / "append_launch.py").write_text(ENTRYPOINT)
    made.launcher.write_text(LAUNCHER.format(python=sys.executable))
    made.launcher.chmod(0o755)
    return made


def start_worker(stack: Stack, workload: Workload, name: str, **settings: str) -> Any:
    return stack.start_worker(name, python=str(workload.launcher), **settings)


def wait_for_jobs(api: Api, stack: Stack, count: int, statuses: set[str]) -> list[dict[str, Any]]:
    """The team's jobs once ``count`` of them are in ``statuses``; fails with the logs if never."""
    deadline = time.monotonic() + 240  # a guard against a hang, not a measurement
    while True:
        jobs: list[dict[str, Any]] = api.http.get("/v1/jobs", params={"limit": 500}).json()["data"]
        if sum(job["status"] in statuses for job in jobs) >= count:
            return jobs
        if time.monotonic() > deadline:
            seen = Counter(job["status"] for job in jobs)
            raise AssertionError(f"waiting for {count} in {statuses}, have {seen}:\n{stack.logs()}")
        time.sleep(0.5)


def assert_each_launched_once(
    api: Api, stack: Stack, workload: Workload, accepted: list[str]
) -> None:
    """Every accepted submit is one job, SUCCEEDED, whose program ran exactly once."""
    jobs = wait_for_jobs(api, stack, len(accepted), TERMINAL)
    assert sorted(job["id"] for job in jobs) == sorted(accepted)  # none lost, none doubled
    assert {job["id"]: job["status"] for job in jobs} == dict.fromkeys(accepted, "SUCCEEDED")
    assert workload.launches() == Counter(accepted)
    for job_id in accepted:
        job = api.job(job_id)
        assert len(job["attempts"]) == 1
        moves = [e["to_status"] for e in job["events"] if e["subject"] == "job"]
        assert moves[:3] == ["PENDING", "QUEUED", "LAUNCHING"] and moves[-1] == "SUCCEEDED"
        assert moves.count("LAUNCHING") == 1, moves  # RUNNING is seen only if a poll caught it
    started = list((stack.data_dir / "attempts").glob("*/started"))
    assert len(started) == len(accepted)  # one supervisor began each attempt, none began twice


@pytest.mark.parametrize("crash_point", ["before_submit", "after_submit"])
def test_worker_killed_mid_launch_neither_loses_nor_doubles_a_job(
    stack: Stack, api: Api, workload: Workload, crash_point: str
) -> None:
    pause = {f"fault_pause_{crash_point}_s": "60"}  # the worker is stopped right there
    doomed = start_worker(stack, workload, "doomed", **pause)
    accepted = [api.submit(workload.spec(f"kill-{n}"))["id"] for n in range(3)]
    launching = wait_for_jobs(api, stack, 1, {"LAUNCHING"})
    if crash_point == "after_submit":  # its supervisor is running; the worker never recorded it
        job = api.job(next(j["id"] for j in launching if j["status"] == "LAUNCHING"))
        attempt_dir = stack.data_dir / "attempts" / job["attempts"][0]["backend_name"]
        wait_for_path(attempt_dir / "started", stack)
    stack.kill(doomed)
    start_worker(stack, workload, "rescuer")
    assert_each_launched_once(api, stack, workload, accepted)


def wait_for_path(path: Path, stack: Stack) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared:\n{stack.logs()}"
        time.sleep(0.2)


def test_emptied_broker_loses_no_job(
    stack: Stack, api: Api, workload: Workload, redis_url: str
) -> None:
    broker = redis.Redis.from_url(redis_url)
    accepted = [api.submit(workload.spec(f"flush-{n}"))["id"] for n in range(6)]
    assert broker.llen("celery") == len(accepted)  # six launch tasks wait in the broker
    start_worker(stack, workload, "w1", fault_pause_before_submit_s="2")  # tasks pile up
    wait_for_jobs(api, stack, 1, {"LAUNCHING"})
    waiting = broker.llen("celery")
    assert waiting > 0
    broker.flushdb()  # the queued launch tasks and the one being run are gone from the broker
    assert_each_launched_once(api, stack, workload, accepted)


@dataclass
class Answers:
    """Every status code the submitting clients got, and 503s that lacked Retry-After."""

    codes: Counter[int] = field(default_factory=Counter)
    unhinted_503: int = 0
    lost: Counter[str] = field(default_factory=Counter)  # tries without an answer, by error
    lock: Lock = field(default_factory=Lock)

    def record(self, response: httpx.Response) -> None:
        with self.lock:
            self.codes[response.status_code] += 1
            if response.status_code == 503 and "Retry-After" not in response.headers:
                self.unhinted_503 += 1


def submit_until_accepted(
    http: httpx.Client, spec: dict[str, Any], key: str, answers: Answers
) -> str:
    """POST the spec with one Idempotency-Key until it is stored, as the CLI does: again after
    a 503 (once its Retry-After has passed) or a lost connection."""
    for _ in range(20):
        try:
            response = http.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
        except httpx.TransportError as exc:
            with answers.lock:
                answers.lost[type(exc).__name__] += 1
            time.sleep(1)
            continue
        answers.record(response)
        if response.status_code in (200, 201):
            return str(response.json()["id"])
        if response.status_code != 503:
            raise AssertionError(f"{response.status_code}: {response.text}")
        time.sleep(float(response.headers.get("Retry-After", "1")))
    raise AssertionError(f"submit {key} never accepted")


OUTAGE_S = 20


def test_database_outage_answers_503_and_loses_no_submit(
    stack: Stack, api: Api, token: str, workload: Workload, postgres_url: str
) -> None:
    start_worker(stack, workload, "w1")
    answers = Answers()
    auth = {"Authorization": f"Bearer {token}"}
    http = httpx.Client(base_url=stack.url, headers=auth, timeout=30)  # the CLI's timeout

    def client(number: int) -> list[str]:
        accepted = []
        for n in range(5):
            spec = workload.spec(f"outage-{number}-{n}")
            accepted.append(submit_until_accepted(http, spec, f"key-{number}-{n}", answers))
            time.sleep(3)
        return accepted

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client, number) for number in range(6)]
        while sum(answers.codes.values()) < 6:  # the first submits go through before it
            time.sleep(0.1)
        with database_refusing(postgres_url):
            time.sleep(OUTAGE_S)
        accepted = [job_id for future in futures for job_id in future.result()]
    print(
        f"{OUTAGE_S} s outage, 30 submits: answers {dict(answers.codes)}, "
        f"tries without an answer {dict(answers.lost)}"
    )
    assert answers.codes[503] > 0 and answers.unhinted_503 == 0, answers.codes
    assert set(answers.codes) <= {200, 201, 503}, answers.codes  # never a 500
    assert len(set(accepted)) == len(accepted) == 30
    assert_each_launched_once(api, stack, workload, accepted)


def test_two_apis_and_two_workers_launch_each_job_once(
    stack: Stack, token: str, workload: Workload
) -> None:
    urls = [stack.url, stack.start_api(free_port())]
    start_worker(stack, workload, "w1")
    start_worker(stack, workload, "w2")
    clients = [Api(url, token) for url in urls]

    def submit(number: int) -> str:
        return str(clients[number % 2].submit(workload.spec(f"race-{number}"))["id"])

    began = time.monotonic()
    with ThreadPoolExecutor(10) as pool:
        accepted = list(pool.map(submit, range(60)))
    print(f"60 submits from 10 threads to 2 APIs: {time.monotonic() - began:.1f} s")
    assert_each_launched_once(clients[0], stack, workload, accepted)
