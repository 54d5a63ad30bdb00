"""The graceful stop on Kubernetes with a real training process in the pod.

The control plane is real (API server, Job controller, scheduler, garbage collector); the
simulated kubelet (``FakeKubelet.start_container``) runs the pod's container as a process here:
zeropilot's log wrapper (the pods mount a shared volume), DeepSpeed's runner and launch.py as the
pod's command gives them (master address 127.0.0.1: no cluster DNS here) and the one rank of
``examples/train_tiny.py`` they start, with the pod's environment and its ConfigMap and Secret
files. The runtime reports to the API over HTTP (uvicorn in a
thread); the worker's launch, reconcile and stop run in the test. The kubelet stops a deleted
pod as a runtime does: SIGTERM to the container's main process, SIGKILL after the pod's grace.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from sqlmodel import Session, select

from service.api.app import create_app
from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.migrate import upgrade
from service.db.models import Attempt, Checkpoint, Job, MetricPoint
from service.db.session import get_engine
from service.db.transitions import move_job
from service.db.users import create_user, user_by_token
from service.settings import ApiSettings, AuthSettings, DatabaseSettings, Settings
from tests.e2e.stack import free_port
from tests.integration import test_kubernetes_backend as backend_tests
from tests.integration.helpers import tiny_spec
from tests.integration.k8s_control_plane import ControlPlane
from tests.integration.k8s_kubelet import SIGKILL_EXIT, Container, FakeKubelet, kubelet_view
from tests.integration.test_kubernetes_backend import (
    everything,
    k8s_profile,
    shared_volume,
    wait_until,
)
from workers.backends import kubernetes
from workers.backends.base import BackendState
from workers.launch import launch_attempt
from workers.reconcile import cancel_attempt, reconcile_attempt, send_stop

pytestmark = pytest.mark.slow
# The backend tests' fixtures: the session's control plane and kubelet, a namespace per test.
plane, api, kubelet, ns = (
    backend_tests.plane,
    backend_tests.api,
    backend_tests.kubelet,
    backend_tests.ns,
)

STOPPED_EXIT = 75  # zeropilot.runtime.STOPPED_EXIT_CODE
GRACE_S = 4
STEPS = 60  # the first attempt is stopped after a few (5 here); the resumed one runs the rest
LONG = 100_000  # a run that ignores SIGTERM must still be running when its grace ends
PLAN = {
    "zero_stage": 1,
    "activation_checkpointing": False,
    "ds_config": {
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
        "zero_optimization": {"stage": 1},
        "steps_per_print": 100_000,
    },
}


@pytest.fixture
def cluster(
    api: httpx.Client, ns: str, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Settings]:  # fmt: skip
    """Settings for a Kubernetes profile whose pods mount ``tmp_path`` (the workers' data
    folder lies in it), and the API serving the runtime's reports on a loopback port."""
    claim = shared_volume(api, ns, tmp_path)
    profile = k8s_profile(plane.kubeconfig, namespace=ns, shared_volume_claim=claim,
                          shared_volume_path=str(tmp_path), accelerator="cpu")  # fmt: skip
    profiles = tmp_path / "clusters.yaml"
    fields = profile.model_dump(mode="json", exclude_defaults=True)
    profiles.write_text(yaml.safe_dump({"clusters": [fields]}))
    monkeypatch.setenv("ZEROPILOT_CLUSTERS__PROFILES_FILE", str(profiles))
    database = f"sqlite:///{tmp_path / 'zeropilot.db'}"
    upgrade(database)
    settings = Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=database),
        auth=AuthSettings(secret_key="test-secret-key"),
        api=ApiSettings(port=free_port()),
    )
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=settings.api.port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started)
    yield settings
    server.should_exit = True
    thread.join(timeout=10)
    api.delete(f"/api/v1/persistentvolumes/{ns}-shared")


def submitted(
    settings: Settings, *args: str, grace_s: int = GRACE_S, steps: int = STEPS
) -> tuple[str, str]:
    """A one-rank tiny job for the Kubernetes profile, admitted (as the API does)."""
    spec = tiny_spec(
        "tiny-k8s-stop",
        image="registry.example/train:1",
        resources={"cluster": "gpu-k8s", "nodes": 1, "gpus_per_node": 1},
        checkpoint={"grace_s": grace_s},
    )
    spec["args"] = ["--steps", str(steps), "--checkpoint-interval", "100000", *args]
    spec["training"]["global_batch_size"] = 4
    with Session(get_engine(settings.database_url)) as session:
        user = user_by_token(session, create_user(session, "alice", "vision"))
        assert user is not None
        job, _created = job_store.create_job(
            session, spec=JobSpec.model_validate(spec), plan=PLAN, advice_reason="test",
            user=user, backend="kubernetes", idempotency_key=None,
        )  # fmt: skip
        assert admit_pending(session, settings.cluster_profiles())
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None
        session.commit()
        return job.id, attempt.id


def launched(settings: Settings, kubelet: FakeKubelet, ns: str, attempt_id: str) -> Container:
    """The worker launches the attempt; the kubelet starts its pod's container for real: the
    log wrapper and DeepSpeed's launcher as the pod's command says, which start the rank."""
    launch_attempt(settings, attempt_id)
    attempt = row(settings, Attempt, attempt_id)
    (pod,) = kubelet.wait_for_pods(ns, attempt.backend_name, 1)
    argv, _env = kubelet_view(kubelet.pod(ns, pod))
    launcher = [sys.executable, *argv[argv.index("-m") :]]  # the image's python3: this one
    # Pod 0's DNS name (the headless Service's record) resolves only inside a cluster.
    launcher[launcher.index("--master_addr") + 1] = "127.0.0.1"
    return kubelet.start_container(ns, pod, launcher)


def row(settings: Settings, kind: type[Any], key: str) -> Any:
    with Session(get_engine(settings.database_url), expire_on_commit=False) as session:
        found = session.get(kind, key)
        assert found is not None
        return found


def steps_of(settings: Settings, attempt_id: str) -> list[int]:
    with Session(get_engine(settings.database_url)) as session:
        query = select(MetricPoint.step).where(MetricPoint.attempt_id == attempt_id)
        return sorted(session.exec(query).all())


def checkpoints_of(settings: Settings, job_id: str) -> list[Checkpoint]:
    with Session(get_engine(settings.database_url), expire_on_commit=False) as session:
        return list(session.exec(select(Checkpoint).where(Checkpoint.job_id == job_id)).all())


def reconciled_until_ended(settings: Settings, attempt_id: str, timeout_s: float = 60) -> Attempt:
    """Reconcile passes (each sends the stop again) until the attempt has ended."""

    def ended() -> Attempt | None:
        reconcile_attempt(settings, attempt_id)
        attempt: Attempt = row(settings, Attempt, attempt_id)
        return attempt if AttemptStatus(attempt.status).terminal else None

    found: Attempt = wait_until(ended, timeout_s)
    return found


def running_with_steps(settings: Settings, attempt_id: str, container: Container) -> None:
    reconcile_attempt(settings, attempt_id)  # RUNNING
    # Its first step (the runtime sends the first point at once, later ones once a second).
    wait_until(lambda: steps_of(settings, attempt_id) or container.exit_code, 120)
    assert container.exit_code is None, container.process.args


def test_a_preempted_pod_saves_its_step_and_the_next_attempt_resumes_from_it(
    cluster: Settings, kubelet: FakeKubelet, ns: str
) -> None:
    settings = cluster
    kubelet.hold_stopped_s = 2.0  # as a real kubelet: the stopped pod goes after a while
    job_id, first_id = submitted(settings)
    first_run = launched(settings, kubelet, ns, first_id)
    running_with_steps(settings, first_id, first_run)
    with Session(get_engine(settings.database_url)) as session:  # what choose_stops marks
        job = session.get(Job, job_id)
        attempt = session.get(Attempt, first_id)
        assert job is not None and attempt is not None
        job.stopping_for = "preemptor0000001"
        session.add(job)
        session.commit()
        started = time.monotonic()
        send_stop(session, settings, job, attempt)  # the victim's stop, as _stop_victim sends it
        session.commit()

    stopped = reconciled_until_ended(settings, first_id)
    took_s = time.monotonic() - started
    job = row(settings, Job, job_id)
    (saved,) = checkpoints_of(settings, job_id)
    reached = max(steps_of(settings, first_id))

    assert first_run.exit_code == STOPPED_EXIT
    assert first_run.term_sent_at is not None and first_run.killed_at is None
    assert took_s < GRACE_S  # it saved and exited within its grace, no SIGKILL needed
    assert (stopped.status, stopped.failure_class) == (
        AttemptStatus.PREEMPTED, FailureClass.PREEMPTED,
    )  # fmt: skip
    assert stopped.exit_code == STOPPED_EXIT
    assert "preempted by job preemptor0000001: stopped after saving" in stopped.failure_message
    assert saved.step == reached  # the step it reached, not an earlier interval
    assert Path(saved.path).name == f"global_step{saved.step}"
    node_log = settings.attempts_dir / stopped.backend_name / "node-0.log"
    assert f"step {reached} loss" in node_log.read_text()  # the tee wrote the log and passed on
    wait_until(lambda: everything(kubelet.api, ns) == [[]] * 4)  # the stopped Job is deleted
    assert (job.status, job.current_attempt, job.preempted_by) == (
        JobStatus.PENDING, 2, ["preemptor0000001"],
    )  # fmt: skip

    with Session(get_engine(settings.database_url)) as session:  # back in line, admitted again
        assert admit_pending(session, settings.cluster_profiles())
        second = job_store.current_attempt(session, row(settings, Job, job_id))
        assert second is not None
        second_id = second.id
        session.commit()
    second_run = launched(settings, kubelet, ns, second_id)
    resumed = row(settings, Attempt, second_id)
    pod = kubelet.wait_for_pods(ns, resumed.backend_name, 1)[0]
    _argv, env = kubelet_view(kubelet.pod(ns, pod))
    reconcile_attempt(settings, second_id)
    wait_until(lambda: second_run.exit_code is not None, 180)
    finished = reconciled_until_ended(settings, second_id)
    done = row(settings, Job, job_id)

    assert env["ZEROPILOT_RESUME_FROM"] == saved.path
    assert resumed.rung == "resume after preemption (by job preemptor0000001)"
    assert (finished.status, finished.exit_code, done.status) == (
        AttemptStatus.SUCCEEDED, 0, JobStatus.SUCCEEDED,
    )  # fmt: skip
    assert min(steps_of(settings, second_id)) == saved.step + 1  # on from the saved step
    assert max(steps_of(settings, second_id)) == STEPS


def test_a_cancelled_pod_saves_and_the_cancel_says_so(
    cluster: Settings, kubelet: FakeKubelet, ns: str
) -> None:
    settings = cluster
    kubelet.hold_stopped_s = 2.0
    job_id, attempt_id = submitted(settings)
    run = launched(settings, kubelet, ns, attempt_id)
    running_with_steps(settings, attempt_id, run)
    with Session(get_engine(settings.database_url)) as session:  # what POST .../cancel does
        job = session.get(Job, job_id)
        assert job is not None
        move_job(session, job, JobStatus.active(), JobStatus.CANCELLED, "cancelled by alice")
        session.commit()

    cancel_attempt(settings, attempt_id)
    attempt = reconciled_until_ended(settings, attempt_id)
    (saved,) = checkpoints_of(settings, job_id)

    assert run.exit_code == STOPPED_EXIT
    assert (attempt.status, attempt.exit_code) == (AttemptStatus.CANCELLED, STOPPED_EXIT)
    reason = attempt.failure_message or ""
    assert f"stopped on request at step {saved.step} after saving {saved.path}" in reason, reason
    assert saved.step == max(steps_of(settings, attempt_id))


def test_a_pod_that_ignores_sigterm_is_killed_after_its_grace(
    cluster: Settings, kubelet: FakeKubelet, ns: str
) -> None:
    settings = cluster
    job_id, attempt_id = submitted(settings, "--ignore-sigterm", grace_s=3, steps=LONG)
    run = launched(settings, kubelet, ns, attempt_id)
    running_with_steps(settings, attempt_id, run)
    with Session(get_engine(settings.database_url)) as session:
        job = session.get(Job, job_id)
        assert job is not None
        move_job(session, job, JobStatus.active(), JobStatus.CANCELLED, "cancelled by alice")
        session.commit()

    cancel_attempt(settings, attempt_id)
    attempt = reconciled_until_ended(settings, attempt_id)

    assert run.term_sent_at is not None and run.killed_at is not None
    killed_after_s = run.killed_at - run.term_sent_at
    assert 3.0 <= killed_after_s < 3.0 + 1.0  # the grace, then SIGKILL at the kubelet's next look
    assert run.exit_code == SIGKILL_EXIT
    assert attempt.status == AttemptStatus.CANCELLED
    assert checkpoints_of(settings, job_id) == []


def test_the_stops_grace_holds_when_longer_than_the_pods_own(
    cluster: Settings, kubelet: FakeKubelet, ns: str
) -> None:
    settings = cluster
    kubelet.hold_stopped_s = 2.0  # as a real kubelet: the stopped pod goes after a while
    # The pod spec says 2 s; the stop below chooses 5.
    _job_id, attempt_id = submitted(settings, "--ignore-sigterm", grace_s=2, steps=LONG)
    run = launched(settings, kubelet, ns, attempt_id)
    running_with_steps(settings, attempt_id, run)
    attempt = row(settings, Attempt, attempt_id)
    profile = settings.cluster_profiles()["gpu-k8s"]
    (pod,) = kubelet.pods(ns, attempt.backend_name)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 2

    kubernetes.cancel(profile, attempt.backend_ref, 5.0)  # a grace sized from measured saves
    kubernetes.cancel(profile, attempt.backend_ref, 5.0)  # the next pass sends it again
    wait_until(lambda: run.exit_code is not None, 30)
    status = wait_until(
        lambda: (s := kubernetes.poll(profile, attempt.backend_ref)).state.terminal and s
    )

    assert run.term_sent_at is not None and run.killed_at is not None
    assert 5.0 <= run.killed_at - run.term_sent_at < 6.0
    assert (run.exit_code, status.state, status.exit_code) == (
        SIGKILL_EXIT, BackendState.CANCELLED, SIGKILL_EXIT,
    )  # fmt: skip
    assert "stopped by zeropilot with a 5 s grace" in status.reason
