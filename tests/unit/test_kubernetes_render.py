"""The objects the Kubernetes backend renders, checked without a cluster.

Every object is validated against the official OpenAPI schemas of two Kubernetes versions, and
the quoting is proven by running Kubernetes' own ``$(VAR)`` expansion rules over the rendered
command and environment (``expand_references``, written from the rules in
k8s.io/kubernetes third_party/forked/golang/expansion), not by reading the text.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from service.core.clusters import BackendKind, ClusterProfile
from service.core.spec import JobSpec
from tests.integration.k8s_kubelet import expand_references
from workers.backends.base import LaunchRequest, PermanentError
from workers.backends.kubernetes import decode_ref, encode_ref, log_path
from workers.backends.kubernetes_render import (
    container_env,
    escape_dollars,
    launcher_command,
    master_port,
    render_config_map,
    render_job,
    render_secret,
    render_service,
)

NAME = "zp-tiny-gpt-0f3a9c21-a1"
# Variables a careless rendering would let Kubernetes substitute; none of them may be.
DEFINED = {"JOB_COMPLETION_INDEX": "1", "whoami": "root", "HOME": "/root", "PATH": "/usr/bin"}
TINY_SPEC: dict[str, Any] = {
    "name": "tiny-gpt",
    "entrypoint": "train.py",
    "model": {"parameters": 1000000},
    "training": {"sequence_length": 32, "global_batch_size": 8},
    "resources": {"nodes": 1, "gpus_per_node": 2},
}
EVIL = [
    "$(whoami)",
    "`whoami`",
    "it's",
    'say "hi"',
    "a; rm -rf /",
    "first line\nsecond line",
    "$HOME ${PATH} $$ $(HOME",
    "$(JOB_COMPLETION_INDEX)",
    "trailing $",
    "",
]


def profile(**changes: Any) -> ClusterProfile:
    fields = {
        "name": "gpu-k8s",
        "kind": BackendKind.KUBERNETES,
        "accelerator": "nvidia-h100-80gb",
        "gpu_memory_gib": 80,
        "gpus_per_node": 8,
        "cpu_memory_gib": 512,
        "namespace": "ml",
        "nccl_env": {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "eth0"},
        **changes,
    }
    return ClusterProfile.model_validate(fields)


def request(tmp_path: Path, **changes: Any) -> LaunchRequest:
    base = LaunchRequest(
        name=NAME,
        attempt_dir=tmp_path / "attempt",
        nodes=2,
        procs_per_node=8,
        entrypoint="train.py",
        args=("--steps", "100"),
        ds_config_path=tmp_path / "attempt" / "ds_config.json",
        env={"ZEROPILOT_ATTEMPT_ID": "a1", "ZEROPILOT_DS_CONFIG": "/worker/attempt/ds.json"},
        working_dir=Path("/workspace"),
        profile=profile(),
        image="registry.example/train:1",
        time_limit_s=3600,
        python="/opt/worker-venv/bin/python",
    )
    return replace(base, **changes)


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def trainer(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(job)["containers"]
    return dict(container)


@pytest.mark.parametrize("version", ["1.29", "1.35"])
@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"accelerator": "cpu", "namespace": None},
        {"queue": "team-ml", "scheduler_name": "volcano", "cpus_per_node": 96},
        {"shared_volume_claim": "zeropilot-data"},
    ],
)
def test_every_object_passes_the_official_schema(
    tmp_path: Path, version: str, changes: dict[str, Any]
) -> None:
    launch = request(tmp_path, profile=profile(**changes), args=tuple(EVIL))
    objects = [
        render_job(launch),
        render_service(launch, "0b9e5a43-5c7a-4f6e-9d1e-6f1f3c2d8a71"),
        render_config_map(
            launch, '{"train_batch_size": 32}', "0b9e5a43-5c7a-4f6e-9d1e-6f1f3c2d8a71"
        ),
    ]
    for obj in objects:
        assert kubernetes_validate.validate(obj, version, strict=True) == version


def test_the_command_is_deepspeeds_ssh_less_launcher_in_exec_form(tmp_path: Path) -> None:
    launch = request(tmp_path)
    port = master_port(launch)

    command = trainer(render_job(launch))["command"]
    assert command[:2] == ["python3", "-c"] and command[3] == ""  # under TEE, with no log file
    assert command[4:] == [
        "python3", "-m", "deepspeed.launcher.runner", "--no_ssh",
        "--hostfile", "/etc/zeropilot/hostfile",
        "--node_rank", "$(JOB_COMPLETION_INDEX)",
        "--master_addr", f"{NAME}-0.{NAME}",
        "--master_port", str(port),
        "train.py", "--steps", "100",
        "--deepspeed_config", "/etc/zeropilot/ds_config.json",
    ]  # fmt: skip
    assert "args" not in trainer(render_job(launch))  # the image's entrypoint is not involved
    assert 29500 <= port <= 29999
    assert master_port(launch) == port  # a retried submit renders the same Job


def test_the_node_rank_is_the_only_reference_kubernetes_expands(tmp_path: Path) -> None:
    command = launcher_command(request(tmp_path))

    expanded = [expand_references(word, DEFINED) for word in command]

    assert expanded[expanded.index("--node_rank") + 1] == "1"
    assert [w for w in expanded if w != "1"] == [w for w in command if "$" not in w]


def test_user_arguments_and_env_values_arrive_literally(tmp_path: Path) -> None:
    launch = request(tmp_path, args=tuple(EVIL), env={f"EVIL_{i}": v for i, v in enumerate(EVIL)})
    command = launcher_command(launch)
    env = {entry["name"]: entry["value"] for entry in container_env(launch)}

    user_args = command[command.index("train.py") + 1 : command.index("--deepspeed_config")]
    assert user_args == [value.replace("$", "$$") for value in EVIL]
    assert [expand_references(arg, DEFINED) for arg in user_args] == EVIL
    for i, value in enumerate(EVIL):
        assert env[f"EVIL_{i}"] == value.replace("$", "$$")
        assert expand_references(env[f"EVIL_{i}"], {**DEFINED, **env}) == value
    # The rules bite: unescaped, Kubernetes would have run the substitution.
    assert expand_references("$(whoami)", DEFINED) == "root"


def test_a_nul_byte_is_refused() -> None:
    with pytest.raises(PermanentError, match="NUL"):
        escape_dollars("a\0b")


def test_env_is_defaults_then_profile_then_job_then_the_pods_own_paths(tmp_path: Path) -> None:
    launch = request(
        tmp_path,
        env={
            "NCCL_SOCKET_IFNAME": "ib0",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
            "MY_FLAG": "1",
            "ZEROPILOT_ATTEMPT_TOKEN": "zpa_0123",
        },
    )
    env = {entry["name"]: entry["value"] for entry in container_env(launch)}

    assert env == {
        "MY_FLAG": "1",
        "NCCL_IB_HCA": "mlx5",
        "NCCL_SOCKET_IFNAME": "ib0",  # the job's own value beats the profile's
        "PYTHONUNBUFFERED": "1",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "ZEROPILOT_DS_CONFIG": "/etc/zeropilot/ds_config.json",  # the mount, not the worker's path
        "ZEROPILOT_ATTEMPT_TOKEN_FILE": "/etc/zeropilot/attempt-token",  # from the Secret
    }


def test_the_token_is_in_the_attempts_secret_not_in_the_pod_spec(tmp_path: Path) -> None:
    launch = request(tmp_path, env={"ZEROPILOT_ATTEMPT_TOKEN": "zpa_0123"})

    secret = render_secret(launch, "uid-1")

    assert "zpa_0123" not in json.dumps(render_job(launch))
    assert base64.b64decode(secret["data"]["attempt-token"]) == b"zpa_0123"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # goes with the Job


def test_an_invalid_env_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="environment variable name"):
        container_env(request(tmp_path, env={"A-B": "1"}))


def test_each_node_gets_its_gpus_host_memory_and_a_memory_backed_dev_shm(tmp_path: Path) -> None:
    job = render_job(request(tmp_path, profile=profile(cpus_per_node=96)))

    assert trainer(job)["resources"] == {
        "requests": {"memory": "524288Mi", "cpu": "96"},
        "limits": {"memory": "524288Mi", "nvidia.com/gpu": "8"},
    }
    mounts = {m["mountPath"]: m["name"] for m in trainer(job)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    assert volumes[mounts["/etc/zeropilot"]]["projected"]["sources"] == [
        {"configMap": {"name": NAME}},
        {"secret": {"name": NAME}},  # the runtime token, as the file attempt-token
    ]


@pytest.mark.parametrize(
    ("accelerator", "resource"),
    [("nvidia-a100-40gb", "nvidia.com/gpu"), ("amd-mi300x", "amd.com/gpu"), ("cpu", None)],
)
def test_the_accelerator_names_the_device_resource(
    tmp_path: Path, accelerator: str, resource: str | None
) -> None:
    limits = trainer(render_job(request(tmp_path, profile=profile(accelerator=accelerator))))[
        "resources"
    ]["limits"]

    assert set(limits) == {"memory"} | ({resource} if resource else set())
    assert resource is None or limits[resource] == "8"


def test_the_job_is_indexed_never_retried_and_fails_on_disruption_or_any_failed_pod(
    tmp_path: Path,
) -> None:
    job = render_job(request(tmp_path))
    spec = job["spec"]

    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimit"] == 0
    # A non-zero exit fails the Job through backoffLimit 0, not a FailJob rule, which the Job
    # controller would also match against the pods it stops when the Job is suspended.
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    assert "ttlSecondsAfterFinished" not in spec  # the status must outlive the run
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert pod_spec(job)["subdomain"] == NAME
    assert trainer(job)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert trainer(job)["image"] == "registry.example/train:1"
    assert trainer(job)["workingDir"] == "/workspace"
    assert job["metadata"]["namespace"] == "ml"
    labels = {"app.kubernetes.io/managed-by": "zeropilot", "zeropilot.dev/attempt": NAME}
    assert job["metadata"]["labels"] == labels
    assert job["spec"]["template"]["metadata"]["labels"] == labels


def test_the_time_limit_is_the_jobs_active_deadline(tmp_path: Path) -> None:
    assert render_job(request(tmp_path))["spec"]["activeDeadlineSeconds"] == 3600
    assert "activeDeadlineSeconds" not in render_job(request(tmp_path, time_limit_s=None))["spec"]


def test_a_kueue_queue_labels_the_job_and_creates_it_suspended(tmp_path: Path) -> None:
    queued = render_job(request(tmp_path, profile=profile(queue="team-ml")))
    plain = render_job(request(tmp_path))

    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert queued["spec"]["suspend"] is True
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    assert "suspend" not in plain["spec"]


def test_a_scheduler_name_goes_to_the_pods(tmp_path: Path) -> None:
    volcano = render_job(request(tmp_path, profile=profile(scheduler_name="volcano")))

    assert pod_spec(volcano)["schedulerName"] == "volcano"
    assert "schedulerName" not in pod_spec(render_job(request(tmp_path)))


def test_a_shared_volume_is_mounted_where_the_workers_keep_attempts(tmp_path: Path) -> None:
    shared = render_job(request(tmp_path, profile=profile(shared_volume_claim="zeropilot-data")))

    claim = {"name": "shared", "persistentVolumeClaim": {"claimName": "zeropilot-data"}}
    assert claim in pod_spec(shared)["volumes"]
    mount = {"name": "shared", "mountPath": "/var/lib/zeropilot"}
    assert mount in trainer(shared)["volumeMounts"]
    assert all(v["name"] != "shared" for v in pod_spec(render_job(request(tmp_path)))["volumes"])


def test_the_config_map_holds_the_hostfile_and_the_ds_config(tmp_path: Path) -> None:
    config_map = render_config_map(request(tmp_path, nodes=3), '{"a": 1}', "uid-1")

    assert config_map["data"] == {
        "hostfile": f"{NAME}-0.{NAME} slots=8\n{NAME}-1.{NAME} slots=8\n{NAME}-2.{NAME} slots=8\n",
        "ds_config.json": '{"a": 1}',
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": "uid-1"}
    assert config_map["metadata"]["ownerReferences"] == [owner]


def test_the_service_is_headless_and_selects_the_jobs_pods(tmp_path: Path) -> None:
    service = render_service(request(tmp_path), "uid-1")

    assert service["spec"] == {
        "clusterIP": "None",
        "selector": {"job-name": NAME},
        "publishNotReadyAddresses": True,
    }
    assert service["metadata"]["name"] == NAME


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"image": None}, "needs an image"),
        ({"image": ""}, "needs an image"),
        ({"name": "Upper-Case"}, "attempt name"),
        ({"name": "9starts-with-a-digit"}, "attempt name"),  # a Service name needs a letter
        ({"name": "a" * 62, "nodes": 2}, "attempt name"),  # no room for "-1" in the hostname
        ({"profile": profile(namespace="Bad_NS")}, "namespace"),
        ({"profile": profile(queue="no spaces")}, "queue"),
        ({"profile": profile(master_port_range=(30000, 29999))}, "reversed"),
        ({"args": ("a\0b",)}, "NUL"),
        ({"env": {"JOB_COMPLETION_INDEX": "7"}}, "JOB_COMPLETION_INDEX is set by zeropilot"),
        (
            {"profile": profile(nccl_env={"JOB_COMPLETION_INDEX": "0"})},
            "JOB_COMPLETION_INDEX is set by zeropilot",
        ),
    ],
)
def test_what_kubernetes_would_reject_is_refused_before_any_call(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(PermanentError, match=message):
        render_job(request(tmp_path, **changes))


def test_the_reference_is_namespace_slash_name() -> None:
    assert decode_ref(encode_ref("ml", NAME)) == ("ml", NAME)
    for bad in ("", "ml", "/x", "ml/", "a/b/c", "123:/tmp/attempt"):
        with pytest.raises(PermanentError, match="not a Kubernetes backend reference"):
            decode_ref(bad)


@pytest.mark.parametrize(
    "name", ["JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT", "ZEROPILOT_ATTEMPT_ID", "RANK"]
)
def test_a_job_spec_may_not_set_what_the_launch_sets(name: str) -> None:
    spec = {**TINY_SPEC, "env": {name: "7"}}

    with pytest.raises(ValidationError, match=f"env.{name}: zeropilot sets this variable"):
        JobSpec.model_validate(spec)


@pytest.mark.parametrize("path", ["/dev/shm", "/etc/zeropilot/", "/dev//shm", "/"])
def test_a_shared_volume_path_that_a_pod_mounts_already_is_refused(path: str) -> None:
    # The API server refuses such a Job (422 "must be unique"); the profile says why first.
    with pytest.raises(ValidationError, match=r"shared_volume_path .* collides"):
        profile(shared_volume_claim="zeropilot-data", shared_volume_path=path)


def test_the_pods_grace_is_the_stops_so_the_trainer_can_save(tmp_path: Path) -> None:
    default = render_job(request(tmp_path))["spec"]["template"]["spec"]
    sized = render_job(request(tmp_path, stop_grace_s=181.5))["spec"]["template"]["spec"]
    assert default["terminationGracePeriodSeconds"] == 30  # Kubernetes' own default
    assert sized["terminationGracePeriodSeconds"] == 182  # whole seconds, never less


# ---- each node's log on the shared volume ----


def on_volume(tmp_path: Path, **changes: Any) -> LaunchRequest:
    shared = profile(shared_volume_claim="zeropilot-data", shared_volume_path=str(tmp_path))
    return request(tmp_path, profile=shared, **changes)


def test_pods_on_the_shared_volume_write_each_nodes_log_into_the_attempt_folder(
    tmp_path: Path,
) -> None:
    command = trainer(render_job(on_volume(tmp_path)))["command"]
    argv = [expand_references(word, DEFINED) for word in command]
    plain = [expand_references(w, DEFINED) for w in launcher_command(request(tmp_path))][4:]

    assert argv[:2] == ["python3", "-c"]
    assert argv[3] == f"{tmp_path / 'attempt'}/node-1.log"  # JOB_COMPLETION_INDEX=1
    assert argv[4:] == plain  # the launcher itself, unchanged
    node_0 = f"{tmp_path}/attempt/node-0.log"  # where rank 0 prints: what the API reads
    assert log_path(encode_ref("ml", NAME), on_volume(tmp_path)) == node_0


def test_pods_without_the_volume_or_outside_it_write_no_log_file(tmp_path: Path) -> None:
    outside = profile(shared_volume_claim="zeropilot-data", shared_volume_path="/mnt/elsewhere")

    for launch in (request(tmp_path), request(tmp_path, profile=outside)):
        command = launcher_command(launch)
        # still under TEE, which passes a stop's SIGTERM on to the ranks, but with no file
        assert command[:2] == ["python3", "-c"] and command[3] == ""
        assert log_path(encode_ref("ml", NAME), launch) is None


def test_without_a_log_file_the_wrapper_still_tells_the_ranks_of_a_stop(tmp_path: Path) -> None:
    command = trainer(render_job(request(tmp_path)))["command"]
    wrapper = [sys.executable, "-c", expand_references(command[2], DEFINED), ""]
    source = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    done = subprocess.Popen([*wrapper, sys.executable, "-c", source], stdout=subprocess.PIPE)
    assert done.stdout is not None and done.stdout.readline() == b"ready\n"
    done.send_signal(signal.SIGTERM)
    assert done.wait(timeout=30) == 75  # the stand-in got the stop and its code came back


def run_wrapped(tmp_path: Path, trainer_source: str, **popen: Any) -> subprocess.Popen[bytes]:
    """The pod's wrapper as the container runs it, around a stand-in for the launcher."""
    return wrapped(tmp_path, tmp_path / "node.log", trainer_source, **popen)


def wrapped(
    tmp_path: Path, log: Path, trainer_source: str, **popen: Any
) -> subprocess.Popen[bytes]:
    command = trainer(render_job(on_volume(tmp_path)))["command"]
    wrapper = [sys.executable, "-c", expand_references(command[2], DEFINED), str(log)]
    return subprocess.Popen([*wrapper, sys.executable, "-c", trainer_source],
                            stdout=subprocess.PIPE, **popen)  # fmt: skip


def test_the_wrapper_copies_the_output_to_both_and_keeps_the_exit_code(tmp_path: Path) -> None:
    source = "import sys; print('step 1 loss 2.5', flush=True); sys.exit('boom')"
    done = run_wrapped(tmp_path, source)
    out, _ = done.communicate(timeout=30)

    assert done.returncode == 1  # sys.exit with a message: exit 1, the message on stderr
    assert out == b"step 1 loss 2.5\nboom\n"
    assert (tmp_path / "node.log").read_bytes() == out


def test_the_wrapper_passes_the_graceful_stop_on_to_the_launcher(tmp_path: Path) -> None:
    source = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (print('saving', flush=True), sys.exit(7)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    running = run_wrapped(tmp_path, source)
    assert running.stdout is not None and running.stdout.readline() == b"ready\n"

    running.send_signal(signal.SIGTERM)
    rest, _ = running.communicate(timeout=30)

    assert (running.returncode, rest) == (7, b"saving\n")
    assert (tmp_path / "node.log").read_text() == "ready\nsaving\n"


def test_a_log_the_pod_cannot_write_leaves_the_training_running(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "node.log"  # its folder does not exist
    done = wrapped(tmp_path, missing, "print('trained')", stderr=subprocess.PIPE)
    out, err = done.communicate(timeout=30)

    assert (done.returncode, out) == (0, b"trained\n")
    assert b"not writing this node's log" in err
