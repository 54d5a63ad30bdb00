"""Cluster calls and duration of one reconcile pass at 100, 1,000 and 10,000 active attempts:
the batched pass (``workers.reconcile.reconcile``: one ``poll_many`` per cluster, one query for
the attempts, a session only for those that changed) side by side with the per-attempt pass it
replaced (``reconcile_attempt`` for each attempt: its own session and its own ``poll``).

Kubernetes: the tests' control plane (real etcd, API server, Job controller and scheduler,
tests/integration/k8s_control_plane.py), N Jobs as zeropilot renders them, suspended as a
Kueue queue holds them (no pods: no kubelet needed). Slurm: a slurmctld of its own with the
recipe's slurm.conf (bench/submit_backends.py), N jobs submitted with ``sbatch --hold``. The
zeropilot database (PostgreSQL) holds N attempts LAUNCHING with those references. Each pass is
run once to record every attempt's pending reason, then measured: a steady pass, what a worker
runs every few seconds while nothing changes.

    PYTHONPATH=. python bench/reconcile_scale.py kubernetes --sizes 100 1000 10000
    PYTHONPATH=. python bench/reconcile_scale.py slurm --sizes 100 1000 10000
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from sqlmodel import Session, select

from bench.submit_backends import start_slurmctld
from service.core.clusters import ClusterProfile
from service.core.states import AttemptStatus, JobStatus
from service.db.migrate import upgrade
from service.db.models import Attempt, Job, User, new_id
from service.db.session import get_engine
from service.db.users import create_user
from service.settings import AuthSettings, DatabaseSettings, Settings
from workers.backends import kubernetes, kubernetes_watch
from workers.backends.base import LaunchRequest
from workers.backends.calls import calls_sent
from workers.backends.kubernetes_render import render_job
from workers.reconcile import reconcile, reconcile_attempt
from workers.watched import active_attempts

POSTGRES_ADMIN = os.environ.get(
    "ZEROPILOT_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"
)
CLUSTER = "bench"
BATCH = 1000


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    name = f"zp_bench_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        get_engine(url).dispose()
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settings_for(url: str, folder: Path, profile: ClusterProfile) -> Settings:
    profiles = folder / "clusters.yaml"
    fields = profile.model_dump(mode="json", exclude_defaults=True)
    profiles.write_text(json.dumps({"clusters": [fields]}))  # YAML reads JSON
    os.environ["ZEROPILOT_CLUSTERS__PROFILES_FILE"] = str(profiles)
    return Settings(
        data_dir=folder / "data",
        db=DatabaseSettings(url=url),
        auth=AuthSettings(secret_key="bench-secret-key"),
    )


def store_attempts(url: str, refs: list[str], kind: str) -> None:
    """One LAUNCHING job and attempt per ref, written in batches as plain rows."""
    with Session(get_engine(url)) as session:
        create_user(session, "bench", "bench")
        user = session.exec(select(User).where(User.name == "bench")).one()
        for start in range(0, len(refs), BATCH):
            batch = refs[start : start + BATCH]
            jobs = [
                Job(name="bench", team_id=user.team_id, user_id=user.id or 0, cluster=CLUSTER,
                    gpus=1, spec=SPEC, plan={}, spec_digest="bench", current_attempt=1,
                    status=JobStatus.LAUNCHING)
                for _ in batch
            ]  # fmt: skip
            session.add_all(jobs)
            session.flush()  # the jobs before the attempts that refer to them
            session.add_all(
                Attempt(id=new_id(), job_id=job.id, number=1, plan={}, rung="advisor",
                        backend=kind, backend_name=f"bench-{new_id()}", backend_ref=ref,
                        status=AttemptStatus.LAUNCHING)
                for job, ref in zip(jobs, batch, strict=True)
            )  # fmt: skip
            session.commit()


SPEC: dict[str, Any] = {
    "name": "bench",
    "entrypoint": "train.py",
    "model": {"parameters": 1000000},
    "training": {"sequence_length": 32, "global_batch_size": 8},
    "resources": {"cluster": CLUSTER, "nodes": 1, "gpus_per_node": 1},
}


def measured(kind: str, run: Callable[[], None]) -> tuple[int, float]:
    before, began = calls_sent(kind), time.perf_counter()
    run()
    return calls_sent(kind) - before, time.perf_counter() - began


def per_attempt_pass(settings: Settings) -> None:
    """The pass before: every attempt polled alone, in its own session."""
    for watched in active_attempts(settings):
        reconcile_attempt(settings, watched.attempt_id)


def compare(
    kind: str, settings: Settings, size: int, alone_up_to: int, end: Callable[[int], None]
) -> dict[str, Any]:
    first_s = measured(kind, lambda: reconcile(settings))[1]  # records every pending reason
    batched_calls, batched_s = measured(kind, lambda: reconcile(settings))
    row: dict[str, Any] = {
        "backend": kind, "attempts": size, "first_pass_s": round(first_s, 3),
        "batched_calls": batched_calls, "batched_s": round(batched_s, 3),
    }  # fmt: skip
    if size <= alone_up_to:
        alone_calls, alone_s = measured(kind, lambda: per_attempt_pass(settings))
        row |= {"alone_calls": alone_calls, "alone_s": round(alone_s, 3)}
    # A few attempts end on the cluster; the next pass records them. A worker's beat starts it
    # at most one interval after the change: the change reaches the database within an
    # interval plus this pass.
    end(ENDED)
    ended_s = measured(kind, lambda: reconcile(settings))[1]
    row |= {
        "ended": ENDED,
        "recorded": recorded_ends(settings, size),
        "ended_pass_s": round(ended_s, 3),
    }
    return row


ENDED = 10  # attempts that end on the cluster before the measured pass


def recorded_ends(settings: Settings, size: int) -> int:
    """How many attempts the pass saw end (no longer active in the database)."""
    return size - len(active_attempts(settings))


# ---- Kubernetes ----


def kubernetes_rows(sizes: list[int], alone_up_to: int, folder: Path) -> Iterator[dict[str, Any]]:
    from tests.integration.k8s_control_plane import ControlPlane, find_binaries

    plane = ControlPlane(find_binaries(), folder / "plane")
    plane.start()
    try:
        assert plane.api is not None
        for size in sizes:
            namespace = f"bench-{size}"
            plane.api.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
            profile = ClusterProfile.model_validate({
                "name": CLUSTER, "kind": "kubernetes", "accelerator": "nvidia-h100-80gb",
                "gpu_memory_gib": 80, "gpus_per_node": 8, "cpu_memory_gib": 64,
                "max_nodes": 4, "kubeconfig": str(plane.kubeconfig), "namespace": namespace,
                "queue": "bench",  # suspended until Kueue admits it: no pods
            })  # fmt: skip
            refs = create_jobs(plane.api, profile, folder, size)

            gone = iter(refs)

            def delete(count: int, api: Any = plane.api, gone: Iterator[str] = gone) -> None:
                for ref in itertools.islice(gone, count):  # gone: LOST, "deleted outside"
                    namespace, name = kubernetes.decode_ref(ref)
                    api.delete(f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")

            with fresh_database() as url:
                store_attempts(url, refs, "kubernetes")
                listing = profile.model_copy(update={"watch": False})
                row = compare("kubernetes", settings_for(url, folder, listing), size,
                              alone_up_to, delete)  # fmt: skip
                watching = settings_for(url, folder, profile)
                yield row | watched(watching, size - ENDED, delete)
            kubernetes_watch.stop_all()
    finally:
        plane.stop()


def watched(settings: Settings, active: int, end: Callable[[int], None]) -> dict[str, Any]:
    """The same passes reading the worker's watched copies (``kubernetes_watch``): the first
    starts them with a LIST each; a steady one; then the one after ``ENDED`` Jobs are deleted,
    once the copies have seen it (how long that took is ``seen_s``)."""
    rss_before = rss_mib()
    first_s = measured("kubernetes", lambda: reconcile(settings))[1]
    copies_mib = rss_mib() - rss_before
    calls, steady_s = measured("kubernetes", lambda: reconcile(settings))
    end(ENDED)
    deleted = time.perf_counter()
    while sum(len(m.items() or ()) for m in kubernetes_watch.mirrors() if "Jobs" in m.feed.what) > (
        active - ENDED
    ):
        time.sleep(0.001)
    seen_s = time.perf_counter() - deleted
    ended_s = measured("kubernetes", lambda: reconcile(settings))[1]
    return {
        "watched_first_pass_s": round(first_s, 3), "watched_calls": calls,
        "watched_s": round(steady_s, 3), "watched_seen_s": round(seen_s, 4),
        "watched_recorded": active - len(active_attempts(settings)),
        "watched_ended_pass_s": round(ended_s, 3), "copies_mib": round(copies_mib),
    }  # fmt: skip


def rss_mib() -> float:
    """This process's resident memory, for what the copies hold."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def create_jobs(api: Any, profile: ClusterProfile, folder: Path, size: int) -> list[str]:
    """``size`` Jobs as ``submit`` renders them (the Job alone: poll reads nothing else)."""
    namespace = str(profile.namespace)

    def create(index: int) -> str:
        name = f"zp-bench-{index}-a1"
        request = LaunchRequest(
            name=name, attempt_dir=folder / name, nodes=1, procs_per_node=1,
            entrypoint="train.py", args=(), ds_config_path=folder / "ds_config.json", env={},
            working_dir=Path("/workspace"), profile=profile, image="registry.example/train:1",
        )  # fmt: skip
        answer = api.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", json=render_job(request))
        assert answer.status_code == 201, answer.text
        return kubernetes.encode_ref(namespace, name)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(create, range(size)))


# ---- Slurm ----


def slurm_rows(sizes: list[int], alone_up_to: int, folder: Path) -> Iterator[dict[str, Any]]:
    with start_slurmctld(folder / "slurm", max_jobs=max(sizes) * 2 + 100) as conf:
        profile = ClusterProfile.model_validate({
            "name": CLUSTER, "kind": "slurm", "accelerator": "cpu", "gpus_per_node": 2,
            "cpu_memory_gib": 1, "max_nodes": 1, "slurm_conf": str(conf),
        })  # fmt: skip
        for size in sizes:
            refs = held_jobs(conf, folder / f"held-{size}", size)

            def cancel(count: int, conf: Path = conf, refs: list[str] = refs) -> None:
                ids = [ref.split(":", 1)[0] for ref in refs[:count]]  # CANCELLED outside
                subprocess.run(["scancel", *ids], env={**os.environ, "SLURM_CONF": str(conf)},
                               check=True)  # fmt: skip

            try:
                with fresh_database() as url:
                    store_attempts(url, refs, "slurm")
                    settings = settings_for(url, folder, profile)
                    yield compare("slurm", settings, size, alone_up_to, cancel)
            finally:
                env = {**os.environ, "SLURM_CONF": str(conf)}
                subprocess.run(["scancel", "--me", "--quiet"], env=env, check=False)


def held_jobs(conf: Path, folder: Path, size: int) -> list[str]:
    """``size`` jobs that stay PENDING (JobHeldUser), submitted as one array of held jobs would
    be slower to tell apart: one ``sbatch --hold`` each, eight at a time."""
    folder.mkdir(parents=True)
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def submit(index: int) -> str:
        answer = subprocess.run(
            ["sbatch", "--hold", "--parsable", f"--job-name=zp-bench-{index}-a1",
             f"--chdir={folder}", "--output=/dev/null", "--wrap=true"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return f"{answer.stdout.strip().split(';')[0]}:{folder}"

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(submit, range(size)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", choices=["kubernetes", "slurm"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument(
        "--alone-up-to", type=int, default=10_000, help="largest size the per-attempt pass runs at"
    )
    args = parser.parse_args()
    rows = kubernetes_rows if args.backend == "kubernetes" else slurm_rows
    with tempfile.TemporaryDirectory(prefix="zp-reconcile-scale-") as folder:
        for row in rows(args.sizes, args.alone_up_to, Path(folder)):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
