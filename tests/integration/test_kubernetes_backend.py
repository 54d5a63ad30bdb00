"""The Kubernetes backend against a real control plane: API server, Job controller, scheduler.

``kube_control_plane`` (k8s_control_plane.py) runs etcd, kube-apiserver, kube-controller-manager
and kube-scheduler v1.36.2 on loopback for the whole session, with two Nodes of 8
``nvidia.com/gpu`` each. The objects the backend creates are validated, defaulted, admitted
(quotas) and acted on by the real components: the Job controller creates the pods, the
scheduler binds them or says why not, the garbage collector cascades. Only the kubelet is
played (``FakeKubelet``): pod phases and exit codes in ``pods/status``, logs served on the
node's kubelet port, graceful deletions confirmed. Each test runs in its own namespace.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from sqlmodel import Session

from service.api.app import create_app
from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from service.core.spec import JobSpec
from service.core.states import AttemptStatus, JobStatus
from service.db import jobs as job_store
from service.db.admission import admit_pending
from service.db.migrate import upgrade
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.db.transitions import move_job
from service.db.users import create_user, user_by_token
from service.security import attempt_token
from service.settings import AuthSettings, DatabaseSettings, Settings
from tests.integration.helpers import REPO, tiny_spec
from tests.integration.k8s_control_plane import ControlPlane, write_kubeconfig
from tests.integration.k8s_kubelet import (
    SIGTERM_EXIT,
    FakeKubelet,
    kubelet_view,
    socket_closed_port,
)
from tests.integration.k8s_loopback import ApiError, loopback_api_server
from workers.backends import get_backend, kubernetes
from workers.backends.base import BackendState, LaunchRequest, PermanentError, TemporaryError
from workers.backends.calls import calls_sent
from workers.backends.kubernetes_render import master_port, render_job
from workers.launch import launch_attempt
from workers.reconcile import cancel_attempt, reconcile_attempt

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
MANAGED = "app.kubernetes.io/managed-by=zeropilot"
RESOURCES = {
    "jobs": "/apis/batch/v1/namespaces/{ns}/jobs",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "services": "/api/v1/namespaces/{ns}/services",
    "configmaps": "/api/v1/namespaces/{ns}/configmaps",
}


@pytest.fixture
def plane(kube_control_plane: ControlPlane) -> ControlPlane:
    return kube_control_plane


@pytest.fixture
def api(plane: ControlPlane) -> httpx.Client:
    assert plane.api is not None
    return plane.api


@pytest.fixture
def kubelet(plane: ControlPlane) -> Iterator[FakeKubelet]:
    assert plane.kubelet is not None
    plane.kubelet.finish_deletions = True
    yield plane.kubelet
    plane.kubelet.finish_deletions = True
    plane.kubelet.stop_exit_code = SIGTERM_EXIT
    plane.kubelet.hold_stopped_s = 0.0


@pytest.fixture
def ns(api: httpx.Client, kubelet: FakeKubelet) -> Iterator[str]:
    """A fresh namespace, gone with its pods afterwards (so the next test has every GPU)."""
    name = f"t-{secrets.token_hex(4)}"
    created = api.post("/api/v1/namespaces", json={"metadata": {"name": name}})
    assert created.status_code == 201, created.text
    # Pods are refused until the ServiceAccount controller has made the namespace's default.
    wait_until(lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").is_success)
    yield name
    # Jobs and pods first (the namespace controller takes seconds to get to them), then the
    # namespace in the background.
    api.delete(RESOURCES["jobs"].format(ns=name), params={"propagationPolicy": "Background"})
    api.delete(RESOURCES["pods"].format(ns=name), params={"gracePeriodSeconds": 0})
    wait_until(lambda: names(api, name, "pods", selector="") == [], timeout_s=60)
    api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def profile(plane: ControlPlane, ns: str) -> ClusterProfile:
    return k8s_profile(plane.kubeconfig, namespace=ns)


def k8s_profile(kubeconfig: Path, **changes: Any) -> ClusterProfile:
    fields: dict[str, Any] = {
        "name": "gpu-k8s",
        "kind": "kubernetes",
        "accelerator": "nvidia-h100-80gb",
        "gpu_memory_gib": 80,
        "gpus_per_node": 8,
        "cpu_memory_gib": 512,
        "max_nodes": 4,
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


def wait_until(condition: Callable[[], Any], timeout_s: float = 30) -> Any:
    """The first truthy answer of ``condition``; the controllers act within a second or two."""
    deadline = time.monotonic() + timeout_s
    while not (answer := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout_s} s: {condition}")
        time.sleep(0.1)
    return answer


def names(api: httpx.Client, ns: str, resource: str, selector: str = MANAGED) -> list[str]:
    listed = api.get(RESOURCES[resource].format(ns=ns), params={"labelSelector": selector})
    assert listed.is_success, listed.text
    return sorted(item["metadata"]["name"] for item in listed.json()["items"])


def read(api: httpx.Client, ns: str, resource: str, name: str) -> dict[str, Any]:
    response = api.get(f"{RESOURCES[resource].format(ns=ns)}/{name}")
    assert response.is_success, response.text
    result: dict[str, Any] = response.json()
    return result


def everything(api: httpx.Client, ns: str) -> list[list[str]]:
    return [names(api, ns, kind) for kind in ("jobs", "pods", "services", "configmaps")]


def started(kubelet: FakeKubelet, ns: str, nodes: int = 2, name: str = NAME) -> list[str]:
    """The Job controller's pods, bound by the scheduler, their containers started."""
    pods = kubelet.wait_for_pods(ns, name, nodes)
    kubelet.run(ns, *pods)
    return pods


def job_condition(api: httpx.Client, ns: str, kind: str, name: str = NAME) -> dict[str, Any]:
    """Waits for the Job controller to set condition ``kind`` on the Job; returns it."""

    def found() -> dict[str, Any] | None:
        conditions = read(api, ns, "jobs", name)["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == kind and c["status"] == "True"), None)

    condition: dict[str, Any] = wait_until(found)
    return condition


def poll_until(
    profile: ClusterProfile, ref: str, state: BackendState, timeout_s: float = 30
) -> Any:
    return wait_until(
        lambda: (status := kubernetes.poll(profile, ref)).state == state and status, timeout_s
    )


def quota(api: httpx.Client, ns: str, hard: dict[str, str]) -> None:
    body = {"metadata": {"name": "team-ml"}, "spec": {"hard": hard}}
    assert api.post(f"/api/v1/namespaces/{ns}/resourcequotas", json=body).is_success
    # The quota admits nothing until the resource-quota controller has counted the usage.
    wait_until(lambda: "used" in read_quota(api, ns)["status"] if read_quota(api, ns) else False)
    # The API server's admission reads quotas from a cache of its own, which can lag behind (a
    # namespace it found without quotas a moment ago stays so for a while): wait until it
    # refuses what the quota forbids, asked as a dry run, which stores nothing.
    wait_until(lambda: refused_in_dry_run(api, ns, hard))


def refused_in_dry_run(api: httpx.Client, ns: str, hard: dict[str, str]) -> bool:
    ((resource, value),) = hard.items()  # each test's quota sets one limit
    container = {"name": "probe", "image": "busybox"}
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    gpus = {"limits": {"nvidia.com/gpu": str(int(value) + 1)}}  # one more than a GPU quota holds
    probes: dict[str, tuple[str, dict[str, Any]]] = {
        "count/jobs.batch": (f"/apis/batch/v1/namespaces/{ns}/jobs", {"template": {"spec": pod}}),
        "services": (f"/api/v1/namespaces/{ns}/services", {"ports": [{"port": 80}]}),
        "requests.nvidia.com/gpu": (
            f"/api/v1/namespaces/{ns}/pods",
            {**pod, "containers": [{**container, "resources": gpus}]},
        ),
    }
    path, spec = probes[resource]
    response = api.post(path, params={"dryRun": "All"},
                        json={"metadata": {"name": "quota-probe"}, "spec": spec})  # fmt: skip
    return response.status_code == 403 and "exceeded quota" in response.text


def read_quota(api: httpx.Client, ns: str) -> dict[str, Any]:
    response = api.get(f"/api/v1/namespaces/{ns}/resourcequotas/team-ml")
    return dict(response.json()) if response.is_success else {}


# ---- submit ----


def test_submit_creates_the_job_its_headless_service_and_its_config_map(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))

    assert ref == f"{ns}/{NAME}"
    assert [names(api, ns, kind) for kind in ("jobs", "services", "configmaps")] == [[NAME]] * 3
    job = read(api, ns, "jobs", NAME)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": job["metadata"]["uid"]}
    config_map = read(api, ns, "configmaps", NAME)
    assert config_map["metadata"]["ownerReferences"] == [owner]
    assert config_map["data"]["hostfile"] == (f"{NAME}-0.{NAME} slots=8\n{NAME}-1.{NAME} slots=8\n")
    assert json.loads(config_map["data"]["ds_config.json"]) == DS_CONFIG
    service = read(api, ns, "services", NAME)
    assert service["metadata"]["ownerReferences"] == [owner]
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["completionMode"] == "Indexed"
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (2, 2)
    # The server's defaults, which the loopback stand-in never filled in.
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"memory": "512Gi", "nvidia.com/gpu": "8"}
    assert container["imagePullPolicy"] == "IfNotPresent"


def test_a_profile_without_a_namespace_launches_in_the_workers_own(
    api: httpx.Client, ns: str, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    own = tmp_path / "serviceaccount-namespace"  # what the kubelet mounts into the worker's pod
    own.write_text(f"{ns}\n")
    monkeypatch.setattr(kubernetes, "SERVICE_ACCOUNT_NAMESPACE", own)
    profile = k8s_profile(plane.kubeconfig, namespace=None)

    ref = kubernetes.submit(launch_request(tmp_path, profile))

    assert ref == f"{ns}/{NAME}"
    assert names(api, ns, "jobs") == [NAME]


def test_each_pod_runs_the_ssh_less_launcher_with_its_own_rank_and_pod_0_as_master(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    evil = ("$(whoami)", "`id`", 'it\'s "quoted"; rm -rf /', "line one\nline two", "$$", "$HOME")
    request = launch_request(
        tmp_path, profile, args=evil, env={"EVIL": "$(JOB_COMPLETION_INDEX) $(whoami)"}
    )
    kubernetes.submit(request)

    pods = kubelet.wait_for_pods(ns, NAME, 2)

    service = read(api, ns, "services", NAME)
    for index, pod_name in enumerate(pods):
        pod = read(api, ns, "pods", pod_name)
        # The pod's DNS name (hostname.subdomain) is the hostfile's line for its rank.
        assert f"{pod['spec']['hostname']}.{pod['spec']['subdomain']}" == f"{NAME}-{index}.{NAME}"
        assert all(
            pod["metadata"]["labels"][k] == v for k, v in service["spec"]["selector"].items()
        )
        argv, env = kubelet_view(pod)  # with the variables the real Job controller added
        assert argv[:2] == ["python3", "-c"] and argv[3] == ""  # the stop-passing wrapper
        assert argv[4:] == [
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
        assert env["JOB_COMPLETION_INDEX"] == str(index)
        assert pod["spec"]["nodeName"] in ("gpu-node-1", "gpu-node-2")  # the real scheduler's


def test_a_users_job_completion_index_variable_is_refused(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    # The Job controller keeps a variable of that name when the pod has one: every rank got 7.
    request = launch_request(tmp_path, profile, env={"JOB_COMPLETION_INDEX": "7"})

    with pytest.raises(PermanentError, match="JOB_COMPLETION_INDEX is set by zeropilot"):
        kubernetes.submit(request)
    assert names(api, ns, "jobs") == []


def test_submitting_twice_creates_nothing_new_and_returns_the_same_ref(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    request = launch_request(tmp_path, profile)
    first = kubernetes.submit(request)
    kinds = ("jobs", "services", "configmaps")
    uids = {kind: read(api, ns, kind, NAME)["metadata"]["uid"] for kind in kinds}

    again = kubernetes.submit(request)

    assert again == first
    assert {k: read(api, ns, k, NAME)["metadata"]["uid"] for k in uids} == uids
    assert names(api, ns, "jobs") == [NAME]


def test_a_submit_after_a_crash_midway_creates_the_rest(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    request = launch_request(tmp_path, profile)
    # What a worker killed right after its first create left behind: the Job alone.
    assert api.post(RESOURCES["jobs"].format(ns=ns), json=render_job(request)).is_success

    ref = kubernetes.submit(request)

    assert ref == f"{ns}/{NAME}"
    job_uid = read(api, ns, "jobs", NAME)["metadata"]["uid"]
    for kind in ("configmaps", "services"):
        assert read(api, ns, kind, NAME)["metadata"]["ownerReferences"][0]["uid"] == job_uid


def test_a_resubmit_while_the_job_is_being_deleted_does_not_adopt_it(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    request = launch_request(tmp_path, profile)
    ref = kubernetes.submit(request)
    started(kubelet, ns)
    kubelet.finish_deletions = False  # the pods stay Terminating: the Job is being stopped
    kubernetes.cancel(profile, ref)

    with pytest.raises(TemporaryError, match="being deleted"):
        kubernetes.submit(request)

    kubelet.finish_deletions = True
    poll_until(profile, ref, BackendState.CANCELLED)  # the pods stopped: the Job goes
    wait_until(lambda: names(api, ns, "jobs") == [])
    assert kubernetes.submit(request) == ref  # once it is gone, a new one
    assert not read(api, ns, "jobs", NAME)["metadata"].get("deletionTimestamp")


def test_a_namesake_job_that_zeropilot_did_not_create_is_not_adopted(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    other = {
        "metadata": {"name": NAME},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "other", "image": "busybox"}],
                }
            }
        },
    }
    assert api.post(RESOURCES["jobs"].format(ns=ns), json=other).is_success

    with pytest.raises(PermanentError, match="was not created for attempt"):
        kubernetes.submit(launch_request(tmp_path, profile))
    assert names(api, ns, "configmaps") == []


def test_a_job_quota_rejection_is_a_permanent_error_with_the_servers_words(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    quota(api, ns, {"count/jobs.batch": "0"})

    with pytest.raises(PermanentError, match=r"exceeded quota: team-ml, requested: count/jobs"):
        kubernetes.submit(launch_request(tmp_path, profile))
    assert names(api, ns, "jobs") == []


def test_a_submit_refused_after_the_job_exists_leaves_nothing_behind(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    quota(api, ns, {"services": "0"})

    with pytest.raises(PermanentError, match=r"exceeded quota: team-ml, requested: services=1"):
        kubernetes.submit(launch_request(tmp_path, profile))

    wait_until(lambda: everything(api, ns) == [[]] * 4)


def test_an_object_the_server_finds_invalid_is_a_permanent_error(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    # The schema allows any count; the server allows at most 100000 indexes.
    with pytest.raises(PermanentError, match="Invalid value: 100001"):
        kubernetes.submit(launch_request(tmp_path, profile, nodes=100_001))
    assert names(api, ns, "jobs") == []


def test_an_unreachable_api_server_is_a_temporary_error(
    plane: ControlPlane, tmp_path: Path
) -> None:
    with socket_closed_port() as port:
        kubeconfig = write_kubeconfig(
            tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", plane.certs / "ca.crt", "t"
        )
        profile = k8s_profile(kubeconfig, namespace="ml")

        with pytest.raises(TemporaryError, match="did not answer"):
            kubernetes.submit(launch_request(tmp_path, profile))
        with pytest.raises(TemporaryError):
            kubernetes.poll(profile, f"ml/{NAME}")


def test_a_wrong_token_is_refused_for_good(plane: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(
        tmp_path / "kubeconfig", plane.url, plane.certs / "ca.crt", "stale-token"
    )

    with pytest.raises(PermanentError, match="Unauthorized"):
        kubernetes.submit(launch_request(tmp_path, k8s_profile(kubeconfig, namespace="ml")))


def test_a_wrong_certificate_authority_is_refused_for_good(
    plane: ControlPlane, tmp_path: Path
) -> None:
    wrong_ca = tmp_path / "other-ca.crt"
    wrong_ca.write_text((plane.certs / "kubelet-client.crt").read_text())  # not the CA
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", plane.url, wrong_ca, "t")
    began = time.monotonic()

    with pytest.raises(PermanentError, match="certificate verify failed"):
        kubernetes.submit(launch_request(tmp_path, k8s_profile(kubeconfig, namespace="ml")))
    assert time.monotonic() - began < 5  # not retried as if the server were busy


def test_a_missing_kubeconfig_is_a_permanent_error(tmp_path: Path) -> None:
    profile = k8s_profile(tmp_path / "no-such-kubeconfig")

    with pytest.raises(PermanentError, match="no usable Kubernetes client configuration"):
        kubernetes.submit(launch_request(tmp_path, profile))


def test_a_job_without_an_image_is_refused_before_any_call(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    with pytest.raises(PermanentError, match="needs an image"):
        kubernetes.submit(launch_request(tmp_path, profile, image=None))
    assert everything(api, ns) == [[]] * 4


# ---- poll: waiting ----


def test_pods_the_scheduler_cannot_place_are_pending_with_its_reason(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, procs_per_node=9))

    status = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "Unschedulable" and s
    )

    assert status.state == BackendState.PENDING
    assert "0 of 2 pods running" in status.reason
    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in status.reason


def held_for_s(reason: str) -> int:
    """How long the gang timeout's words say two of three pods held GPUs (whole seconds)."""
    found = re.search(r"^2 of 3 pods held GPUs for (\d+) s", reason)
    assert found, reason
    return int(found[1])


def test_a_gang_that_cannot_all_be_placed_frees_its_gpus_and_tries_again(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path
) -> None:
    profile = k8s_profile(plane.kubeconfig, namespace=ns, gang_timeout_s=2)
    # Three nodes of 8 GPUs on a cluster of two: the scheduler binds two pods, one waits.
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=3))
    kubelet.wait_for_pods(ns, NAME, 3, scheduled=2)
    waiting = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "Unschedulable" and s
    )

    suspended = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "GangTimeout" and s
    )
    assert read(api, ns, "jobs", NAME)["spec"]["suspend"] is True
    wait_until(lambda: names(api, ns, "pods") == [])  # the Job controller freed their GPUs
    retried = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "GangRetry" and s, timeout_s=10
    )
    kubelet.wait_for_pods(ns, NAME, 3, scheduled=2)  # the scheduler tries the whole gang again

    assert "0 of 3 pods running" in waiting.reason  # two bound, none started yet
    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu" in waiting.reason
    assert suspended.state == BackendState.PENDING
    assert held_for_s(suspended.reason) >= 2  # the gang timeout
    assert "while another could not be placed (0/2 nodes are available" in suspended.reason
    assert retried.state == BackendState.PENDING
    assert not read(api, ns, "jobs", NAME)["spec"]["suspend"]


def test_a_job_waiting_in_its_kueue_queue_is_pending_until_admitted(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path
) -> None:
    profile = k8s_profile(plane.kubeconfig, namespace=ns, queue="team-ml")
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    job = read(api, ns, "jobs", NAME)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    time.sleep(1)  # the Job controller has had time to act, and made no pod: it is suspended
    assert kubelet.pods(ns, NAME) == []

    waiting = kubernetes.poll(profile, ref)
    # Playing Kueue: admitting the workload unsuspends the Job.
    unsuspend = {"spec": {"suspend": False}}
    api.patch(f"{RESOURCES['jobs'].format(ns=ns)}/{NAME}", json=unsuspend,
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    started(kubelet, ns)
    running = poll_until(profile, ref, BackendState.RUNNING)

    assert (waiting.state, waiting.reason) == (BackendState.PENDING, "waiting in queue team-ml")
    assert running.state == BackendState.RUNNING


def suspend(api: httpx.Client, ns: str, value: bool, name: str = NAME) -> None:
    """What Kueue does to admit (False) or preempt (True) a workload; zeropilot's gang timeout
    does the same."""
    api.patch(f"{RESOURCES['jobs'].format(ns=ns)}/{name}", json={"spec": {"suspend": value}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip


def stopped_and_held(api: httpx.Client, ns: str, pods: list[str], code: int) -> bool:
    """Whether every pod in ``pods`` is Failed with the trainer's ``code`` and not yet gone, and
    the Job controller has seen them so (it counts none of its pods as terminating)."""
    for name in pods:
        response = api.get(f"{RESOURCES['pods'].format(ns=ns)}/{name}")
        assert response.is_success, f"pod {name} gone before the test saw it stopped"
        status = response.json()["status"]
        terminated = (status.get("containerStatuses") or [{}])[0].get("state", {}).get("terminated")
        if status.get("phase") != "Failed" or (terminated or {}).get("exitCode") != code:
            return False
    return read(api, ns, "jobs", NAME)["status"].get("terminating") == 0


def tracking_finalizer(api: httpx.Client, ns: str, pod: str) -> bool:
    """Whether the Job controller still counts the pod (its tracking finalizer is on it)."""
    found = api.get(f"{RESOURCES['pods'].format(ns=ns)}/{pod}")
    assert found.is_success, found.text
    return "batch.kubernetes.io/job-tracking" in (found.json()["metadata"].get("finalizers") or [])


def polls_for(profile: ClusterProfile, ref: str, seconds: float) -> list[Any]:
    """Every status ``poll`` gives over ``seconds``, a few per second, as the reconcile would."""
    statuses, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        statuses.append(kubernetes.poll(profile, ref))
        time.sleep(0.3)
    return statuses


def ending_conditions(api: httpx.Client, ns: str) -> list[str]:
    conditions = read(api, ns, "jobs", NAME)["status"].get("conditions") or []
    ending = {"Failed", "FailureTarget", "Complete", "SuccessCriteriaMet"}
    return [c["type"] for c in conditions if c["type"] in ending and c["status"] == "True"]


@pytest.mark.parametrize("stop_exit", [SIGTERM_EXIT, 1])  # 1: DeepSpeed's launch on SIGTERM
def test_a_running_job_its_queue_suspends_waits_and_resumes_without_failing(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    stop_exit: int,
) -> None:  # fmt: skip
    profile = k8s_profile(plane.kubeconfig, namespace=ns, queue="team-ml")
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    suspend(api, ns, False)  # admitted
    first = started(kubelet, ns)
    poll_until(profile, ref, BackendState.RUNNING)
    # As a real kubelet may: the stopped pods stay Failed, with their exit code, for seconds.
    kubelet.stop_exit_code, kubelet.hold_stopped_s = stop_exit, 12.0

    suspend(api, ns, True)  # preempted, to make room for another workload
    wait_until(lambda: stopped_and_held(api, ns, first, stop_exit))
    released = [tracking_finalizer(api, ns, pod) for pod in first]
    while_held = polls_for(profile, ref, seconds=2)
    conditions = ending_conditions(api, ns)
    suspend(api, ns, False)  # admitted again, while the stopped pods are still there
    second = kubelet.wait_for_pods(ns, NAME, 2, scheduled=0)  # live ones: new
    resumed = kubernetes.poll(profile, ref)
    lingering = [p for p in first if api.get(f"{RESOURCES['pods'].format(ns=ns)}/{p}").is_success]
    kubelet.wait_for_pods(ns, NAME, 2)
    kubelet.run(ns, *second)
    running = poll_until(profile, ref, BackendState.RUNNING)
    for pod in second:
        kubelet.exit(ns, pod, 0)
    done = poll_until(profile, ref, BackendState.SUCCEEDED)

    assert conditions == []  # the Job controller did not fail the suspended Job
    assert released == [False, False]  # it let go of the pods it stopped: it counts none
    assert {(s.state, s.native_state, s.reason) for s in while_held} == {
        (BackendState.PENDING, "Suspended", "waiting in queue team-ml")
    }
    assert not set(second) & set(first)  # new pods for both indexes
    assert lingering  # the stopped pods were still there when the new ones came
    assert resumed.state == BackendState.PENDING  # and they do not count as running
    assert running.state == BackendState.RUNNING
    assert done.node_exit_codes == {0: 0, 1: 0}


def test_a_gang_timeout_stops_started_pods_and_retries_without_failing_the_job(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path
) -> None:
    profile = k8s_profile(plane.kubeconfig, namespace=ns, gang_timeout_s=2)
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=3))
    kubelet.wait_for_pods(ns, NAME, 3, scheduled=2)
    placed = [p["metadata"]["name"] for p in kubelet.pods(ns, NAME) if p["spec"].get("nodeName")]
    kubelet.run(ns, *placed)  # their containers start and wait for the third rank
    kubelet.hold_stopped_s = 6.0

    suspended = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "GangTimeout" and s
    )
    wait_until(lambda: stopped_and_held(api, ns, placed, SIGTERM_EXIT))
    while_held = polls_for(profile, ref, seconds=2)
    conditions = ending_conditions(api, ns)
    retried = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "GangRetry" and s, timeout_s=15
    )
    again = kubelet.wait_for_pods(ns, NAME, 3, scheduled=2, timeout_s=30)

    assert held_for_s(suspended.reason) >= 2
    assert conditions == []
    assert {s.state for s in while_held} == {BackendState.PENDING}  # GangTimeout, then retried
    assert retried.state == BackendState.PENDING
    assert not set(again) & set(placed)  # a new gang, all three pods created again


@pytest.mark.parametrize("code", [1, SIGTERM_EXIT])
def test_a_trainer_exiting_non_zero_still_fails_the_job_while_stopped_pods_linger(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path,
    code: int,
) -> None:  # fmt: skip
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    _first, second = started(kubelet, ns)
    kubelet.hold_stopped_s = 4.0
    kubelet.set_log(ns, second, "KeyError: 'input_ids'\n")

    kubelet.exit(ns, second, code)
    status = poll_until(profile, ref, BackendState.FAILED)

    # Counted by backoffLimit 0 (no rule matches it): the Job fails as it did with the rule.
    assert status.reason.startswith("BackoffLimitExceeded: Job has reached the specified")
    assert (status.exit_code, status.node_exit_codes[1]) == (code, code)
    assert status.failure_class() == FailureClass.USER_ERROR


def test_a_pod_the_server_refuses_is_a_launch_error_with_the_controllers_words(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    # Valid in a Job's template, invalid in every pod the Job controller tries to create.
    ref = kubernetes.submit(launch_request(tmp_path, profile, image=" registry.example/train:1 "))

    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.native_state == "FailedCreate"
    assert "must not have leading or trailing whitespace" in status.reason
    assert status.failure_class() == FailureClass.LAUNCH_ERROR
    wait_until(lambda: everything(api, ns) == [[]] * 4)  # the Job is deleted


def hold_gpus(api: httpx.Client, ns: str, name: str, gpus: int) -> None:
    """A pod of another team's that asks for ``gpus`` GPUs, counted by the namespace's quota."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod = {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources}]},
    }
    assert api.post(RESOURCES["pods"].format(ns=ns), json=pod).is_success


def test_a_gpu_quota_smaller_than_the_whole_job_is_a_launch_error_and_deletes_it(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    # Room for one pod of 8 GPUs, and the Job needs two: its own pod 0 fills the quota.
    quota(api, ns, {"requests.nvidia.com/gpu": "8"})
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    kubelet.wait_for_pods(ns, NAME, 1)

    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.native_state == "FailedCreate"
    assert (
        "its 2 pods need 2 x requests.nvidia.com/gpu=8, more than the quota's hard limit "
        "requests.nvidia.com/gpu=8" in status.reason
    )
    assert "exceeded quota: team-ml" in status.reason  # the controller's words follow
    assert status.failure_class() == FailureClass.LAUNCH_ERROR
    wait_until(lambda: everything(api, ns) == [[]] * 4)  # pod 0 no longer holds the quota


def test_a_job_that_fits_the_quota_waits_while_another_holds_it_then_starts(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    quota(api, ns, {"requests.nvidia.com/gpu": "16"})
    hold_gpus(api, ns, "other-team", 8)  # someone else's pod holds 8 of the 16
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    kubelet.wait_for_pods(ns, NAME, 1)

    waiting = wait_until(
        lambda: (s := kubernetes.poll(profile, ref)).native_state == "FailedCreate" and s
    )
    api.delete(f"{RESOURCES['pods'].format(ns=ns)}/other-team")
    # The Job controller tries again (with backoff) once the quota controller saw it released.
    kubelet.wait_for_pods(ns, NAME, 2, timeout_s=90)
    created = kubernetes.poll(profile, ref)

    assert waiting.state == BackendState.PENDING
    assert "waiting for quota" in waiting.reason
    assert "exceeded quota: team-ml" in waiting.reason
    assert "used: requests.nvidia.com/gpu=16, limited: requests.nvidia.com/gpu=16" in waiting.reason
    assert (created.state, created.native_state) != (BackendState.FAILED, "FailedCreate")
    assert created.state == BackendState.PENDING  # both pods now, their containers starting


def test_a_gpu_quota_smaller_than_one_pod_is_a_launch_error(
    api: httpx.Client, ns: str, profile: ClusterProfile, tmp_path: Path
) -> None:
    quota(api, ns, {"requests.nvidia.com/gpu": "4"})
    ref = kubernetes.submit(launch_request(tmp_path, profile))

    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.native_state == "FailedCreate"
    assert "limited: requests.nvidia.com/gpu=4" in status.reason
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


# ---- poll: running and ending ----


def test_a_job_runs_then_succeeds_with_every_nodes_exit_code(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    assert kubernetes.poll(profile, ref).state == BackendState.PENDING  # no pods yet
    pods = started(kubelet, ns)
    running = kubernetes.poll(profile, ref)
    kubelet.set_log(ns, pods[0], "step 100 loss 0.8213 tokens/s 4,306\n")
    for pod in pods:
        kubelet.exit(ns, pod, 0)

    done = poll_until(profile, ref, BackendState.SUCCEEDED)

    assert running.state == BackendState.RUNNING
    assert (done.exit_code, done.node_exit_codes) == (0, {0: 0, 1: 0})
    assert "step 100 loss 0.8213" in done.log_tail


def test_an_oom_killed_container_is_host_out_of_memory(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    _first, second = started(kubelet, ns)

    kubelet.exit(ns, second, 137, reason="OOMKilled")
    status = poll_until(profile, ref, BackendState.FAILED)

    assert (status.native_state, status.exit_code) == ("OOMKilled", 137)
    assert f"pod {second} (node 1) exited 137 (OOMKilled)" in status.reason
    assert status.node_exit_codes[1] == 137
    assert status.failure_class() == FailureClass.OOM_HOST


def test_a_node_the_controller_stopped_is_named_without_an_exit_code(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    _first, second = started(kubelet, ns)

    kubelet.exit(ns, second, 3)
    job_condition(kubelet.api, ns, "Failed")  # the controller has deleted pod 0 by now
    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.node_exit_codes == {1: 3}
    assert "node 0: no exit code (stopped by the Job controller)" in status.reason


def test_a_cuda_out_of_memory_in_the_log_is_gpu_out_of_memory(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(kubelet, ns)
    kubelet.set_log(ns, second, CUDA_OOM_LOG)
    kubelet.set_log(ns, first, "NCCL WARN Net : Connection closed by remote peer\n")

    kubelet.exit(ns, second, 1)
    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.exit_code == 1
    assert "CUDA out of memory" in status.log_tail
    assert status.failure_class() == FailureClass.OOM_GPU


def test_an_evicted_pod_is_a_lost_node_after_it_is_gone(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    _first, second = started(kubelet, ns)

    # A drain: the Eviction API marks the pod DisruptionTarget and deletes it; the kubelet
    # stops it (exit 143) and confirms; the Job controller's podFailurePolicy fails the Job.
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": second}}
    evicted = api.post(f"/api/v1/namespaces/{ns}/pods/{second}/eviction", json=eviction)
    assert evicted.is_success, evicted.text
    condition = job_condition(api, ns, "Failed")
    wait_until(lambda: second not in names(api, ns, "pods", selector=""))
    status = kubernetes.poll(profile, ref)

    assert "has condition DisruptionTarget" in condition["message"]
    assert (status.state, status.native_state) == (BackendState.FAILED, "DisruptionTarget")
    assert f"Pod {ns}/{second} has condition DisruptionTarget" in status.reason
    assert "node 1: disrupted, no exit code" in status.reason
    assert "node 0, 1" not in status.reason and "node 1: no exit code" not in status.reason
    assert status.failure_class() == FailureClass.NODE_LOST


def test_a_node_tainted_out_of_service_is_a_lost_node(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=1))
    (pod,) = started(kubelet, ns, nodes=1)
    node = read(api, ns, "pods", pod)["spec"]["nodeName"]
    taint = {"key": "node.kubernetes.io/out-of-service", "value": "shutdown", "effect": "NoExecute"}
    api.patch(f"/api/v1/nodes/{node}", json={"spec": {"taints": [taint]}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    try:
        status = poll_until(profile, ref, BackendState.FAILED)
    finally:
        kubelet.register(node)  # untainted again for the next tests

    assert status.native_state == "DisruptionTarget"
    assert (
        "DeletionByTaintManager" in status.reason
        or "has condition DisruptionTarget" in status.reason
    )
    assert status.failure_class() == FailureClass.NODE_LOST


def test_a_job_past_its_deadline_is_a_timeout(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, time_limit_s=2))
    assert read(api, ns, "jobs", NAME)["spec"]["activeDeadlineSeconds"] == 2
    started(kubelet, ns)

    status = poll_until(profile, ref, BackendState.FAILED)

    assert status.native_state == "DeadlineExceeded"
    assert status.failure_class() == FailureClass.TIMEOUT


def test_a_plain_non_zero_exit_is_the_users_error(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    _first, second = started(kubelet, ns)
    kubelet.set_log(ns, second, "KeyError: 'input_ids'\n")

    kubelet.exit(ns, second, 3)
    status = poll_until(profile, ref, BackendState.FAILED)

    assert (status.exit_code, status.native_state) == (3, "Error")
    assert "KeyError: 'input_ids'" in status.log_tail
    assert status.failure_class() == FailureClass.USER_ERROR


def test_a_missing_executable_is_a_launch_error(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, _second = started(kubelet, ns)

    kubelet.exit(
        ns, first, 128, reason="StartError",
        message='failed to create containerd task: exec: "python3": executable file not found in '
        "$PATH: unknown",
    )  # fmt: skip
    status = poll_until(profile, ref, BackendState.FAILED)

    assert (status.native_state, status.exit_code) == ("StartError", 128)
    assert "executable file not found" in status.log_tail
    assert status.failure_class() == FailureClass.LAUNCH_ERROR


def test_an_image_that_cannot_be_pulled_is_a_launch_error_and_frees_the_nodes(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, image="registry.example/train:nope"))
    first, second = kubelet.wait_for_pods(ns, NAME, 2)
    kubelet.run(ns, first)
    kubelet.wait_for_image(
        ns, second, "ImagePullBackOff", 'Back-off pulling image "registry.example/train:nope"'
    )

    status = kubernetes.poll(profile, ref)

    assert (status.state, status.native_state) == (BackendState.FAILED, "ImagePullBackOff")
    assert 'Back-off pulling image "registry.example/train:nope"' in status.reason
    assert status.failure_class() == FailureClass.LAUNCH_ERROR
    wait_until(lambda: everything(api, ns) == [[]] * 4)


def test_a_failed_job_is_recorded_while_its_nodes_kubelet_is_unreachable(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=1))
    (pod,) = started(kubelet, ns, nodes=1)
    node = read(api, ns, "pods", pod)["spec"]["nodeName"]
    kubelet.set_log(ns, pod, "KeyError: 'input_ids'\n")
    kubelet.exit(ns, pod, 3)

    with kubelet.unreachable(node):
        status = poll_until(profile, ref, BackendState.FAILED)
        text = kubernetes.logs(profile, ref)

    assert (status.exit_code, status.failure_class()) == (3, FailureClass.USER_ERROR)
    assert "KeyError: 'input_ids'" in status.log_tail  # from the termination message
    assert "log unavailable" in text


def test_a_job_deleted_behind_zeropilots_back_is_lost(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(kubelet, ns)
    # kubectl delete job (Background) as an administrator would
    api.delete(f"{RESOURCES['jobs'].format(ns=ns)}/{NAME}",
               params={"propagationPolicy": "Background"})  # fmt: skip

    status = poll_until(profile, ref, BackendState.LOST)

    assert status.native_state == "NotFound"
    wait_until(lambda: names(api, ns, "pods") == [])  # the garbage collector took its pods


# ---- cancel and logs ----


def test_cancel_deletes_the_job_its_pods_and_everything_it_owns(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(kubelet, ns)
    kubelet.hold_stopped_s = 5.0  # as a real kubelet: the stopped pods go after a while
    # No replacement pod while a stopped one has not failed (the server's default with a policy).
    assert read(api, ns, "jobs", NAME)["spec"]["podReplacementPolicy"] == "Failed"

    kubernetes.cancel(profile, ref)
    going = polls_for(profile, ref, seconds=2)

    # Stopping while the pods have their grace, then how they ended; never FAILED, though the
    # Job controller fails the Job once the stopped pods have.
    seen = [(s.state, s.native_state) for s in going]
    assert set(seen) <= {(BackendState.RUNNING, "Stopping"), (BackendState.CANCELLED, "CANCELLED")}
    assert seen[-1] == (BackendState.CANCELLED, "CANCELLED")
    assert (going[-1].exit_code, going[-1].node_exit_codes) == (SIGTERM_EXIT, {0: 143, 1: 143})
    assert going[-1].failure_class() == FailureClass.CANCELLED
    wait_until(lambda: everything(api, ns) == [[]] * 4)
    kubernetes.cancel(profile, ref)  # cancelling what is gone is a no-op
    assert kubernetes.poll(profile, ref).state.terminal


def test_a_job_held_by_a_finalizer_reads_as_cancelled_while_it_goes(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    started(kubelet, ns)
    path = f"{RESOURCES['jobs'].format(ns=ns)}/{NAME}"
    api.patch(path, json={"metadata": {"finalizers": ["example.com/audit"]}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip

    kubernetes.cancel(profile, ref)
    status = poll_until(profile, ref, BackendState.CANCELLED)  # the pods stopped first
    wait_until(lambda: names(api, ns, "pods") == [])

    assert status.failure_class() == FailureClass.CANCELLED
    assert kubernetes.poll(profile, ref).state == BackendState.CANCELLED  # while it goes
    api.patch(path, json={"metadata": {"finalizers": None}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip


# ---- poll_many: one pass over many attempts ----


def one_gpu_job(tmp_path: Path, profile: ClusterProfile, name: str, gpus: int = 1) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    config = folder / "ds_config.json"
    request = launch_request(tmp_path, profile, name=name, attempt_dir=folder, nodes=1,
                             procs_per_node=gpus, ds_config_path=config)  # fmt: skip
    return kubernetes.submit(request)


def test_one_pass_over_attempts_in_mixed_states_matches_polling_each_alone(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    kinds = ("pending", "unplaced", "running", "succeeded", "oom", "cancelled", "gone")
    # "unplaced" asks 9 GPUs of nodes that have 8: the scheduler says why it waits.
    refs = {w: one_gpu_job(tmp_path, profile, f"zp-mixed-{w}", 9 if w == "unplaced" else 1)
            for w in kinds}  # fmt: skip
    pods = {what: kubelet.wait_for_pods(ns, f"zp-mixed-{what}", 1)[0] for what in refs
            if what not in ("pending", "unplaced")}  # fmt: skip
    kubelet.run(ns, *pods.values())
    kubelet.set_log(ns, pods["succeeded"], "step 100 loss 0.8213\n")
    kubelet.exit(ns, pods["succeeded"], 0)
    kubelet.exit(ns, pods["oom"], 137, reason="OOMKilled")
    cancelled = f"{RESOURCES['jobs'].format(ns=ns)}/zp-mixed-cancelled"
    api.patch(cancelled, json={"metadata": {"finalizers": ["example.com/audit"]}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip
    kubernetes.cancel(profile, refs["cancelled"])
    api.delete(f"{RESOURCES['jobs'].format(ns=ns)}/zp-mixed-gone",
               params={"propagationPolicy": "Background"})  # fmt: skip
    expected = {
        "pending": BackendState.PENDING, "unplaced": BackendState.PENDING,
        "running": BackendState.RUNNING, "succeeded": BackendState.SUCCEEDED,
        "oom": BackendState.FAILED, "cancelled": BackendState.CANCELLED,
        "gone": BackendState.LOST,
    }  # fmt: skip
    for what, state in expected.items():
        poll_until(profile, refs[what], state)
    wait_until(lambda: "Unschedulable" in kubernetes.poll(profile, refs["unplaced"]).native_state)
    wait_until(lambda: kubelet.pods(ns, "zp-mixed-cancelled") == [])

    listing = profile.model_copy(update={"watch": False})  # test_kubernetes_watch: the copies
    before = calls_sent("kubernetes")
    together = kubernetes.poll_many(listing, list(refs.values()))
    calls = calls_sent("kubernetes") - before
    alone = {ref: kubernetes.poll(profile, ref) for ref in refs.values()}

    assert {what: together[ref].state for what, ref in refs.items()} == expected
    assert together == alone  # every field: state, exit codes, reason, log tail
    assert "step 100 loss 0.8213" in together[refs["succeeded"]].log_tail
    assert together[refs["oom"]].failure_class() == FailureClass.OOM_HOST
    # One LIST of Jobs, one of Pods, and the log of each of the two Jobs that ended (the
    # cancelled one's stopped pod is gone, its log with it).
    assert calls == 4
    api.patch(cancelled, json={"metadata": {"finalizers": None}},
              headers={"Content-Type": "application/merge-patch+json"})  # fmt: skip


def test_logs_are_each_nodes_tail_under_its_pod_name(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile))
    first, second = started(kubelet, ns)
    kubelet.set_log(ns, first, "".join(f"step {i} loss 1.0\n" for i in range(1, 6)))
    kubelet.set_log(ns, second, '{"rank": 8, "note": "a JSON-looking line stays text"}\n')

    text = kubernetes.logs(profile, ref, tail_lines=2)

    assert text == (
        f"==> {first} <==\nstep 4 loss 1.0\nstep 5 loss 1.0\n"
        f'==> {second} <==\n{{"rank": 8, "note": "a JSON-looking line stays text"}}'
    )
    assert kubernetes.log_path(ref) is None


def test_logs_of_a_single_node_job_have_no_header(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref = kubernetes.submit(launch_request(tmp_path, profile, nodes=1))
    (pod,) = kubelet.wait_for_pods(ns, NAME, 1)
    assert kubernetes.logs(profile, ref) == ""  # not started: the server answers 200, empty
    kubelet.run(ns, pod)
    kubelet.set_log(ns, pod, "one\ntwo\nthree\n")

    assert kubernetes.logs(profile, ref, tail_lines=2) == "two\nthree"


# ---- with the rights the deployment grants, under the real RBAC authorizer ----


def test_the_deployments_role_grants_everything_a_launch_uses(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path
) -> None:
    manifests = yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "zeropilot.yaml").read_text())
    role = next(m for m in manifests if m and m["kind"] == "Role")
    base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    role_body = {"metadata": {"name": "zeropilot-launcher"}, "rules": role["rules"]}
    assert api.post(f"{base}/roles", json=role_body).is_success
    account = {"metadata": {"name": "zeropilot-worker"}}
    assert api.post(f"/api/v1/namespaces/{ns}/serviceaccounts", json=account).is_success
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role"}
    binding = {
        "metadata": {"name": "zeropilot-worker-launches"},
        "roleRef": {**role_ref, "name": "zeropilot-launcher"},
        "subjects": [{"kind": "ServiceAccount", "name": "zeropilot-worker", "namespace": ns}],
    }
    assert api.post(f"{base}/rolebindings", json=binding).is_success
    issued = api.post(
        f"/api/v1/namespaces/{ns}/serviceaccounts/zeropilot-worker/token",
        json={"spec": {"expirationSeconds": 3600}},
    )
    token = issued.json()["status"]["token"]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", plane.url, plane.certs / "ca.crt", token)
    profile = k8s_profile(kubeconfig, namespace=ns)

    ref = kubernetes.submit(launch_request(tmp_path, profile))
    pods = started(kubelet, ns)
    kubelet.set_log(ns, pods[0], "step 1 loss 4.2\n")
    running = poll_until(profile, ref, BackendState.RUNNING)
    text = kubernetes.logs(profile, ref)
    kubernetes.cancel(profile, ref)
    poll_until(profile, ref, BackendState.CANCELLED)  # its pods deleted, then the rest

    assert running.state == BackendState.RUNNING
    assert "step 1 loss 4.2" in text
    wait_until(lambda: everything(api, ns) == [[]] * 4)
    elsewhere = k8s_profile(kubeconfig, namespace="default")
    with pytest.raises(PermanentError, match="forbidden"):  # and nothing beyond its namespace
        kubernetes.submit(launch_request(tmp_path, elsewhere))
    # The namespace's GPU quota, which bounds admission there, is readable with the same rights.
    assert kubernetes.gpu_bound(profile) is None
    body = {"metadata": {"name": "team-ml"}, "spec": {"hard": {"requests.nvidia.com/gpu": "16"}}}
    assert api.post(f"/api/v1/namespaces/{ns}/resourcequotas", json=body).is_success
    words = f"namespace quota {ns}/team-ml: requests.nvidia.com/gpu=16"
    assert kubernetes.gpu_bound(profile) == (16, words)
    with pytest.raises(PermanentError, match="forbidden"):
        kubernetes.gpu_bound(elsewhere)
    review = {  # the gang timeout suspends a Job with a patch: the Role must allow it
        "spec": {"resourceAttributes": {"namespace": ns, "verb": "patch", "group": "batch",
                                        "resource": "jobs"}},
    }  # fmt: skip
    answer = api.post(
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json=review,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.json()["status"]["allowed"] is True, answer.text


# ---- the worker's launch and reconcile on a Kubernetes cluster profile ----

PLAN = {"zero_stage": 2, "activation_checkpointing": False, "ds_config": DS_CONFIG}


def test_the_worker_launches_and_follows_a_job_to_succeeded(
    ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)

    launch_attempt(settings, attempt_id)
    job, attempt = load(settings, job_id, attempt_id)
    assert (job.status, attempt.backend_ref) == (
        JobStatus.LAUNCHING, f"{ns}/{attempt.backend_name}",
    )  # fmt: skip
    pods = started(kubelet, ns, name=attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    running, _ = load(settings, job_id, attempt_id)
    for pod in pods:
        kubelet.exit(ns, pod, 0)
    job_condition(kubelet.api, ns, "Complete", attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    done, finished = load(settings, job_id, attempt_id)

    assert running.status == JobStatus.RUNNING
    assert (done.status, finished.status, finished.exit_code) == (
        JobStatus.SUCCEEDED, AttemptStatus.SUCCEEDED, 0,
    )  # fmt: skip
    _argv, env = kubelet_view(kubelet.pod(ns, pods[0]))
    assert env["ZEROPILOT_ATTEMPT_ID"] == attempt_id
    assert env["ZEROPILOT_DS_CONFIG"] == "/etc/zeropilot/ds_config.json"
    # The token is not in the pod spec: a file from the attempt's Secret, owned by the Job.
    token = attempt_token(settings.secret_key(), attempt_id)
    assert token not in json.dumps(kubelet.pod(ns, pods[0]))
    assert env["ZEROPILOT_ATTEMPT_TOKEN_FILE"] == "/etc/zeropilot/attempt-token"
    secret = kubelet.api.get(f"/api/v1/namespaces/{ns}/secrets/{attempt.backend_name}").json()
    assert base64.b64decode(secret["data"]["attempt-token"]).decode() == token
    assert secret["metadata"]["ownerReferences"][0]["name"] == attempt.backend_name


def test_the_worker_records_a_quota_rejection_as_a_launch_error(
    api: httpx.Client, ns: str, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)
    quota(api, ns, {"count/jobs.batch": "0"})

    launch_attempt(settings, attempt_id)
    job, attempt = load(settings, job_id, attempt_id)

    assert (job.status, job.failure_class) == (JobStatus.FAILED, FailureClass.LAUNCH_ERROR)
    assert "exceeded quota: team-ml" in (attempt.failure_message or "")


def test_an_evicted_node_relaunches_the_same_plan(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)
    launch_attempt(settings, attempt_id)
    _job, attempt = load(settings, job_id, attempt_id)
    _first, second = started(kubelet, ns, name=attempt.backend_name)
    reconcile_attempt(settings, attempt_id)

    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": second}}
    assert api.post(f"/api/v1/namespaces/{ns}/pods/{second}/eviction", json=eviction).is_success
    job_condition(api, ns, "Failed", attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    job, evicted = load(settings, job_id, attempt_id)

    assert (evicted.status, evicted.failure_class) == (AttemptStatus.FAILED, FailureClass.NODE_LOST)
    assert (job.status, job.current_attempt) == (JobStatus.QUEUED, 2)
    with Session(get_engine(settings.database_url)) as session:
        retry = job_store.current_attempt(session, job)
        assert retry is not None
        assert (retry.plan, retry.rung) == (
            evicted.plan,
            "retry after a disruption (DisruptionTarget)",
        )
        retry_id = retry.id
    launch_attempt(settings, retry_id)
    _job, relaunched = load(settings, job_id, retry_id)
    assert kubelet.wait_for_pods(ns, relaunched.backend_name, 2)  # the real controller's pods


def test_the_worker_shows_why_the_controller_cannot_create_a_pod(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)
    quota(api, ns, {"requests.nvidia.com/gpu": "16"})  # the whole Job fits
    hold_gpus(api, ns, "other-team", 8)  # but another pod holds half of it today

    launch_attempt(settings, attempt_id)
    _job, attempt = load(settings, job_id, attempt_id)
    kubelet.wait_for_pods(ns, attempt.backend_name, 1)

    def recorded() -> Attempt | None:
        reconcile_attempt(settings, attempt_id)
        _job, seen = load(settings, job_id, attempt_id)
        return seen if seen.native_state == "FailedCreate" else None

    waiting = wait_until(recorded)  # what `zeropilot status --json` shows for the attempt
    assert "exceeded quota: team-ml" in (waiting.failure_message or "")
    assert load(settings, job_id, attempt_id)[0].status == JobStatus.LAUNCHING


def test_the_worker_records_a_cancel_as_cancelled_once_the_job_is_gone(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)
    launch_attempt(settings, attempt_id)
    started(kubelet, ns, name=load(settings, job_id, attempt_id)[1].backend_name)
    reconcile_attempt(settings, attempt_id)
    with Session(get_engine(settings.database_url)) as session:  # what POST .../cancel does
        job = session.get(Job, job_id)
        assert job is not None and job.status == JobStatus.RUNNING
        move_job(session, job, JobStatus.active(), JobStatus.CANCELLED, "cancelled by alice")
        session.commit()
    kubelet.hold_stopped_s = 3.0  # as a real kubelet: the stopped pods go after a while

    cancel_attempt(settings, attempt_id)

    def ended() -> Attempt | None:  # each pass sends the stop again until the attempt ended
        reconcile_attempt(settings, attempt_id)
        _job, seen = load(settings, job_id, attempt_id)
        return seen if AttemptStatus(seen.status).terminal else None

    attempt = wait_until(ended)
    wait_until(lambda: everything(api, ns) == [[]] * 4)
    reconcile_attempt(settings, attempt_id)  # gone now: poll alone would say LOST
    job, again = load(settings, job_id, attempt_id)

    assert (job.status, attempt.status) == (JobStatus.CANCELLED, AttemptStatus.CANCELLED)
    assert (attempt.exit_code, again.status) == (SIGTERM_EXIT, AttemptStatus.CANCELLED)


def shared_volume(api: httpx.Client, ns: str, folder: Path) -> str:
    """A ReadWriteMany claim bound to a hostPath volume at ``folder`` (the scheduler places a
    pod only once its claim is bound); returns the claim's name."""
    volume = f"{ns}-shared"
    spec = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
            "hostPath": {"path": str(folder)}, "storageClassName": "",
            "claimRef": {"namespace": ns, "name": "shared-data"}}  # fmt: skip
    assert api.post("/api/v1/persistentvolumes",
                    json={"metadata": {"name": volume}, "spec": spec}).is_success  # fmt: skip
    claim = {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
             "resources": {"requests": {"storage": "1Gi"}}}  # fmt: skip
    path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
    assert api.post(path, json={"metadata": {"name": "shared-data"}, "spec": claim}).is_success
    wait_until(lambda: api.get(f"{path}/shared-data").json()["status"].get("phase") == "Bound")
    return "shared-data"


def test_logs_of_pods_on_the_shared_volume_are_read_through_the_api(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, plane: ControlPlane, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    claim = shared_volume(api, ns, tmp_path)
    settings, job_id, attempt_id = queued_kubernetes_job(
        plane,
        ns,
        tmp_path,
        monkeypatch,
        shared_volume_claim=claim,
        shared_volume_path=str(tmp_path),
    )
    launch_attempt(settings, attempt_id)
    _job, attempt = load(settings, job_id, attempt_id)
    pods = started(kubelet, ns, name=attempt.backend_name)
    for index, pod in enumerate(pods):  # each node's ranks print; rank 0 is on node 0
        trainer = f"print('node {index}: step 30 loss 2.1403', flush=True)"
        assert kubelet.run_container(ns, pod, [sys.executable, "-c", trainer]) == 0
    job_condition(api, ns, "Complete", attempt.backend_name)
    reconcile_attempt(settings, attempt_id)
    with Session(get_engine(settings.database_url)) as session:
        token = create_user(session, "bob", "vision")  # alice's teammate
        session.commit()
    with TestClient(create_app(settings)) as client:
        answer = client.get(f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {token}"})
        status = client.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    api.delete(f"/api/v1/persistentvolumes/{ns}-shared")

    assert status.json()["status"] == "SUCCEEDED"
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"] == "node 0: step 30 loss 2.1403\n"
    node_1 = settings.attempts_dir / attempt.backend_name / "node-1.log"
    assert node_1.read_text() == "node 1: step 30 loss 2.1403\n"


def test_logs_of_pods_without_the_shared_volume_say_where_they_are(
    ns: str, plane: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, job_id, attempt_id = queued_kubernetes_job(plane, ns, tmp_path, monkeypatch)
    launch_attempt(settings, attempt_id)
    with Session(get_engine(settings.database_url)) as session:
        token = create_user(session, "bob", "vision")
        session.commit()
    with TestClient(create_app(settings)) as client:
        answer = client.get(f"/v1/jobs/{job_id}/logs", headers={"Authorization": f"Bearer {token}"})

    assert answer.status_code == 200, answer.text
    assert "mount no shared volume" in answer.json()["text"]
    assert "kubectl logs" in answer.json()["text"]


def queued_kubernetes_job(
    plane: ControlPlane,
    ns: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    **profile_changes: Any,
) -> tuple[Settings, str, str]:
    """A job for a kubernetes cluster profile (from the profiles file), QUEUED in SQLite."""
    profiles = tmp_path / "clusters.yaml"
    fields = k8s_profile(plane.kubeconfig, namespace=ns, **profile_changes).model_dump(
        mode="json", exclude_defaults=True
    )
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


# ---- what only the loopback stand-in can show ----


def test_a_launch_the_api_server_asks_to_wait_waits_as_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 429 with Retry-After: the next try comes no sooner than the server asked (17 s), over
    # the first back-off (workers.launch_retry_delay_s, 5 s) and within the lease (30 s).
    def busy(_resource: str, _obj: dict[str, Any]) -> None:
        raise ApiError(
            429, "TooManyRequests", "the server has received too many requests",
            headers={"Retry-After": "17"},
        )  # fmt: skip

    with loopback_api_server() as server:
        server.admission = busy
        stand_in = SimpleNamespace(kubeconfig=server.write_kubeconfig(tmp_path / "kubeconfig"))
        settings, _job_id, attempt_id = queued_kubernetes_job(stand_in, "ml", tmp_path, monkeypatch)
        with pytest.raises(TemporaryError) as raised:
            kubernetes.submit(
                launch_request(tmp_path, k8s_profile(stand_in.kubeconfig, namespace="ml"))
            )
        wait = launch_attempt(settings, attempt_id)

    assert raised.value.delay_s == 17.0
    assert wait == 17.0


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (400, "BadRequest", PermanentError),  # an admission webhook's denial
        (429, "TooManyRequests", TemporaryError),
        (500, "InternalError", TemporaryError),
    ],
)
def test_api_errors_carry_intent(
    tmp_path: Path, code: int, reason: str, expected: type[Exception]
) -> None:
    # The loopback stand-in, because the control plane here runs no admission webhook and
    # cannot be made to answer 400, 429 or 500 to a create on demand.
    message = f'admission webhook "policy.example.org" denied the request: {reason}'

    def reject(resource: str, _obj: dict[str, Any]) -> None:
        raise ApiError(code, reason, message)

    with loopback_api_server() as server:
        server.admission = reject
        profile = k8s_profile(server.write_kubeconfig(tmp_path / "kubeconfig"), namespace="ml")

        with pytest.raises(expected, match="denied the request"):
            kubernetes.submit(launch_request(tmp_path, profile))
