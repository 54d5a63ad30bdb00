"""examples/tiny-gpt.yaml on a Kubernetes cluster profile through the whole service.

HTTP -> API -> Celery worker -> the Kubernetes backend -> the real control plane
(``kube_control_plane``: kube-apiserver, the Job controller, the scheduler). The real Job
controller creates the pods and the real scheduler binds them to the GPU nodes; the test plays
only the kubelet: it starts the containers, serves the training log, and lets every rank exit 0.
The job must end SUCCEEDED with the events a user reads. (This profile has no shared volume, so
``GET /v1/jobs/{id}/logs`` has no text here: the API never talks to a cluster. With
``shared_volume_claim`` each pod writes its log into the attempt folder, where the API reads it:
``test_kubernetes_backend``'s logs tests; docs/kubernetes.md.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlmodel import Session

from service.core.clusters import ClusterProfile
from service.db.migrate import upgrade
from service.db.models import ClusterBound
from service.db.session import get_engine
from tests.e2e.conftest import user_token
from tests.e2e.stack import Api, Stack
from tests.integration.helpers import REPO
from tests.integration.k8s_control_plane import ControlPlane
from tests.integration.k8s_kubelet import FakeKubelet, kubelet_view
from workers.backends import kubernetes

pytestmark = pytest.mark.slow
PROFILE = "k8s-gpu"
TRAINING_LOG = "".join(f"step {s:5d}  loss {5.0 - s * 0.14:.4f}  tokens/s 6,100\n" for s in (1, 30))


def kubernetes_profile(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    """A cluster profile for the stack: two-GPU H100 nodes behind the test control plane."""
    return {
        "name": PROFILE,
        "kind": "kubernetes",
        "accelerator": "nvidia-h100-80gb",
        "gpu_memory_gib": 80,
        "gpus_per_node": 8,
        "cpu_memory_gib": 64,
        "max_nodes": 2,
        "namespace": namespace,
        "kubeconfig": str(plane.kubeconfig),
    }


@pytest.fixture
def k8s_stack(
    tmp_path: Path, postgres_url: str, redis_url: str, kube_control_plane: ControlPlane,
    namespace: str,
) -> Iterator[Stack]:  # fmt: skip
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(
        yaml.safe_dump({"clusters": [kubernetes_profile(kube_control_plane, namespace)]})
    )
    upgrade(postgres_url)
    stack = Stack(tmp_path / "data", postgres_url, redis_url, clusters__profiles_file=str(profiles))
    stack.start_api()
    stack.start_worker("w1")
    yield stack
    stack.stop()


def play_the_kubelet(kubelet: FakeKubelet, namespace: str, job_name: str) -> list[str]:
    """Every rank starts, trains (its log says so) and exits 0."""
    pods = kubelet.wait_for_pods(namespace, job_name, 1, timeout_s=60)
    kubelet.run(namespace, *pods)
    for pod in pods:
        kubelet.set_log(namespace, pod, TRAINING_LOG)
    return pods


def test_tiny_gpt_on_a_kubernetes_profile_succeeds_with_its_events(
    k8s_stack: Stack, postgres_url: str, kube_control_plane: ControlPlane, namespace: str
) -> None:
    kubelet = kube_control_plane.kubelet
    assert kubelet is not None
    api = Api(k8s_stack.url, user_token(postgres_url))
    spec = yaml.safe_load((REPO / "examples" / "tiny-gpt.yaml").read_text())
    spec["resources"]["cluster"] = PROFILE
    spec["image"] = "registry.example/zeropilot-examples:1"  # Kubernetes runs images
    spec["working_dir"] = "/workspace/examples"  # where that image holds train_tiny.py

    job = api.submit(spec)
    launching = api.wait_for(job["id"], {"LAUNCHING", "RUNNING", "FAILED"}, k8s_stack, 60)
    attempt = launching["attempts"][0]
    pods = play_the_kubelet(kubelet, namespace, attempt["backend_name"])
    api.wait_for(job["id"], {"RUNNING", "FAILED"}, k8s_stack, 60)
    for pod in pods:
        kubelet.exit(namespace, pod, 0)
    done = api.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, k8s_stack, 60)

    assert done["status"] == "SUCCEEDED", (done["message"], k8s_stack.logs())
    events = [(e["subject"], e["to_status"]) for e in done["events"]]
    assert [s for subject, s in events if subject == "job"] == [
        "PENDING", "QUEUED", "LAUNCHING", "RUNNING", "SUCCEEDED",
    ]  # fmt: skip
    reasons = [e["reason"] for e in done["events"]]
    assert f"attempt 1 launching on {PROFILE}" in reasons
    assert "attempt 1 exited 0" in reasons
    attempt = done["attempts"][0]
    assert (attempt["backend"], attempt["status"], attempt["exit_code"]) == (
        "kubernetes", "SUCCEEDED", 0,
    )  # fmt: skip
    assert attempt["backend_ref"] == f"{namespace}/{attempt['backend_name']}"
    argv, env = kubelet_view(kubelet.pod(namespace, pods[0]))
    assert argv[argv.index("--node_rank") + 1] == "0"
    assert argv[argv.index("--node_rank") + 3 :][:3] == [
        f"{attempt['backend_name']}-0.{attempt['backend_name']}", "--master_port",
        argv[argv.index("--master_port") + 1],
    ]  # fmt: skip
    assert env["ZEROPILOT_ATTEMPT_ID"] == attempt["id"]
    assert "train_tiny.py" in argv
    # The worker's own read of the log: from the node's kubelet, through the API server.
    profile = ClusterProfile.model_validate(kubernetes_profile(kube_control_plane, namespace))
    assert "step    30  loss 0.8000" in kubernetes.logs(profile, attempt["backend_ref"])


def test_two_jobs_that_the_namespace_gpu_quota_cannot_hold_at_once_run_in_turn(
    tmp_path: Path, postgres_url: str, redis_url: str, kube_control_plane: ControlPlane,
    namespace: str,
) -> None:  # fmt: skip
    """The namespace's ResourceQuota allows 16 GPUs and each job asks for 2 nodes x 8: the
    worker reads the quota, admission starts the first job only, the second waits in
    zeropilot's queue (no Kubernetes object of its own) with the quota in its reason, and runs
    once the first has ended. Had both been launched, each could hold half the quota for ever."""
    kubelet, control = kube_control_plane.kubelet, kube_control_plane.api
    assert kubelet is not None and control is not None
    hard = {"requests.nvidia.com/gpu": "16"}
    body = {"metadata": {"name": "team-gpus"}, "spec": {"hard": hard}}
    assert control.post(f"/api/v1/namespaces/{namespace}/resourcequotas", json=body).is_success
    profiles = tmp_path / "clusters.yaml"
    profile = kubernetes_profile(kube_control_plane, namespace)
    profiles.write_text(yaml.safe_dump({"clusters": [profile]}))
    upgrade(postgres_url)
    stack = Stack(tmp_path / "data", postgres_url, redis_url, clusters__profiles_file=str(profiles))
    try:
        stack.start_api()
        stack.start_worker("w1")
        _wait_for_bound(postgres_url, PROFILE, stack)
        api = Api(stack.url, user_token(postgres_url))
        spec = yaml.safe_load((REPO / "examples" / "tiny-gpt.yaml").read_text())
        spec["resources"].update(cluster=PROFILE, nodes=2, gpus_per_node=8)
        spec["training"]["global_batch_size"] = 32  # divisible by 16 ranks
        spec["image"] = "registry.example/zeropilot-examples:1"
        spec["working_dir"] = "/workspace/examples"
        first = api.submit({**spec, "name": "first"})
        second = api.submit({**spec, "name": "second"})

        launching = api.wait_for(first["id"], {"LAUNCHING", "RUNNING", "FAILED"}, stack, 60)
        waiting = api.job(second["id"])
        assert waiting["status"] == "PENDING", waiting
        quota_words = f"namespace quota {namespace}/team-gpus: requests.nvidia.com/gpu=16"
        assert waiting["message"] == (
            f"waiting: cluster {PROFILE} has 16 of its 16 GPUs admitted ({quota_words});"
            " this job needs 16"
        )
        name = launching["attempts"][0]["backend_name"]
        jobs_there = control.get(f"/apis/batch/v1/namespaces/{namespace}/jobs").json()["items"]
        assert [j["metadata"]["name"] for j in jobs_there] == [name]  # none for the second
        _run_and_end(kubelet, namespace, name)
        assert api.wait_for(first["id"], {"SUCCEEDED", "FAILED"}, stack, 60)["status"] == (
            "SUCCEEDED"
        )

        started = api.wait_for(second["id"], {"LAUNCHING", "RUNNING", "FAILED"}, stack, 60)
        _run_and_end(kubelet, namespace, started["attempts"][0]["backend_name"])
        done = api.wait_for(second["id"], {"SUCCEEDED", "FAILED"}, stack, 60)
        assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
        print("the second job waited:", waiting["message"])  # for the docs
    finally:
        stack.stop()


def _wait_for_bound(database_url: str, cluster: str, stack: Stack) -> None:
    """Until the worker's first pass has recorded the namespace's quota."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with Session(get_engine(database_url)) as session:
            if session.get(ClusterBound, cluster) is not None:
                return
        time.sleep(0.5)
    raise AssertionError(f"the worker recorded no bound for {cluster}:\n{stack.logs()}")


def _run_and_end(kubelet: FakeKubelet, namespace: str, job_name: str) -> None:
    """Both nodes' pods start, train and exit 0."""
    pods = kubelet.wait_for_pods(namespace, job_name, 2, timeout_s=60)
    kubelet.run(namespace, *pods)
    for pod in pods:
        kubelet.set_log(namespace, pod, TRAINING_LOG)
        kubelet.exit(namespace, pod, 0)
