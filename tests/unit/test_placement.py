"""Placement for ``cluster: auto``: where the job starts now, then where it trains fastest."""

from __future__ import annotations

from typing import Any

from service.core.advisor import advise
from service.core.clusters import BackendKind, ClusterProfile
from service.core.placement import choose, movable, plan_everywhere, start_in_s, summary
from service.core.spec import JobSpec

SEVEN_B = {
    "name": "llama-7b", "entrypoint": "train.py", "image": "registry.example.com/train:1",
    "model": {"parameters": 6.7e9, "hidden_size": 4096, "num_layers": 32, "num_heads": 32,
              "vocab_size": 32000, "mlp": "gated", "ffn_size": 11008},
    "training": {"sequence_length": 2048, "global_batch_size": 32, "precision": "bf16"},
    "resources": {"cluster": "auto", "nodes": 1, "gpus_per_node": 8},
}  # fmt: skip


def gpu_cluster(name: str, memory: float, accelerator: str, nodes: int = 4) -> ClusterProfile:
    return ClusterProfile(
        name=name, kind=BackendKind.SLURM, accelerator=accelerator, gpu_memory_gib=memory,
        gpus_per_node=8, cpu_memory_gib=1000, max_nodes=nodes,
    )  # fmt: skip


A100_40 = gpu_cluster("a100-40", 40, "nvidia-a100-40gb")
H100 = gpu_cluster("h100", 80, "nvidia-h100-80gb", nodes=8)
SMALL = ClusterProfile(name="cpu", kind=BackendKind.LOCAL)


def place(spec: dict[str, object], waiting: dict[str, str] | None = None) -> tuple[str, str]:
    job = JobSpec.model_validate(spec)
    options = plan_everywhere(
        job, [SMALL, A100_40, H100], advise, lambda p: (waiting or {}).get(p.name, "")
    )
    chosen = choose(options)
    assert chosen is not None
    return chosen.cluster, summary(options, chosen)


def test_the_job_goes_where_it_is_predicted_fastest_and_says_why_not_elsewhere() -> None:
    cluster, why = place(SEVEN_B)

    assert cluster == "h100"
    assert why.startswith("placed on h100 (ZeRO-")
    assert "starts now" in why
    assert "cpu: ruled out, has 2 GPUs per node, the job asks for 8" in why
    assert "a100-40: ZeRO-" in why


def test_a_cluster_where_it_would_wait_loses_to_one_where_it_starts_now() -> None:
    cluster, why = place(SEVEN_B, {"h100": "cluster h100 has 64 of its 64 GPUs admitted"})

    assert cluster == "a100-40"
    assert "h100: ZeRO-" in why and "waits: cluster h100 has 64 of its 64 GPUs admitted" in why


def test_the_spec_may_limit_the_choice_and_a_cluster_too_small_is_ruled_out() -> None:
    limited = {**SEVEN_B, "resources": {**SEVEN_B["resources"], "clusters": ["a100-40", "cpu"]}}  # type: ignore[dict-item]
    assert place(limited)[0] == "a100-40"
    training = {**SEVEN_B["training"], "global_batch_size": 64}  # type: ignore[dict-item]
    huge = {**SEVEN_B, "training": training, "resources": {**SEVEN_B["resources"], "nodes": 8}}  # type: ignore[dict-item]
    cluster, why = place(huge)
    assert cluster == "h100"
    assert "a100-40: ruled out, offers at most 4 nodes, the job asks for 8" in why


def test_with_its_length_known_the_job_goes_where_it_ends_first() -> None:
    long_job = {**SEVEN_B, "training": {**SEVEN_B["training"], "steps": 20_000}}  # type: ignore[dict-item]
    job = JobSpec.model_validate(long_job)
    busy = {"h100": "cluster h100 has 64 of its 64 GPUs admitted"}

    def options(h100_free_in_s: float | None) -> list[Any]:
        return plan_everywhere(
            job, [A100_40, H100], advise, lambda p: busy.get(p.name, ""),
            lambda p: h100_free_in_s,
        )  # fmt: skip

    free = {o.cluster: o for o in options(0.0)}
    a100_s, h100_s = free["a100-40"].duration_s, free["h100"].duration_s
    assert a100_s is not None and h100_s is not None and h100_s < a100_s  # the faster GPU
    soon = options((a100_s - h100_s) / 2)  # the H100 frees up early enough to win
    chosen = choose(soon)
    assert chosen is not None and chosen.cluster == "h100"
    assert "expected to start in" in summary(soon, chosen)
    late = choose(options(a100_s))  # it frees up only after the A100 run would have ended
    assert late is not None and late.cluster == "a100-40"
    unknown = choose(options(None))  # its start unknown: the known end wins
    assert unknown is not None and unknown.cluster == "a100-40"


def test_a_start_is_the_end_of_the_job_whose_gpus_make_enough() -> None:
    ends = [(4, 600.0), (2, 60.0), (8, None)]
    assert start_in_s(2, 2, ends) == 0.0  # free now
    assert start_in_s(4, 2, ends) == 60.0  # the 2-GPU job ends first
    assert start_in_s(8, 2, ends) == 600.0
    assert start_in_s(9, 2, ends) is None  # needs the job whose end is not known
    assert start_in_s(64, 2, [(4, 60.0)]) is None  # more than the limit ever frees


def test_a_job_with_checkpoints_moves_only_to_a_cluster_on_the_same_storage() -> None:
    lustre_a = gpu_cluster("a", 80, "nvidia-h100-80gb").model_copy(update={"storage": "lustre"})
    lustre_b = gpu_cluster("b", 80, "nvidia-h100-80gb").model_copy(update={"storage": "lustre"})
    other = gpu_cluster("c", 80, "nvidia-h100-80gb")  # its own storage
    profiles = [lustre_a, lustre_b, other]

    kept, left_out = movable(profiles, {"a"}, lustre_a, has_checkpoints=True)
    assert [p.name for p in kept] == ["b"]
    assert {o.cluster: o.ruled_out for o in left_out} == {
        "a": "a launch of this job failed there",
        "c": "its checkpoints are on storage lustre of a, which this cluster does not mount",
    }
    fresh, _ = movable(profiles, {"a"}, lustre_a, has_checkpoints=False)  # nothing to carry
    assert [p.name for p in fresh] == ["b", "c"]
