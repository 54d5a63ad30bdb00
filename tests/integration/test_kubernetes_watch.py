"""The reconcile pass's watched copy of Jobs and Pods, against the real control plane.

A pass reads the worker's copy instead of LISTing the namespace: after the first pass (one LIST
each of Jobs and Pods), a pass sends no request for attempts whose Jobs go on as they were, and
what it answers equals polling each attempt alone. The copy survives a dropped connection (the
watch resumes from its version) and a worker's restart (a new copy starts with a LIST), so no
ending is missed.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.core.clusters import ClusterProfile
from service.core.failures import FailureClass
from tests.integration import test_kubernetes_backend as backend_tests
from tests.integration.k8s_kubelet import FakeKubelet
from tests.integration.test_kubernetes_backend import (
    RESOURCES,
    k8s_profile,
    one_gpu_job,
    poll_until,
    wait_until,
)
from workers.backends import kubernetes, kubernetes_watch
from workers.backends.base import BackendState, BackendStatus
from workers.backends.calls import calls_sent

pytestmark = pytest.mark.slow
# The backend tests' fixtures: the session's control plane and kubelet, a namespace per test.
plane, api, kubelet, ns = (
    backend_tests.plane,
    backend_tests.api,
    backend_tests.kubelet,
    backend_tests.ns,
)


@pytest.fixture
def profile(plane: backend_tests.ControlPlane, ns: str) -> ClusterProfile:
    return k8s_profile(plane.kubeconfig, namespace=ns)  # its copies stop after each test


def watched_pass(profile: ClusterProfile, refs: list[str]) -> tuple[dict[str, BackendStatus], int]:
    """One ``poll_many`` and the requests it sent (the watches' own are counted apart)."""
    before = calls_sent("kubernetes")
    statuses = kubernetes.poll_many(profile, refs)
    return dict(statuses), calls_sent("kubernetes") - before


def running_job(
    tmp_path: Path, profile: ClusterProfile, kubelet: FakeKubelet, ns: str, name: str
) -> tuple[str, str]:
    """A one-pod Job whose container runs: its ref and its pod."""
    ref = one_gpu_job(tmp_path, profile, name)
    (pod,) = kubelet.wait_for_pods(ns, name, 1)
    kubelet.run(ns, pod)
    poll_until(profile, ref, BackendState.RUNNING)
    return ref, pod


def states(statuses: dict[str, BackendStatus], refs: dict[str, str]) -> dict[str, BackendState]:
    return {what: statuses[ref].state for what, ref in refs.items()}


def test_a_watched_pass_sends_nothing_for_unchanged_jobs_and_matches_polling_each_alone(
    api: httpx.Client, ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    kinds = ("pending", "running", "succeeded", "oom", "gone")
    refs = {w: one_gpu_job(tmp_path, profile, f"zp-watch-{w}") for w in kinds}
    pods = {w: kubelet.wait_for_pods(ns, f"zp-watch-{w}", 1)[0] for w in kinds if w != "pending"}
    kubelet.run(ns, *[pods[w] for w in ("running", "succeeded", "oom", "gone")])
    for what in ("running", "succeeded", "oom", "gone"):
        poll_until(profile, refs[what], BackendState.RUNNING)

    first, first_calls = watched_pass(profile, list(refs.values()))  # starts the copies
    _, steady_calls = watched_pass(profile, list(refs.values()))
    # Then, with the copies watching: one ends, one is OOM-killed, one is deleted outside.
    kubelet.set_log(ns, pods["succeeded"], "step 100 loss 0.8213\n")
    kubelet.exit(ns, pods["succeeded"], 0)
    kubelet.exit(ns, pods["oom"], 137, reason="OOMKilled")
    api.delete(f"{RESOURCES['jobs'].format(ns=ns)}/zp-watch-gone",
               params={"propagationPolicy": "Background"})  # fmt: skip
    expected = {"pending": BackendState.PENDING, "running": BackendState.RUNNING,
                "succeeded": BackendState.SUCCEEDED, "oom": BackendState.FAILED,
                "gone": BackendState.LOST}  # fmt: skip
    for what, state in expected.items():
        poll_until(profile, refs[what], state)
    changed = wait_until(
        lambda: (
            states(answer := watched_pass(profile, list(refs.values()))[0], refs) == expected
            and answer
        )
    )
    _, changed_calls = watched_pass(profile, list(refs.values()))
    alone = {ref: kubernetes.poll(profile, ref) for ref in refs.values()}

    assert first_calls == 2  # the LISTs that start the two copies
    assert states(first, refs)["running"] == BackendState.RUNNING
    assert steady_calls == 0
    assert changed == alone  # every field: state, exit codes, reason, log tail
    assert changed[refs["oom"]].failure_class() == FailureClass.OOM_HOST
    assert "step 100 loss 0.8213" in changed[refs["succeeded"]].log_tail
    # The ended Jobs are read as they are now (GET, their pods, the log); the gone one's GET
    # says 404; the others cost nothing.
    assert changed_calls == 3 + 3 + 1


def test_a_dropped_watch_resumes_from_its_version_and_misses_nothing(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref, pod = running_job(tmp_path, profile, kubelet, ns, "zp-watch-dropped")
    watched_pass(profile, [ref])
    wait_until(lambda: all(mirror.watching for mirror in kubernetes_watch.mirrors()))
    opened = calls_sent(kubernetes_watch.WATCH_CALLS)

    for mirror in kubernetes_watch.mirrors():
        mirror.disconnect()  # as a network fault would
    kubelet.exit(ns, pod, 0)
    poll_until(profile, ref, BackendState.SUCCEEDED)
    ended = wait_until(
        lambda: (
            (answer := watched_pass(profile, [ref]))[0][ref].state == BackendState.SUCCEEDED
            and answer
        )
    )

    assert ended[1] == 3  # the ended Job read directly; no LIST: the copies went on
    wait_until(lambda: calls_sent(kubernetes_watch.WATCH_CALLS) >= opened + 2)  # both again
    assert all(mirror.running for mirror in kubernetes_watch.mirrors())


def test_a_worker_restarted_while_a_job_ends_sees_the_end(
    ns: str, kubelet: FakeKubelet, profile: ClusterProfile, tmp_path: Path
) -> None:
    ref, pod = running_job(tmp_path, profile, kubelet, ns, "zp-watch-restart")
    assert watched_pass(profile, [ref])[0][ref].state == BackendState.RUNNING

    kubernetes_watch.stop_all()  # the worker's process exits: its copies with it
    kubelet.exit(ns, pod, 1)
    poll_until(profile, ref, BackendState.FAILED)
    statuses, calls = watched_pass(profile, [ref])  # a new process: new copies, a LIST each

    assert statuses[ref].state == BackendState.FAILED
    assert calls == 2 + 3
    assert statuses[ref] == kubernetes.poll(profile, ref)


def test_without_watch_every_pass_lists(
    ns: str, kubelet: FakeKubelet, plane: backend_tests.ControlPlane, tmp_path: Path
) -> None:
    listing = k8s_profile(plane.kubeconfig, namespace=ns, watch=False)
    ref = one_gpu_job(tmp_path, listing, "zp-watch-off")
    kubelet.wait_for_pods(ns, "zp-watch-off", 1)

    calls = [watched_pass(listing, [ref])[1] for _ in range(2)]

    assert calls == [2, 2]
    assert kubernetes_watch.mirrors() == []
