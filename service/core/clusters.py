"""Cluster profiles: what zeropilot knows about a place it can run jobs.

A profile says which backend drives the cluster and what one node offers (accelerators, their
memory, host memory) plus the settings every launch there needs (NCCL environment, namespace,
partition, queue). Profiles come from a YAML file named in the settings; ``local`` always exists.
"""

from __future__ import annotations

import posixpath
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.core.launch_limits import ENV_NAME_PATTERN
from service.core.spec import NAME_PATTERN, IntervalSetting

Port = Annotated[int, Field(ge=1024, le=65535)]
# Where every Kubernetes training pod already mounts something (the ConfigMap, its /dev/shm).
POD_MOUNT_PATHS = ("/etc/zeropilot", "/dev/shm")  # noqa: S108 (the pod's own tmpfs)


class BackendKind(StrEnum):
    LOCAL = "local"
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


class ClusterProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    kind: BackendKind
    accelerator: str = "cpu"  # e.g. "nvidia-h100-80gb"; "cpu" runs ranks as CPU processes
    gpu_memory_gib: float = Field(
        default=16.0, gt=0
    )  # per accelerator; for "cpu" a per-rank budget
    gpus_per_node: int = Field(default=2, gt=0)
    cpu_memory_gib: float = Field(default=16.0, gt=0)  # per node
    max_nodes: int = Field(default=1, gt=0)
    # The advisor's step-time model; None: the accelerator's spec sheet (docs/advisor.md).
    peak_tflops: float | None = Field(default=None, gt=0)  # dense 16-bit, per accelerator
    memory_gb_per_s: float | None = Field(default=None, gt=0)  # device memory bandwidth
    intra_node_gb_per_s: float | None = Field(default=None, gt=0)  # collective bus bandwidth
    inter_node_gb_per_s: float | None = Field(default=None, gt=0)  # network, per accelerator
    pcie_gb_per_s: float | None = Field(default=None, gt=0)  # host link (offload copies)
    # GPUs zeropilot admits onto this cluster at once (teams share them fairly); None: no cap.
    max_gpus: int | None = Field(default=None, gt=0)
    # Steps between checkpoints for jobs that set none: a number, or "auto" (Young/Daly from
    # measured saves and this cluster's interruptions, service.core.cadence).
    checkpoint_interval_steps: IntervalSetting = 100
    # What one GPU here costs per hour, in US dollars, for placement: cost; None: not priced.
    usd_per_gpu_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # The shared storage its nodes mount checkpoints from, by name; None: its own. A job that
    # has checkpoints moves (cluster: auto) only between clusters naming the same storage.
    storage: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    nccl_env: dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], str] = Field(
        default_factory=dict
    )
    # Slurm
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    slurm_conf: str | None = None  # SLURM_CONF for sbatch/squeue/...; None: the environment's
    cpus_per_node: int | None = Field(default=None, gt=0)  # cores per node; None: one per rank
    # DeepSpeed's rendezvous port is picked in this range (Slurm: low + job id % size).
    master_port_range: tuple[Port, Port] = (29500, 29999)
    # Kubernetes
    namespace: str | None = None
    queue: str | None = None  # Kueue LocalQueue name
    # A worker keeps a watched copy of zeropilot's Jobs and Pods (one LIST, then a WATCH) that
    # its passes read; False: every pass LISTs them (an API server that refuses long watches).
    watch: bool = True
    # Without a queue: a Job whose pods hold GPUs while another pod cannot be placed, or is
    # refused by the namespace's quota, for this long is suspended (its GPUs freed) and retried
    # between one and two times as long after, at random; None: never.
    gang_timeout_s: int | None = Field(default=600, gt=0)
    scheduler_name: str | None = None  # e.g. "volcano"
    # How to reach the API server. Both None: the pod's service account when zeropilot runs in
    # a pod, else $KUBECONFIG or ~/.kube/config; kube_context None: the current context.
    kubeconfig: str | None = None
    kube_context: str | None = None
    # A ReadWriteMany claim mounted in every training pod at shared_volume_path: the same volume
    # the workers keep their data folder on, so attempt folders and checkpoints resolve in pods.
    shared_volume_claim: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    shared_volume_path: Annotated[str, Field(pattern=r"^/[^\x00\n]*$")] = "/var/lib/zeropilot"

    @field_validator("name")
    @classmethod
    def _not_auto(cls, name: str) -> str:
        if name == "auto":  # resources.cluster: auto asks zeropilot to choose
            raise ValueError("'auto' is reserved: a job naming it is placed by zeropilot")
        return name

    @field_validator("shared_volume_path")
    @classmethod
    def _not_a_pod_mount(cls, path: str) -> str:
        normalized = posixpath.normpath(path)
        if normalized in POD_MOUNT_PATHS or normalized == "/":
            taken = ", ".join(POD_MOUNT_PATHS)
            raise ValueError(
                f"shared_volume_path {path!r} collides with a path every training pod mounts "
                f"already ({taken}) or is the root; choose another folder"
            )
        return path


LOCAL_PROFILE = ClusterProfile(name="local", kind=BackendKind.LOCAL, max_nodes=2)
