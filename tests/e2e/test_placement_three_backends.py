"""``cluster: auto`` across three real clusters, with team quotas, through the whole service.

The profiles: ``k8s-gpu`` (H100 nodes of 8 GPUs behind the tests' real Kubernetes control plane,
zeropilot admits 8 GPUs there; the kubelet is played by the test), ``slurm-local`` (the tests'
two-node Slurm) and ``cpu-box`` (the local backend); the last two mount the same storage
(``host-disk``: the Slurm nodes are namespaces of this host). DeepSpeed ranks on gloo are real
on Slurm and on the local backend.

1. A job asking for 8 GPUs per node fits only ``k8s-gpu``: it goes there, and the record says why
   the others are ruled out.
2. With ``k8s-gpu`` full (that job's 10 M steps hold it), a 2-GPU job goes where it is predicted
   to end first, a cluster that starts it now, and the record gives each one's start and end.
3. That job, stopped from outside Slurm after it saved, gets a new attempt whose launch fails for
   good (the profile's slurm.conf is gone): it is re-placed on ``cpu-box`` (not on ``k8s-gpu``,
   which does not mount its checkpoints), resumes at the step after the saved one, and succeeds.

The workers pause ``PAUSE_S`` before each submit (``workers.fault_pause_before_submit_s``): the
window in which the test removes slurm.conf once the new attempt is claimed, so that the first
attempt's end is still read from Slurm and only the new launch meets the broken profile.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.db.migrate import upgrade
from tests.e2e.stack import Api, Stack
from tests.e2e.test_kubernetes_stack import kubernetes_profile, play_the_kubelet
from tests.e2e.test_preemption import wait_until
from tests.e2e.test_slurm_stack import BRIDGE_ADDRESS
from tests.integration.helpers import three_users, tiny_spec
from tests.integration.k8s_control_plane import ControlPlane
from tests.integration.slurm_fixtures import LocalSlurm, slurm_profile
from workers.backends import slurm

pytestmark = pytest.mark.slow
K8S, SLURM, CPU = "k8s-gpu", "slurm-local", "cpu-box"
STORAGE = "host-disk"
PAUSE_S = 5  # before each submit: the test sees the claimed attempt well within it
STEPS = 120  # the stop lands after step 3, far from the end


@pytest.fixture
def three_clusters(
    tmp_path: Path, postgres_url: str, redis_url: str, slurm_cluster: LocalSlurm,
    kube_control_plane: ControlPlane, namespace: str,
) -> Iterator[Stack]:  # fmt: skip
    conf = tmp_path / "slurm-etc" / "slurm.conf"  # a copy, so that the test may remove it
    conf.parent.mkdir()
    for name in ("slurm.conf", "cgroup.conf"):
        shutil.copy(slurm_cluster.conf.parent / name, conf.parent / name)
    k8s = {**kubernetes_profile(kube_control_plane, namespace), "name": K8S, "max_gpus": 8}
    on_slurm = slurm_profile(slurm_cluster, slurm_conf=str(conf), storage=STORAGE)
    cpu = {"name": CPU, "kind": "local", "gpus_per_node": 2, "storage": STORAGE}
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": [k8s, on_slurm.model_dump(mode="json"), cpu]}))
    upgrade(postgres_url)
    stack = Stack(
        tmp_path / "data", postgres_url, redis_url,
        host="0.0.0.0",  # the Slurm ranks report from the nodes' network namespaces
        clusters__profiles_file=str(profiles),
        workers__fault_pause_before_submit_s=str(PAUSE_S),
    )  # fmt: skip
    stack.env["ZEROPILOT_API__PUBLIC_URL"] = f"http://{BRIDGE_ADDRESS}:{stack.port}"
    stack.start_api()
    yield stack
    stack.stop()
    for recorded in (stack.data_dir / "attempts").glob(f"*/{slurm.JOB_ID_FILE}"):
        slurm_cluster.command("scancel", recorded.read_text().strip())  # none left running


def auto_job(name: str, gpus: int, steps: int) -> dict[str, Any]:
    """A tiny-gpt job placed by zeropilot, of known length, runnable on any of the three."""
    spec = tiny_spec(name, steps=steps, checkpoint={"grace_s": 20})
    resources = {"cluster": "auto", "clusters": [K8S, SLURM, CPU], "nodes": 1,
                 "gpus_per_node": gpus}  # fmt: skip
    return {
        **spec,
        "args": ["--steps", str(steps), "--checkpoint-interval", "100000"],
        "image": "registry.example/zeropilot-examples:1",  # Kubernetes runs images
        "training": {**spec["training"], "steps": steps},
        "resources": resources,
    }


UNIT_S = {"s": 1, "min": 60, "h": 3600, "days": 86400}


def ends_in_s(reason: str, cluster: str) -> float:
    """The predicted end the record gives for one cluster, in seconds (as rounded there)."""
    found = re.search(rf"(?:placed on |; ){cluster}\b.*?ends in ([0-9.]+) (s|min|h|days)\b", reason)
    assert found, reason
    return float(found[1]) * UNIT_S[found[2]]


def test_auto_placement_across_local_slurm_and_kubernetes(
    three_clusters: Stack, postgres_url: str, kube_control_plane: ControlPlane, namespace: str,
    slurm_cluster: LocalSlurm,
) -> None:  # fmt: skip
    began = time.monotonic()
    stack, kubelet = three_clusters, kube_control_plane.kubelet
    assert kubelet is not None
    apis = {name: Api(stack.url, token) for name, token in three_users(postgres_url).items()}
    for team, quota in (("speech", 8), ("vision", 2)):
        answer = apis["root"].http.patch(f"/v1/teams/{team}", json={"gpu_quota": quota})
        assert answer.status_code == 200, answer.text
    stack.start_worker("w1")
    bob, alice = apis["bob"], apis["alice"]

    # 1. Only Kubernetes offers 8 GPUs per node.
    wide = bob.submit(auto_job("wide", gpus=8, steps=10_000_000))
    assert wide["cluster"] == K8S, wide["advice_reason"]
    assert wide["advice_reason"].startswith(f"placed on {K8S} (ZeRO-")
    for other in (SLURM, CPU):
        assert (
            f"{other}: ruled out, has 2 GPUs per node, the job asks for 8"
            in (wide["advice_reason"])
        )
    launching = bob.wait_for(wide["id"], {"LAUNCHING", "RUNNING", "FAILED"}, stack, 120)
    pods = play_the_kubelet(kubelet, namespace, launching["attempts"][0]["backend_name"])
    assert bob.wait_for(wide["id"], {"RUNNING", "FAILED"}, stack, 60)["status"] == "RUNNING"
    assert kubelet.pod(namespace, pods[0])["spec"]["nodeName"].startswith("gpu-node-")

    # 2. Kubernetes is full until that job ends: the 2-GPU job goes where it ends first.
    job = alice.submit(auto_job("moving", gpus=2, steps=STEPS))
    reason = job["advice_reason"]
    assert (job["cluster"], job["status"]) == (SLURM, "QUEUED"), reason
    assert f"{K8S}: ZeRO-" in reason
    assert f"waits: cluster {K8S} has 8 of its 8 GPUs admitted; this job needs 2 (expected to" in (
        reason
    )
    assert re.search(rf"placed on {SLURM} \(ZeRO-[^)]*, starts now, ends in ", reason), reason
    assert re.search(rf"{CPU}: ZeRO-[^;]*, starts now, ends in ", reason), reason
    assert ends_in_s(reason, SLURM) < ends_in_s(reason, K8S)

    # 3. Stopped from outside after some steps; the next launch on Slurm fails for good.
    wait_until(lambda: len(alice.http.get(f"/v1/jobs/{job['id']}/metrics").json()) >= 3,
               "steps on Slurm", stack)  # fmt: skip
    slurm_id, _ = slurm.decode_ref(alice.job(job["id"])["attempts"][0]["backend_ref"])
    slurm_cluster.command("scancel", "--signal=TERM", slurm_id)  # a drain: the ranks save first

    def second_claimed() -> bool:
        attempts = alice.job(job["id"])["attempts"]
        return len(attempts) >= 2 and attempts[1]["status"] == "LAUNCHING"

    wait_until(second_claimed, "a second attempt launching", stack, timeout_s=240)
    conf = Path(slurm_profile_conf(stack))
    conf.unlink()  # within the worker's pause before its sbatch
    done = alice.wait_for(job["id"], {"SUCCEEDED", "FAILED"}, stack, timeout_s=420)

    assert done["status"] == "SUCCEEDED", (done["message"], stack.logs())
    assert done["cluster"] == CPU
    stopped, refused, resumed = done["attempts"]
    assert (stopped["backend"], stopped["status"]) == ("slurm", "PREEMPTED")
    assert stopped["exit_code"] == 75  # zeropilot.runtime.STOPPED_EXIT_CODE: it saved first
    saved = next(c for c in done["checkpoints"] if c["attempt_id"] == stopped["id"])
    assert refused["rung"].startswith("resume after a stop")
    assert (refused["status"], refused["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert f"slurm_conf {conf} is not a file here" in refused["failure_message"]
    assert resumed["rung"] == f"re-placed on {CPU} after the launch on {SLURM} failed"
    assert (resumed["backend"], resumed["status"]) == ("local", "SUCCEEDED")
    assert resumed["resumed_from"] == saved["path"]
    steps = [m["step"] for m in done["metrics"] if m["attempt_id"] == resumed["id"]]
    assert min(steps) == saved["step"] + 1 and max(steps) == STEPS  # on from the saved step
    moved = next(e["reason"] for e in done["events"] if e["to_status"] == "PENDING" and
                 e["reason"].startswith(f"launch on {SLURM} failed ("))  # fmt: skip
    assert f"from the step-{saved['step']} checkpoint (native)" in moved
    assert re.search(rf"placed on {CPU} \(ZeRO-[^)]*, starts now, ends in ", moved), moved
    assert f"{SLURM}: ruled out, a launch of this job failed there" in moved
    assert (
        f"{K8S}: ruled out, its checkpoints are on storage {STORAGE} of {SLURM}, which this"
        " cluster does not mount" in moved
    )
    assert "; local:" not in moved  # outside the job's list of clusters

    for pod in pods:  # the Kubernetes job ends too
        kubelet.exit(namespace, pod, 0)
    assert bob.wait_for(wide["id"], {"SUCCEEDED", "FAILED"}, stack, 60)["status"] == "SUCCEEDED"
    print(
        f"{time.monotonic() - began:.0f} s; at submit: {reason}\nafter the failed launch: {moved}"
    )
    print(f"saved step {saved['step']} on {SLURM}, resumed at {min(steps)} on {CPU}")


def slurm_profile_conf(stack: Stack) -> str:
    profiles = yaml.safe_load(Path(stack.env["ZEROPILOT_CLUSTERS__PROFILES_FILE"]).read_text())
    return str(next(p["slurm_conf"] for p in profiles["clusters"] if p["name"] == SLURM))
