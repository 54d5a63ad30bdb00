"""The Kubernetes backend through the official client against a loopback API server.

No real API server can run on this machine, so ``k8s_loopback`` stands in for one (read what it
does and does not do there); the tests play the Job controller and the kubelet with its
controls and check what a user would: the objects a launch creates, what each pod would run,
the state and failure class an attempt ends with, the logs, and that cancel leaves nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlmodel import Session

from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.migrate import upgrade
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.db.users import create_user, user_by_token
from service.settings import AuthSettings, DatabaseSettings, Settings
from tests.integration.helpers import tiny_spec
from tests.integration.k8s_loopback import (
    ApiError,
    LoopbackApiServer,
    kubelet_view,
    loopback_api_server,
)
from workers.backends import get_backend, kubernetes
from workers.backends.base import (
    BackendState,
    LaunchRequest,
    PermanentError,
    TemporaryError,
)
from workers.backends.kubernetes_render import master_port
from workers.launch import launch_attempt
from workers.reconcile import reconcile_attempt

NS = "ml"
NAME = "zp-tiny-gpt-0f3a9c21-a1"
DS_CONFIG = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}
CUDA_OOM_LOG = """\
step 12 loss 2.4410 tokens/s 51234
Traceback (most recent call last):
  File "/workspace/train.py", line 212, in <module>
    engine.backward(loss)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total \
capacity of 79.15 GiB of which 1.02 GiB is free.
"""
UNSCHEDULABLE = (
    "0/6 nodes are available: 2 node(s) had untolerated taint "
    "{node-role.kubernetes.io/control-plane: }, 4 Insufficient nvidia.com/gpu. preemption: 0/6 "
    "nodes are available: 2 Preemption is not helpful for scheduling, 4 No preemption victims "
    "found for incoming pod."
)


@pytest.fixture
def cluster() -> Iterator[LoopbackApiServer]:
    with loopback_api_server() as server:
        yield server


@pytest.fixture
def profile(cluster: LoopbackApiServer, tmp_path: Path) -> ClusterProfile:
    return k8s_profile(cluster.write_kubeconfig(tmp_path / "kubeconfig"))


def k8s_profile(kubeconfig: Path, **changes: Any) -> ClusterProfile:
    fields: dict[str, Any] = {
        "name": "gpu-k8s",
        "kind": "kubernetes",
        "accelerator": "nvidia-h100-80gb",
        "gpu_memory_gib": 80,
        "gpus_per_node": 8,
        "cpu_memory_gib": 512,
        "max_nodes": 4,
        "namespace": NS,
        "kubeconfig": str(kubeconfig),
        "nccl_env": {"NCCL_SOCKET_IFNAME": "eth0"},
        **changes,
    }
    return ClusterProfile.model_validate(fields)


def launch_request(tmp_path: Path, profile: ClusterProfile, **changes: Any) -> LaunchRequest:
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir(exist_ok=True)
    ds_config = attempt_dir / "ds_config.json"
    ds_config.write_text(json.dumps(DS_CONFIG))
    fields: dict[str, Any] = {
        "name": NAME,
        "attempt_dir": attempt_dir,
        "nodes": 2,
        "procs_per_node": 8,
        "entrypoint": "train.py",
        "args": ("--steps", "100"),
        "ds_config_path": ds_config,
        "env": {"ZEROPILOT_ATTEMPT_ID": "a1"},
        "working_dir": Path("/workspace"),
        "profile": profile,
        "image": "registry.example/train:1",
        "time_limit_s": 3600,
        **changes,
    }
    return LaunchRequest(**fields)


def started(cluster: LoopbackApiServer, name: str = NAME) -> list[str]:
    """Play the Job controller and the kubelet: every node's pod created and running."""
    pods = cluster.create_job_pods(NS, name)
    for pod in pods:
        cluster.set_pod_running(NS, pod)
    return pods


def completed(cluster: LoopbackApiServer, name: str = NAME) -> None:
    """Play the Job controller once every index has succeeded."""
    message = "Reached expected number of succeeded pods"
    cluster.set_job_condition(NS, name, "Complete", "CompletionsReached", message)


def failed(cluster: LoopbackApiServer, reason: str, message: str) -> None:
    cluster.set_job_condition(NS, NAME, "Failed", reason, message)


def creates(cluster: LoopbackApiServer) -> int:
    return sum(1 for r in cluster.requests if r.method == "POST")


# ---- submit ----


def test_submit_creates_the_job_its_headless_service_and_its_config_map(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))

    assert ref == f"{NS}/{NAME}"
    assert [cluster.names(kind, NS) for kind in ("jobs", "services", "configmaps")] == [[NAME]] * 3
    job = cluster.read("jobs", NS, NAME)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": job["metadata"]["uid"]}
    config_map = cluster.read("configmaps", NS, NAME)
    assert config_map["metadata"]["ownerReferences"] == [owner]
    assert config_map["data"]["hostfile"] == (f"{NAME}-0.{NAME} slots=8\n{NAME}-1.{NAME} slots=8\n")
    assert json.loads(config_map["data"]["ds_config.json"]) == DS_CONFIG
    service = cluster.read("services", NS, NAME)
    assert service["metadata"]["ownerReferences"] == [owner]
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)


def test_a_profile_without_a_namespace_launches_in_the_workers_own(
    cluster: LoopbackApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "serviceaccount-namespace"  # what the kubelet mounts into the worker's pod
    own.write_text("zeropilot\n")
    monkeypatch.setattr(kubernetes, "SERVICE_ACCOUNT_NAMESPACE", own)
    profile = k8s_profile(cluster.write_kubeconfig(tmp_path / "kubeconfig"), namespace=None)

    ref = kubernetes.submit(launch_request(tmp_path, profile))

    assert ref == f"zeropilot/{NAME}"
    assert cluster.names("jobs", "zeropilot") == [NAME]


def test_each_pod_runs_the_ssh_less_launcher_with_its_own_rank_and_pod_0_as_master(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    evil = ("$(whoami)", "`id`", 'it\'s "quoted"; rm -rf /', "line one\nline two", "$$", "$HOME")
    request = launch_request(
        tmp_path, profile, args=evil, env={"EVIL": "$(JOB_COMPLETION_INDEX) $(whoami)"}
    )
    kubernetes.submit(request)

    pods = cluster.create_job_pods(NS, NAME)

    service = cluster.read("services", NS, NAME)
    for index, pod_name in enumerate(pods):
        pod = cluster.read("pods", NS, pod_name)
        # The pod's DNS name (hostname.subdomain) is the hostfile's line for its rank.
        assert f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}" == f"{NAME}-{index}.{NAME}"
        assert all(
            pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items()
        )
        argv, env = kubelet_view(pod)
        assert argv == [
            "python3", "-m", "deepspeed.launcher.runner", "--no_ssh",
            "--hostfile", "/etc/zeropilot/hostfile",
            "--node_rank", str(index),
            "--master_addr", f"{NAME}-0.{NAME}",
            "--master_port", str(master_port(request)),
            "train.py", *evil,
            "--deepspeed_config", "/etc/zeropilot/ds_config.json",
        ]  # fmt: skip
        assert env["EVIL"] == "$(JOB_COMPLETION_INDEX) $(whoami)"
        assert env["ZEROPILOT_DS_CONFIG"] == "/etc/zeropilot/ds_config.json"
        assert env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_submitting_twice_creates_nothing_new_and_returns_the_same_ref(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    request = launch_request(tmp_path, profile)
    first = kubernetes.submit(request)
    kinds = ("jobs", "services", "configmaps")
    uids = {kind: cluster.read(kind, NS, NAME)["metadata"]["uid"] for kind in kinds}

    again = kubernetes.submit(request)

    assert again == first
    assert {k: cluster.read(k, NS, NAME)["metadata"]["uid"] for k in uids} == uids
    assert cluster.names("jobs", NS) == [NAME]


def test_a_submit_after_a_crash_midway_creates_the_rest(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    def unavailable_once(resource: str, _obj: dict[str, Any]) -> None:
        if resource == "configmaps":
            cluster.admission = None
            raise ApiError(503, "ServiceUnavailable", "etcdserver: leader changed")

    cluster.admission = unavailable_once
    request = launch_request(tmp_path, profile)
    with pytest.raises(TemporaryError, match="leader changed"):
        kubernetes.submit(request)
    assert (cluster.names("jobs", NS), cluster.names("configmaps", NS)) == ([NAME], [])

    ref = kubernetes.submit(request)

    assert ref == f"{NS}/{NAME}"
    job_uid = cluster.read("jobs", NS, NAME)["metadata"]["uid"]
    for kind in ("configmaps", "services"):
        assert cluster.read(kind, NS, NAME)["metadata"]["ownerReferences"][0]["uid"] == job_uid


def test_a_namesake_job_that_zeropilot_did_not_create_is_not_adopted(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    cluster.create(
        "jobs",
        NS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": NAME},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "other", "image": "busybox"}],
                    }
                }
            },
        },
    )

    with pytest.raises(PermanentError, match="was not created for attempt"):
        kubernetes.submit(launch_request(tmp_path, profile))
    assert cluster.names("configmaps", NS) == []


def test_a_quota_rejection_is_a_permanent_error_with_the_servers_words(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    quota = (
        f'jobs.batch "{NAME}" is forbidden: exceeded quota: team-ml, requested: '
        "count/jobs.batch=1, used: count/jobs.batch=10, limited: count/jobs.batch=10"
    )

    def over_quota(resource: str, _obj: dict[str, Any]) -> None:
        raise ApiError(403, "Forbidden", quota)

    cluster.admission = over_quota

    with pytest.raises(PermanentError) as raised:
        kubernetes.submit(launch_request(tmp_path, profile))
    assert quota in str(raised.value)
    assert cluster.names("jobs", NS) == []


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (400, "BadRequest", PermanentError),  # an admission webhook's denial
        (422, "Invalid", PermanentError),
        (429, "TooManyRequests", TemporaryError),
        (500, "InternalError", TemporaryError),
    ],
)
def test_api_errors_carry_intent(
    cluster: LoopbackApiServer,
    profile: ClusterProfile,
    tmp_path: Path,
    code: int,
    reason: str,
    expected: type[Exception],
) -> None:
    message = f'admission webhook "policy.example.org" denied the request: {reason}'

    def reject(resource: str, _obj: dict[str, Any]) -> None:
        raise ApiError(code, reason, message)

    cluster.admission = reject

    with pytest.raises(expected, match="denied the request"):
        kubernetes.submit(launch_request(tmp_path, profile))


def test_an_unreachable_api_server_is_a_temporary_error(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    cluster.stop()

    with pytest.raises(TemporaryError, match="did not answer"):
        kubernetes.submit(launch_request(tmp_path, profile))
    with pytest.raises(TemporaryError):
        kubernetes.poll(profile, f"{NS}/{NAME}")


def test_a_wrong_token_is_refused_for_good(cluster: LoopbackApiServer, tmp_path: Path) -> None:
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kubeconfig.write_text(kubeconfig.read_text().replace("loopback-token", "stale-token"))

    with pytest.raises(PermanentError, match="Unauthorized"):
        kubernetes.submit(launch_request(tmp_path, k8s_profile(kubeconfig)))


def test_a_missing_kubeconfig_is_a_permanent_error(tmp_path: Path) -> None:
    profile = k8s_profile(tmp_path / "no-such-kubeconfig")

    with pytest.raises(PermanentError, match="no usable Kubernetes client configuration"):
        kubernetes.submit(launch_request(tmp_path, profile))


def test_a_job_without_an_image_is_refused_before_any_call(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    with pytest.raises(PermanentError, match="needs an image"):
        kubernetes.submit(launch_request(tmp_path, profile, image=None))
    assert cluster.requests == []


# ---- poll ----


def test_pods_the_scheduler_cannot_place_are_pending_with_its_reason(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = cluster.create_job_pods(NS, NAME)
    cluster.set_pod_running(NS, first)
    cluster.set_pod_unschedulable(NS, second, UNSCHEDULABLE)

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.PENDING, "Unschedulable")
    assert "1 of 2 pods running" in status.reason
    assert "4 Insufficient nvidia.com/gpu" in status.reason


def test_a_job_waiting_in_its_kueue_queue_is_pending_until_admitted(
    cluster: LoopbackApiServer, tmp_path: Path
) -> None:
    profile = k8s_profile(cluster.write_kubeconfig(tmp_path / "kubeconfig"), queue="team-ml")
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    job = cluster.read("jobs", NS, NAME)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"

    waiting = kubernetes.poll(profile, ref)
    cluster.unsuspend_job(NS, NAME)  # Kueue admits the workload
    started(cluster)
    running = kubernetes.poll(profile, ref)

    assert (waiting.state, waiting.reason) == (BackendState.PENDING, "waiting in queue team-ml")
    assert running.state == BackendState.RUNNING


def test_a_job_runs_then_succeeds_with_every_nodes_exit_code(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    assert kubernetes.poll(profile, ref).state == BackendState.PENDING  # no pods yet
    pods = started(cluster)
    running = kubernetes.poll(profile, ref)
    cluster.set_pod_log(NS, pods[0], "step 100 loss 0.8213 tokens/s 4,306\n")
    for pod in pods:
        cluster.set_pod_terminated(NS, pod, 0)
    completed(cluster)

    done = kubernetes.poll(profile, ref)

    assert running.state == BackendState.RUNNING
    assert (done.state, done.exit_code, done.node_exit_codes) == (
        BackendState.SUCCEEDED, 0, {0: 0, 1: 0},
    )  # fmt: skip
    assert "step 100 loss 0.8213" in done.log_tail


def test_an_oom_killed_container_is_host_out_of_memory(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(cluster)
    cluster.set_pod_terminated(NS, second, 137, reason="OOMKilled")
    cluster.set_pod_log(NS, first, "NCCL WARN Net : Connection closed by remote peer\n")
    cluster.set_pod_terminated(NS, first, 1)
    failed(
        cluster, "PodFailurePolicy",
        f"Container trainer for pod {NS}/{second} failed with exit code 137 matching FailJob "
        "rule at index 1",
    )  # fmt: skip

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state, status.exit_code) == (
        BackendState.FAILED, "OOMKilled", 137,
    )  # fmt: skip
    assert status.node_exit_codes == {0: 1, 1: 137}
    assert f"pod {second} (node 1) exited 137 (OOMKilled)" in status.reason
    assert status.failure_class() == FailureClass.OOM_HOST


def test_a_cuda_out_of_memory_in_the_log_is_gpu_out_of_memory(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(cluster)
    cluster.set_pod_log(NS, second, CUDA_OOM_LOG)
    cluster.set_pod_log(NS, first, "NCCL WARN Net : Connection closed by remote peer\n")
    cluster.set_pod_terminated(NS, second, 1)
    cluster.set_pod_terminated(NS, first, 1)  # in the same second: only the Job says who
    failed(
        cluster, "PodFailurePolicy",
        f"Container trainer for pod {NS}/{second} failed with exit code 1 matching FailJob rule "
        "at index 1",
    )  # fmt: skip

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.exit_code) == (BackendState.FAILED, 1)
    assert "CUDA out of memory" in status.log_tail
    message = cluster.read("pods", NS, second)["status"]["containerStatuses"][0]["state"]
    assert "CUDA out of memory" in message["terminated"]["message"]  # FallbackToLogsOnError
    assert status.failure_class() == FailureClass.OOM_GPU


def test_a_preempted_pod_is_a_lost_node(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(cluster)
    cluster.add_pod_condition(
        NS, second, "DisruptionTarget", "PreemptionByScheduler",
        "default-scheduler: preempting to accommodate a higher priority pod",
    )  # fmt: skip
    cluster.set_pod_terminated(NS, second, 143)
    cluster.set_pod_terminated(NS, first, 1)
    failed(
        cluster, "PodFailurePolicy",
        f"Pod {NS}/{second} has condition DisruptionTarget matching FailJob rule at index 0",
    )  # fmt: skip

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.FAILED, "DisruptionTarget")
    assert "PreemptionByScheduler" in status.reason
    assert status.failure_class() == FailureClass.NODE_LOST


def test_a_job_past_its_deadline_is_a_timeout(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, time_limit_s=600))
    assert cluster.read("jobs", NS, NAME)["spec"]["activeDeadlineSeconds"] == 600
    for pod in started(cluster):
        cluster.set_pod_terminated(NS, pod, 143)
    failed(cluster, "DeadlineExceeded", "Job was active longer than specified deadline")

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.FAILED, "DeadlineExceeded")
    assert status.failure_class() == FailureClass.TIMEOUT


def test_a_plain_non_zero_exit_is_the_users_error(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(cluster)
    cluster.set_pod_log(NS, second, "KeyError: 'input_ids'\n")
    cluster.set_pod_terminated(NS, second, 3)
    cluster.set_pod_terminated(NS, first, 143)  # stopped by the Job controller afterwards
    failed(cluster, "PodFailurePolicy", "a message that names no pod")

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.exit_code, status.native_state) == (
        BackendState.FAILED, 3, "Error",
    )  # fmt: skip
    assert status.node_exit_codes == {0: 143, 1: 3}
    assert "KeyError: 'input_ids'" in status.log_tail
    assert status.failure_class() == FailureClass.USER_ERROR


def test_a_missing_executable_is_a_launch_error(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, _second = started(cluster)
    cluster.set_pod_terminated(
        NS, first, 128, reason="StartError",
        message='failed to create containerd task: exec: "python3": executable file not found in '
        "$PATH: unknown",
    )  # fmt: skip
    failed(cluster, "PodFailurePolicy", "matching FailJob rule at index 1")

    status = kubernetes.poll(profile, ref)

    assert (status.native_state, status.exit_code) == ("StartError", 128)
    assert "executable file not found" in status.log_tail
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


def test_an_image_that_cannot_be_pulled_is_a_launch_error_and_frees_the_nodes(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, image="registry.example/train:nope"))
    first, second = cluster.create_job_pods(NS, NAME)
    cluster.set_pod_running(NS, first)
    cluster.set_pod_waiting(
        NS, second, "ImagePullBackOff", 'Back-off pulling image "registry.example/train:nope"'
    )

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.FAILED, "ImagePullBackOff")
    assert 'Back-off pulling image "registry.example/train:nope"' in status.reason
    assert status.failure_class() == FailureClass.LAUNCH_ERROR
    assert [cluster.names(k, NS) for k in ("jobs", "pods", "services", "configmaps")] == [[]] * 4


def test_a_job_deleted_behind_zeropilots_back_is_lost(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(cluster)
    cluster.delete("jobs", NS, NAME, "Background")  # kubectl delete job

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.LOST, "NotFound")
    assert cluster.names("pods", NS) == []  # the cascade took its pods


# ---- cancel and logs ----


def test_cancel_deletes_the_job_its_pods_and_everything_it_owns(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(cluster)

    kubernetes.cancel(profile, ref)

    assert [cluster.names(k, NS) for k in ("jobs", "pods", "services", "configmaps")] == [[]] * 4
    kubernetes.cancel(profile, ref)  # cancelling what is gone is a no-op
    assert kubernetes.poll(profile, ref).state.terminal


def test_a_job_held_by_a_finalizer_reads_as_cancelled_while_it_goes(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(cluster)
    cluster.add_finalizer("jobs", NS, NAME, "example.com/audit")

    kubernetes.cancel(profile, ref)
    status = kubernetes.poll(profile, ref)

    assert status.state == BackendState.CANCELLED
    assert status.failure_class() == FailureClass.CANCELLED
    assert cluster.names("pods", NS) == []


def test_logs_are_each_nodes_tail_under_its_pod_name(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(cluster)
    cluster.set_pod_log(NS, first, "".join(f"step {i} loss 1.0\n" for i in range(1, 6)))
    cluster.set_pod_log(NS, second, '{"rank": 8, "note": "a JSON-looking line stays text"}\n')

    text = kubernetes.logs(profile, ref, tail_lines=2)

    assert text == (
        f"==> {first} <==\nstep 4 loss 1.0\nstep 5 loss 1.0\n"
        f'==> {second} <==\n{{"rank": 8, "note": "a JSON-looking line stays text"}}'
    )
    assert kubernetes.log_path(ref) is None


def test_logs_of_a_single_node_job_have_no_header(
    cluster: LoopbackApiServer, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=1))
    (pod,) = cluster.create_job_pods(NS, NAME)
    assert kubernetes.logs(profile, ref) == ""  # still ContainerCreating: no log yet
    cluster.set_pod_running(NS, pod)
    cluster.set_pod_log(NS, pod, "one\ntwo\nthree\n")

    assert kubernetes.logs(profile, ref, tail_lines=2) == "two\nthree"


# ---- the worker's launch and reconcile on a Kubernetes cluster profile ----

PLAN = {"zero_stage": 2, "activation_checkpointing": False, "ds_config": DS_CONFIG}


def test_the_worker_launches_and_follows_a_job_to_succeeded(
    cluster: LoopbackApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, job_id, attempt_id = queued_kubernetes_job(cluster, tmp_path, monkeypatch)

    launch_attempt(settings, attempt_id)
    job, attempt = load(settings, job_id, attempt_id)
    assert (job.status, attempt.backend_ref) == (
        JobStatus.LAUNCHING, f"{NS}/{attempt.backend_name}",
    )  # fmt: skip
    pods = started(cluster, attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    running, _ = load(settings, job_id, attempt_id)
    for pod in pods:
        cluster.set_pod_terminated(NS, pod, 0)
    completed(cluster, attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    done, finished = load(settings, job_id, attempt_id)

    assert running.status == JobStatus.RUNNING
    assert (done.status, finished.status, finished.exit_code) == (
        JobStatus.SUCCEEDED, AttemptStatus.SUCCEEDED, 0,
    )  # fmt: skip
    _argv, env = kubelet_view(cluster.read("pods", NS, pods[0]))
    assert env["ZEROPILOT_ATTEMPT_ID"] == attempt_id
    assert env["ZEROPILOT_DS_CONFIG"] == "/etc/zeropilot/ds_config.json"


def test_the_worker_records_a_quota_rejection_as_a_launch_error(
    cluster: LoopbackApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, job_id, attempt_id = queued_kubernetes_job(cluster, tmp_path, monkeypatch)

    def over_quota(resource: str, _obj: dict[str, Any]) -> None:
        raise ApiError(403, "Forbidden", "exceeded quota: team-ml, requested: count/jobs.batch=1")

    cluster.admission = over_quota

    launch_attempt(settings, attempt_id)
    job, attempt = load(settings, job_id, attempt_id)

    assert (job.status, job.failure_class) == (JobStatus.FAILED, FailureClass.LAUNCH_ERROR)
    assert "exceeded quota: team-ml" in (attempt.failure_message or "")


def queued_kubernetes_job(
    cluster: LoopbackApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, str, str]:
    """A job for a kubernetes cluster profile (from the profiles file), QUEUED in SQLite."""
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    profiles = tmp_path / "clusters.yaml"
    fields = k8s_profile(kubeconfig).model_dump(mode="json", exclude_defaults=True)
    profiles.write_text(yaml.safe_dump({"clusters": [fields]}))
    monkeypatch.setenv("ZEROPILOT_CLUSTERS__PROFILES_FILE", str(profiles))
    database = f"sqlite:///{tmp_path / 'zeropilot.db'}"
    upgrade(database)
    settings = Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=database),
        auth=AuthSettings(secret_key="test-secret-key"),
    )
    spec = tiny_spec(
        image="registry.example/train:1",
        resources={"cluster": "gpu-k8s", "nodes": 2, "gpus_per_node": 8},
    )
    spec["training"]["global_batch_size"] = 32
    with Session(get_engine(database)) as session:
        user = user_by_token(session, create_user(session, "alice", "vision"))
        assert user is not None
        job, _created = job_store.create_job(
            session,
            spec=JobSpec.model_validate(spec),
            plan=PLAN,
            advice_reason="test",
            user=user,
            backend="kubernetes",
            idempotency_key=None,
        )
        assert admit_pending(session, settings.cluster_profiles())  # as the API does
        attempt = job_store.current_attempt(session, job)
        assert attempt is not None
        session.commit()
        ids = job.id, attempt.id
    assert get_backend(settings.cluster_profiles()["gpu-k8s"].kind) is kubernetes
    return settings, *ids


def load(settings: Settings, job_id: str, attempt_id: str) -> tuple[Job, Attempt]:
    with Session(get_engine(settings.database_url), expire_on_commit=False) as session:
        job, attempt = session.get(Job, job_id), session.get(Attempt, attempt_id)
        assert job is not None and attempt is not None
        return job, attempt
