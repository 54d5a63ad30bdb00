"""Set-up for bench/submit_throughput.py: users and a backlog in zeropilot, a Slurm controller."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlmodel import Session, SQLModel, select

from service.core.advisor import advise
from service.core.clusters import LOCAL_PROFILE
from service.core.spec import JobSpec
from service.db.admission import admit_pending
from service.db.jobs import backend_name, spec_digest
from service.db.migrate import upgrade
from service.db.models import Attempt, Job, JobEvent, Team, User, new_id
from service.db.session import get_engine
from service.db.users import create_user

REPO = Path(__file__).resolve().parents[1]
BATCH = 1000  # backlog jobs per transaction


def zeropilot_users(database_url: str, quota: int | None = None) -> str:
    """Migrate the database; create the measured team's user (its team's GPU quota ``quota``)
    and return its token."""
    upgrade(database_url)
    with Session(get_engine(database_url)) as session:
        token = create_user(session, "bench", "bench")
        create_user(session, "backlog", "backlog")
        team = session.exec(select(Team).where(Team.name == "bench")).one()
        team.gpu_quota = quota
        session.add(team)
        session.commit()
    return token


def fill_zeropilot_backlog(database_url: str, jobs: int) -> None:
    """``jobs`` jobs of team backlog that stay PENDING: its quota is 2 GPUs, and the first of
    its jobs, admitted, holds them. The rest are written as the submit writes them (job,
    attempt 1, events), in batches: through HTTP they would take most of the run."""
    spec = JobSpec.model_validate(_spec("backlog"))
    plan = advise(spec, LOCAL_PROFILE).plan.model_dump(mode="json")
    with Session(get_engine(database_url)) as session:
        user = session.exec(select(User).where(User.name == "backlog")).one()
        team = session.exec(select(Team).where(Team.name == "backlog")).one()
        team.gpu_quota = 2
        session.add(team)
        for start in range(0, jobs, BATCH):
            batch = [_job(spec, plan, user) for _ in range(start, min(jobs, start + BATCH))]
            session.add_all(batch)
            session.flush()  # jobs before the rows that refer to them
            session.add_all(record for job in batch for record in _first_records(job))
            if start == 0:
                admit_pending(session, {LOCAL_PROFILE.name: LOCAL_PROFILE})
            session.commit()


def _job(spec: JobSpec, plan: dict[str, Any], user: User) -> Job:
    return Job(
        name=spec.name, team_id=user.team_id, user_id=user.id or 0, cluster="local",
        gpus=spec.resources.world_size, spec=spec.model_dump(mode="json"), plan=plan,
        spec_digest=spec_digest(spec), current_attempt=1,
    )  # fmt: skip


def _first_records(job: Job) -> Iterator[SQLModel]:
    yield JobEvent(job_id=job.id, subject="job", to_status=job.status, reason="submitted")
    yield Attempt(
        id=new_id(), job_id=job.id, number=1, plan=job.plan, rung="advisor", backend="local",
        backend_name=backend_name(job.name, job.id, 1),
    )  # fmt: skip
    yield JobEvent(
        job_id=job.id, subject="attempt", attempt_number=1, to_status="QUEUED",
        reason="attempt 1 planned (advisor)",
    )  # fmt: skip


def _spec(name: str) -> dict[str, object]:
    return {
        "name": name,
        "entrypoint": "train_tiny.py",
        "working_dir": str(REPO / "examples"),
        "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
        "training": {"sequence_length": 32, "global_batch_size": 8, "precision": "fp32"},
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
    }


SLURM_PORTS = (6917, 6918)  # not the shared test cluster's 6817/6818


@contextmanager
def start_slurmctld(folder: Path, max_jobs: int = 100_000) -> Iterator[Path]:
    """A slurmctld of its own (the recipe's slurm.conf, other ports, a higher MaxJobCount)."""
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "log", "run", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text(_slurm_conf(folder, max_jobs))
    (folder / "cgroup.conf").write_text((REPO / "deploy/slurm/cgroup.conf").read_text())
    with _munge():
        subprocess.run(["slurmctld", "-f", str(conf), "-c"], check=True)
        try:
            _wait_for_controller(conf)
            yield conf
        finally:
            _stop(folder / "run" / "slurmctld.pid")


def _stop(pid_file: Path) -> None:
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):  # it saves the state of every job first
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)


def _slurm_conf(folder: Path, max_jobs: int) -> str:
    host = socket.gethostname().split(".")[0]
    template = (REPO / "deploy/slurm/slurm.conf.in").read_text()
    text = (
        template.replace("@DIR@", str(folder))
        .replace("@CTLD_HOST@", host)
        .replace("@CTLD_ADDR@", "127.0.0.1")
        .replace("SlurmctldPort=6817", f"SlurmctldPort={SLURM_PORTS[0]}")
        .replace("SlurmdPort=6818", f"SlurmdPort={SLURM_PORTS[1]}")
        .replace("%n", "bench")
    )
    cpus = os.cpu_count() or 1
    return (
        text
        + f"MaxJobCount={max_jobs}\n"
        + f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN\n"
        + "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
    )


@contextmanager
def _munge() -> Iterator[None]:
    """munged, as the recipe starts it; stopped afterwards only if started here."""
    if not ensure_munged():
        yield
        return
    try:
        yield
    finally:
        pid = int(Path("/run/munge/munged.pid").read_text())
        os.kill(pid, signal.SIGTERM)


def ensure_munged() -> bool:
    """Start munged unless one answers (another session's may stop); True if started here."""
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return False
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create", "--force"], check=True)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["munged", "--force"], check=True)
    return True


def _wait_for_controller(conf: Path) -> None:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for _ in range(100):
        if subprocess.run(["squeue", "-h"], env=env, capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"slurmctld did not answer; see {conf.parent / 'log'}")
