"""Placement for ``cluster: auto``: where the job starts now, then where it trains fastest."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from service.core.advisor import advise
from service.core.clusters import BackendKind, ClusterProfile
from service.core.placement import (
    choose,
    cost_words,
    money,
    movable,
    plan_everywhere,
    summary,
    why_not,
)
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


def priced(profile: ClusterProfile, usd_per_gpu_hour: float | None) -> ClusterProfile:
    return profile.model_copy(update={"usd_per_gpu_hour": usd_per_gpu_hour})


def by_cost(spec: dict[str, Any], profiles: list[ClusterProfile]) -> tuple[list[Any], Any]:
    job = JobSpec.model_validate(spec)
    options = plan_everywhere(job, profiles, advise, lambda _p: "")
    return options, choose(options, job.resources.placement)


def cost_spec(steps: int | None = 20_000) -> dict[str, Any]:
    training = {**SEVEN_B["training"], "steps": steps}  # type: ignore[dict-item]
    resources = {**SEVEN_B["resources"], "placement": "cost"}  # type: ignore[dict-item]
    return {**SEVEN_B, "training": training, "resources": resources}


def test_cost_placement_takes_the_cheaper_cluster_where_time_takes_the_faster() -> None:
    profiles = [priced(A100_40, 0.80), priced(H100, 4.00)]
    options, cheapest = by_cost(cost_spec(), profiles)
    fastest = choose(options)  # the same options, placed by time

    assert fastest is not None and fastest.cluster == "h100"
    assert cheapest is not None and cheapest.cluster == "a100-40"
    a100 = next(o for o in options if o.cluster == "a100-40")
    # 8 GPUs x the predicted hours x $0.80; only float rounding between the two products
    assert a100.cost_usd == pytest.approx(8 * a100.duration_s / 3600 * 0.80, rel=1e-12)
    words = summary(options, cheapest, "cost")
    assert words.startswith("placed on a100-40 by cost (ZeRO-")
    assert f"costs {money(a100.cost_usd)}" in words
    assert "h100: ZeRO-" in words and "costs $" in words.split("h100:")[1]


def test_without_a_length_cost_placement_ranks_by_the_cost_of_a_step() -> None:
    profiles = [priced(A100_40, 0.80), priced(H100, 4.00)]
    options, cheapest = by_cost(cost_spec(steps=None), profiles)

    assert cheapest is not None and cheapest.cluster == "a100-40"
    assert cheapest.cost_usd is None and cheapest.usd_per_step is not None
    assert cost_words(cheapest) == f"{money(cheapest.usd_per_step)} a step"
    h100 = next(o for o in options if o.cluster == "h100")
    assert h100.usd_per_step is not None and h100.usd_per_step > cheapest.usd_per_step


def test_an_unpriced_cluster_is_taken_only_when_no_priced_one_can_run_the_job() -> None:
    unpriced_fast = priced(H100, None)
    _, chosen = by_cost(cost_spec(), [priced(A100_40, 0.80), unpriced_fast])
    assert chosen is not None and chosen.cluster == "a100-40"  # faster, but its cost unknown

    options, fallback = by_cost(cost_spec(), [priced(SMALL, 0.0), unpriced_fast])
    assert fallback is not None and fallback.cluster == "h100"  # the priced one is too small
    assert summary(options, fallback, "cost").startswith("placed on h100 (ZeRO-")  # by time
    assert cost_words(fallback) == ""
    assert why_not(options[0], fallback, "cost").startswith("has 2 GPUs per node")


def test_costs_within_five_percent_are_a_tie_the_earlier_end_breaks() -> None:
    options, _ = by_cost(cost_spec(), [priced(A100_40, 1.0), priced(H100, 1.0)])
    a100, h100 = (o.cost_usd for o in options)
    assert a100 is not None and h100 is not None
    # price the H100 so that its job costs 4% more than the A100's: a tie, and it ends first
    near = 1.0 * a100 / h100 * 1.04
    options, chosen = by_cost(cost_spec(), [priced(A100_40, 1.0), priced(H100, near)])
    assert chosen is not None and chosen.cluster == "h100"
    assert why_not(options[0], chosen, "cost") == "ends later"
    # 6% more is no tie: the cheaper one wins
    over = 1.0 * a100 / h100 * 1.06
    options, chosen = by_cost(cost_spec(), [priced(A100_40, 1.0), priced(H100, over)])
    assert chosen is not None and chosen.cluster == "a100-40"
    assert why_not(options[1], chosen, "cost") == "costs more"


def test_money_reads_to_the_cent_and_small_amounts_to_three_digits() -> None:
    assert money(1234.5) == "$1,234.50"
    assert money(0.0) == "$0.00"
    assert money(0.0206) == "$0.0206"
    assert money(0.000000512) == "$0.000000512"


def test_a_negative_price_and_an_unknown_placement_are_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as price:
        ClusterProfile.model_validate({**H100.model_dump(), "usd_per_gpu_hour": -1.0})
    assert price.value.errors()[0]["loc"] == ("usd_per_gpu_hour",)
    spec = {**SEVEN_B, "resources": {**SEVEN_B["resources"], "placement": "cheap"}}  # type: ignore[dict-item]
    with pytest.raises(ValidationError) as placement:
        JobSpec.model_validate(spec)
    error = placement.value.errors()[0]
    assert error["loc"] == ("resources", "placement")
    assert "'time' or 'cost'" in error["msg"]
