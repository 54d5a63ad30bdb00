"""The three objects a Kubernetes attempt creates: a ConfigMap, a headless Service, an Indexed Job.

One pod per node runs DeepSpeed's ssh-less launcher. The Job's completion index is the node rank
(the Job controller puts it in ``JOB_COMPLETION_INDEX``), pod 0 is the master, reached by the
DNS name the headless Service gives it (``<name>-0.<name>``), and the hostfile and ds_config come
from the ConfigMap mounted at ``/etc/zeropilot``.

Kubernetes expands ``$(VAR)`` in a container's command, args and env values, and reads ``$$`` as
a literal ``$``; every string a user controls therefore has each ``$`` doubled, so it reaches the
training process as the same literal string (the command runs in exec form, no shell). Rendering
is pure: nothing here talks to a cluster.
"""

from __future__ import annotations

import base64
import math
import re
import zlib
from typing import Any

from service.core.clusters import ClusterProfile
from service.core.launch_limits import ENV_NAME_PATTERN
from workers.backends.base import LaunchRequest, PermanentError
from workers.backends.kubernetes_logs import TEE, node_log_on_volume
from workers.render import launcher_argv, render_hostfile

DEFAULT_NAMESPACE = "default"
CONTAINER = "trainer"
CONFIG_DIR = "/etc/zeropilot"
HOSTFILE_KEY = "hostfile"
DS_CONFIG_KEY = "ds_config.json"
# The runtime token travels in a Secret projected next to the ConfigMap's files, not as an env
# value in the pod spec (which anyone who may read Jobs or Pods could read).
TOKEN_KEY = "attempt-token"  # noqa: S105 (names, not secrets)
TOKEN_ENV = "ZEROPILOT_ATTEMPT_TOKEN"  # noqa: S105
TOKEN_FILE_ENV = "ZEROPILOT_ATTEMPT_TOKEN_FILE"  # noqa: S105
DEFAULT_PYTHON = "python3"  # the image's interpreter; the worker's own path means nothing there
ATTEMPT_LABEL = "zeropilot.dev/attempt"
MANAGED_BY = {"app.kubernetes.io/managed-by": "zeropilot"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_NAME_LABEL = "job-name"  # set on its pods by the Job controller (every version)
NODE_INDEX = "$(JOB_COMPLETION_INDEX)"  # set in each pod by the Job controller (Indexed Jobs)
NODE_RANK = NODE_INDEX  # set in each pod by the Job controller, Indexed Jobs only
# The Job controller keeps a variable of this name that the pod already has: every rank would
# get the user's value as its node rank.
RESERVED_ENV = frozenset({"JOB_COMPLETION_INDEX"})

# The Service name is a DNS-1035 label; each pod's hostname, "<name>-<index>", a DNS-1123 label.
_OBJECT_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_ENV_NAME = re.compile(ENV_NAME_PATTERN)
_MAX_LABEL = 63

# Good defaults for every rank; the profile's nccl_env and then the job's env override them.
_DEFAULT_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed collective ends the job, not hangs it
    "PYTHONUNBUFFERED": "1",  # the last lines before a crash reach the log and the message
}
_GPU_RESOURCES = (("amd", "amd.com/gpu"),)  # accelerator prefix → device plugin resource
_DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


def escape_dollars(value: str) -> str:
    """``value`` as Kubernetes must be given it to pass it on literally (``$$`` reads as ``$``)."""
    if "\0" in value:  # no argv or environment entry can hold a NUL byte
        raise PermanentError("a command argument or environment value contains a NUL byte")
    return value.replace("$", "$$")


def namespace_of(profile: ClusterProfile) -> str:
    namespace = profile.namespace or DEFAULT_NAMESPACE
    _checked(_OBJECT_NAME, "namespace", namespace, _MAX_LABEL)
    return namespace


def pod_dns_name(name: str, index: int) -> str:
    """The name pod ``index`` answers to inside the namespace (hostname.subdomain)."""
    return f"{name}-{index}.{name}"


def master_port(request: LaunchRequest) -> int:
    """A port in the profile's range, fixed per attempt (pods have their own network)."""
    low, high = request.profile.master_port_range
    if high < low:
        raise PermanentError(f"profile {request.profile.name}: master_port_range is reversed")
    return low + zlib.crc32(request.name.encode()) % (high - low + 1)


def attempt_labels(name: str) -> dict[str, str]:
    return {**MANAGED_BY, ATTEMPT_LABEL: name}


def owner_reference(job_name: str, job_uid: str) -> dict[str, Any]:
    """Makes the garbage collector delete an object with its Job (no blockOwnerDeletion: that
    would need update rights on jobs/finalizers where OwnerReferencesPermissionEnforcement runs).
    """
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid}


def render_config_map(request: LaunchRequest, ds_config: str, job_uid: str) -> dict[str, Any]:
    """The hostfile (one line per pod, in node-rank order) and the attempt's ds_config."""
    name = checked_name(request)
    hosts = [pod_dns_name(name, index) for index in range(request.nodes)]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(request, owner=owner_reference(name, job_uid)),
        "data": {
            HOSTFILE_KEY: render_hostfile(hosts, request.procs_per_node),
            DS_CONFIG_KEY: ds_config,
        },
    }


def render_secret(request: LaunchRequest, job_uid: str) -> dict[str, Any]:
    """The attempt's runtime token; the pods read it as a file (the volume waits for it)."""
    name = checked_name(request)
    token = request.env.get(TOKEN_ENV, "")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(request, owner=owner_reference(name, job_uid)),
        "type": "Opaque",
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def render_service(request: LaunchRequest, job_uid: str) -> dict[str, Any]:
    """Headless: no virtual IP, one DNS record per pod, published before the pod is ready."""
    name = checked_name(request)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(request, owner=owner_reference(name, job_uid)),
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_NAME_LABEL: name},
            # Rank 0 must be resolvable while the other pods are still starting.
            "publishNotReadyAddresses": True,
        },
    }


def render_job(request: LaunchRequest) -> dict[str, Any]:
    """The Indexed Job: one pod per node, never restarted; zeropilot decides what runs again."""
    name = checked_name(request)
    profile = request.profile
    spec: dict[str, Any] = {
        "completions": request.nodes,
        "parallelism": request.nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": _pod_failure_rules()},
        "template": {
            "metadata": {"labels": attempt_labels(name)},
            "spec": _pod_spec(request),
        },
    }
    if request.time_limit_s is not None:
        spec["activeDeadlineSeconds"] = request.time_limit_s
    metadata = _metadata(request)
    if profile.queue is not None:
        queue = _checked(_LABEL_VALUE, "queue", profile.queue, _MAX_LABEL)
        metadata["labels"][QUEUE_LABEL] = queue
        spec["suspend"] = True  # Kueue unsuspends the Job when its quota admits it
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": spec}


def launcher_command(request: LaunchRequest) -> list[str]:
    """Pod ``i``'s command, exactly as Kubernetes must be given it (node rank left to expand)."""
    name = checked_name(request)
    argv = launcher_argv(
        python=DEFAULT_PYTHON,
        hostfile=f"{CONFIG_DIR}/{HOSTFILE_KEY}",
        node_rank=NODE_RANK,
        master_addr=pod_dns_name(name, 0),
        master_port=str(master_port(request)),
        entrypoint=request.entrypoint,
        args=request.args,
        ds_config=f"{CONFIG_DIR}/{DS_CONFIG_KEY}",
    )
    rank_at = argv.index("--node_rank") + 1
    command = [word if i == rank_at else escape_dollars(word) for i, word in enumerate(argv)]
    node_log = node_log_on_volume(request)
    # Always under TEE (kubernetes_logs): it passes the stop's SIGTERM on to the ranks
    log_file = "" if node_log is None else escape_dollars(str(node_log))
    return [DEFAULT_PYTHON, "-c", escape_dollars(TEE), log_file.replace("{index}", NODE_INDEX),
            *command]  # fmt: skip


def container_env(request: LaunchRequest) -> list[dict[str, str]]:
    """Every variable of each rank, in a stable order: defaults, profile, job, then the paths
    that only exist inside the pod (the worker's own ds_config path means nothing there)."""
    merged = {
        **_DEFAULT_ENV,
        **request.profile.nccl_env,
        **request.env,
        "ZEROPILOT_DS_CONFIG": f"{CONFIG_DIR}/{DS_CONFIG_KEY}",
        TOKEN_FILE_ENV: f"{CONFIG_DIR}/{TOKEN_KEY}",
    }
    merged.pop(TOKEN_ENV, None)  # in the Secret, not in the pod spec
    for variable in merged:
        _checked(_ENV_NAME, "environment variable name", variable, None)
        if variable in RESERVED_ENV:
            raise PermanentError(
                f"environment variable {variable} is set by zeropilot on Kubernetes (each pod's "
                "node rank); rename it in the job's env or the profile's nccl_env"
            )
    return [{"name": key, "value": escape_dollars(value)} for key, value in sorted(merged.items())]


def checked_name(request: LaunchRequest) -> str:
    """The attempt's name, valid as a Service name and with room for ``-<index>`` in hostnames."""
    longest = _MAX_LABEL - len(f"-{request.nodes - 1}")
    return _checked(_OBJECT_NAME, "attempt name", request.name, longest)


def _pod_failure_rules() -> list[dict[str, Any]]:
    """Preempted, evicted, its node drained or lost: the Job fails, recorded as a disruption.

    No rule on exit codes: the Job controller matches FailJob rules against every pod it still
    sees, those it stopped because the Job was suspended too (a queue's preemption, the gang
    timeout), and a stopped trainer exits non-zero (143, or 1 from DeepSpeed's launcher). A
    non-zero exit fails the Job through ``backoffLimit: 0`` instead, which counts only pods
    still carrying the controller's tracking finalizer; it removes that from the pods it stops
    for a suspension before deleting them.
    """
    return [
        {
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
    ]


def _pod_spec(request: LaunchRequest) -> dict[str, Any]:
    name = checked_name(request)
    spec: dict[str, Any] = {
        "subdomain": name,  # with the Job's "<name>-<index>" hostnames: <name>-<i>.<name>
        "restartPolicy": "Never",
        # A deleted or suspended pod's trainer gets SIGTERM, saves, and this long to exit.
        "terminationGracePeriodSeconds": math.ceil(request.stop_grace_s),
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables from every Service around
        "containers": [_container(request)],
        "volumes": [
            {"name": "zeropilot", "projected": {"sources": _config_sources(name)}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},  # NCCL and dataloaders need it
        ],
    }
    if request.profile.scheduler_name is not None:
        scheduler = request.profile.scheduler_name
        spec["schedulerName"] = _checked(_DNS_SUBDOMAIN, "scheduler_name", scheduler, 253)
    if request.profile.shared_volume_claim is not None:
        claim = {"claimName": request.profile.shared_volume_claim}
        spec["volumes"].append({"name": "shared", "persistentVolumeClaim": claim})
    return spec


def _config_sources(name: str) -> list[dict[str, Any]]:
    """Hostfile and ds_config from the ConfigMap, the token from the Secret, in one folder."""
    return [{"configMap": {"name": name}}, {"secret": {"name": name}}]


def _container(request: LaunchRequest) -> dict[str, Any]:
    if not request.image:
        raise PermanentError("a job on Kubernetes needs an image (set `image` in the job spec)")
    mounts = [
        {"name": "zeropilot", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108 (the pod's own tmpfs)
    ]
    if request.profile.shared_volume_claim is not None:
        mounts.append({"name": "shared", "mountPath": request.profile.shared_volume_path})
    return {
        "name": CONTAINER,
        "image": request.image,
        "command": launcher_command(request),
        "workingDir": str(request.working_dir),
        "env": container_env(request),
        "resources": _resources(request),
        "volumeMounts": mounts,
        # The log's last lines become the termination message when the training crashes.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _resources(request: LaunchRequest) -> dict[str, Any]:
    profile = request.profile
    memory = f"{math.ceil(profile.cpu_memory_gib * 1024)}Mi"  # as Slurm's --mem: enforced
    requests: dict[str, str] = {"memory": memory}
    limits: dict[str, str] = {"memory": memory}
    if profile.cpus_per_node is not None:
        requests["cpu"] = str(profile.cpus_per_node)
    if profile.accelerator != "cpu":
        limits[gpu_resource(profile)] = str(request.procs_per_node)
    return {"requests": requests, "limits": limits}


def gpu_resource(profile: ClusterProfile) -> str:
    """The extended resource the device plugin of the profile's accelerators advertises."""
    accelerator = profile.accelerator.lower()
    for prefix, resource in _GPU_RESOURCES:
        if accelerator.startswith(prefix):
            return resource
    return _DEFAULT_GPU_RESOURCE


def _metadata(request: LaunchRequest, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": checked_name(request),
        "namespace": namespace_of(request.profile),
        "labels": attempt_labels(request.name),
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return metadata


def _checked(pattern: re.Pattern[str], what: str, value: str, max_length: int | None) -> str:
    if not pattern.fullmatch(value) or (max_length is not None and len(value) > max_length):
        longest = f", at most {max_length} characters" if max_length is not None else ""
        raise PermanentError(
            f"{what} {value!r} is not allowed on Kubernetes (must match {pattern.pattern}{longest})"
        )
    return value
