"""A real Slurm cluster for tests: the recipe in deploy/slurm, plus builders for Slurm launches.

``slurm_cluster`` (session scope) runs ``deploy/slurm/local-cluster.sh start --nodes 2``: it
reuses a two-node cluster already running in ``$ZEROPILOT_SLURM_DIR`` (default
/tmp/zeropilot-slurm), and stops the cluster at the end only if it started it and
``ZEROPILOT_SLURM_KEEP`` is unset (sessions on one machine share its one local cluster). The
two nodes, zp-node1 and zp-node2, live in their own network namespaces with their own
addresses. Starting it needs root (network namespaces, cgroups, munge).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.core.clusters import BackendKind, ClusterProfile
from workers.backends import slurm
from workers.backends.base import BackendState, BackendStatus, LaunchRequest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "deploy" / "slurm" / "local-cluster.sh"
NODES = ("zp-node1", "zp-node2")
NODE_ADDRESSES = {"zp-node1": "10.77.0.11", "zp-node2": "10.77.0.12"}
TINY_DS_CONFIG: dict[str, Any] = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
    "steps_per_print": 1000,
}

# A stand-in training script: records what it was given and where it ran, then maybe waits.
PROBE_SCRIPT = """\
import json, os, signal, socket, sys, time
import torch.distributed as dist

warned = os.path.join(os.environ["PROBE_DIR"], "usr1-%s" % os.environ["RANK"])
signal.signal(signal.SIGUSR1, lambda *_: open(warned, "w").close())
dist.init_process_group("gloo")
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect((os.environ["MASTER_ADDR"], 9))  # the source address this rank uses to reach it
record = {
    "rank": dist.get_rank(),
    "argv": sys.argv[1:],
    "env": {k: v for k, v in os.environ.items() if k.startswith(("EVIL_", "NCCL_", "TORCH_NCCL"))},
    "hostname": socket.gethostname(),
    "address": probe.getsockname()[0],
}
everyone = [None] * dist.get_world_size()
dist.all_gather_object(everyone, record)  # a real collective across the nodes
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["PROBE_DIR"], "probe.json"), "w") as out:
        json.dump(everyone, out)
dist.barrier()
dist.destroy_process_group()  # leave gloo cleanly: a rank exiting mid-teardown can abort
time.sleep(float(os.environ.get("PROBE_SLEEP_S", "0")))
sys.exit(int(os.environ.get("PROBE_EXIT_CODE", "0")))
"""

# Allocates host memory until the cgroup limit stops it.
MEMORY_HOG_SCRIPT = """\
import time
chunks = []
for _ in range(200):
    chunks.append(bytearray(64 * 1024 * 1024))
    time.sleep(0.02)
print("the memory limit was not enforced", flush=True)
"""


@dataclass(frozen=True)
class LocalSlurm:
    conf: Path
    nodes: tuple[str, ...]

    def command(self, *argv: str) -> str:
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        return done.stdout

    def wait_until_up(self, deadline_s: float = 120) -> None:
        """Every node answers and takes jobs (idle, or busy with another session's jobs)."""
        give_up = time.monotonic() + deadline_s
        up = {"idle", "mix", "alloc", "comp"}
        while not set(self.command("sinfo", "--noheader", "--Node", "--format=%t").split()) <= up:
            if time.monotonic() > give_up:
                raise AssertionError(self.command("sinfo", "--Node", "--long"))
            time.sleep(1)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurm]:
    folder = os.environ.get("ZEROPILOT_SLURM_DIR", "/tmp/zeropilot-slurm")
    status = subprocess.run(
        [str(RECIPE), "status", "--dir", folder], capture_output=True, text=True
    )
    already_running = status.returncode == 0 and f"running: {len(NODES)} node" in status.stdout
    started = subprocess.run(
        [str(RECIPE), "start", "--nodes", str(len(NODES)), "--dir", folder],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if started.returncode != 0:
        pytest.fail(f"the local Slurm cluster did not start:\n{started.stderr}", pytrace=False)
    conf = Path(started.stdout.strip().rpartition("SLURM_CONF=")[2])
    yield LocalSlurm(conf=conf, nodes=NODES)
    if not already_running and not os.environ.get("ZEROPILOT_SLURM_KEEP"):
        subprocess.run([str(RECIPE), "stop", "--dir", folder], check=False, timeout=120)


def slurm_profile(cluster: LocalSlurm, **changes: Any) -> ClusterProfile:
    """The ``slurm-local`` cluster profile for the local cluster (CPU ranks, test ports)."""
    fields: dict[str, Any] = {
        "name": "slurm-local",
        "kind": BackendKind.SLURM,
        "accelerator": "cpu",
        "gpus_per_node": 2,
        "cpu_memory_gib": 4,
        "max_nodes": len(cluster.nodes),
        "slurm_conf": str(cluster.conf),
        "partition": "debug",
        "master_port_range": (29700, 29799),  # the range this machine keeps for these tests
        "nccl_env": {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1", **_passed_through()},
        **changes,
    }
    return ClusterProfile.model_validate(fields)


def _passed_through() -> dict[str, str]:
    # sbatch gets a small environment; where the JIT-built DeepSpeed ops are cached must still
    # reach the ranks, or each run with another cache rebuilds them (minutes on this machine).
    name = "TORCH_EXTENSIONS_DIR"
    return {name: os.environ[name]} if name in os.environ else {}


def launch_request(
    tmp_path: Path,
    profile: ClusterProfile,
    *,
    name: str,
    entrypoint: str,
    args: tuple[str, ...] = (),
    nodes: int = 1,
    procs_per_node: int = 2,
    env: dict[str, str] | None = None,
    time_limit_s: int | None = 600,
) -> LaunchRequest:
    """A launch of ``entrypoint`` (relative to the repository) with the tiny ds_config."""
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir(parents=True, exist_ok=True)
    ds_config = attempt_dir / "ds_config.json"
    ds_config.write_text(json.dumps(TINY_DS_CONFIG))
    return LaunchRequest(
        name=name,
        attempt_dir=attempt_dir,
        nodes=nodes,
        procs_per_node=procs_per_node,
        entrypoint=entrypoint,
        args=args,
        ds_config_path=ds_config,
        env={"ZEROPILOT_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), **(env or {})},
        working_dir=REPO,
        profile=profile,
        time_limit_s=time_limit_s,
        python=sys.executable,
    )


def write_script(folder: Path, name: str, source: str) -> str:
    path = folder / name
    path.write_text(source)
    return str(path)


def wait_for(
    profile: ClusterProfile,
    ref: str,
    until: frozenset[BackendState] | None = None,
    file_exists: Path | None = None,
    deadline_s: float = 240,
) -> BackendStatus:
    """Poll like the reconcile loop does until a state (default: any ending) is reached."""
    give_up = time.monotonic() + deadline_s  # a hang guard, not a timing assertion
    while True:
        status = slurm.poll(profile, ref)
        reached = status.state.terminal if until is None else status.state in until
        if reached and (file_exists is None or file_exists.exists()):
            return status
        if time.monotonic() > give_up:
            raise AssertionError(f"{ref} still {status} after {deadline_s} s")
        time.sleep(1)
