"""Re-planning after out-of-memory failures, with the evidence real failures carry."""

from __future__ import annotations

from typing import Any

from service.core.advisor import Candidate, advise
from service.core.advisor.choice import offload_level, plan_identity
from service.core.clusters import LOCAL_PROFILE
from service.core.escalation import Decision, Evidence, evidence_from, replan
from service.core.failures import diagnose_failure
from service.core.spec import JobSpec
from tests.unit.shapes import LLAMA_7B, h100_node

H100 = h100_node()
GIB, MIB = 1024**3, 1024**2


def llama7b(**zero: Any) -> JobSpec:
    return JobSpec(
        name="llama",
        entrypoint="train.py",
        model=LLAMA_7B,
        training={"sequence_length": 4096, "global_batch_size": 256},
        resources={"nodes": 1, "gpus_per_node": 8},
        zero=zero,
        escalation={"max_attempts": 20},
    )


def tiny_cpu_job() -> JobSpec:
    """The end-to-end test's job: 2 CPU ranks, activations that dominate the step."""
    return JobSpec.model_validate(
        {
            "name": "tiny",
            "entrypoint": "train_tiny.py",
            "model": {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "vocab_size": 128},
            "training": {"sequence_length": 1024, "global_batch_size": 16, "precision": "fp32"},
            "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
        }
    )


def escalated(decision: Decision | None) -> Candidate:
    assert decision is not None and decision.action == "escalate", decision
    assert decision.plan is not None
    return decision.plan


def test_the_next_plan_saves_at_least_the_missing_bytes_and_keeps_the_global_batch() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    for missing in (2 * GIB, 30 * GIB, 45 * GIB):
        nxt = escalated(replan(spec, H100, plan, Evidence("OOM_GPU", missing_bytes=missing), []))
        assert plan.per_gpu_bytes.total - nxt.per_gpu_bytes.total >= missing
        assert nxt.fits and nxt.ds_config["train_batch_size"] == 256
        assert nxt.micro_batch_size * nxt.gradient_accumulation_steps * 8 == 256


def test_same_stage_changes_come_before_a_higher_stage_and_offload_comes_last() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    stage = plan.zero_stage  # ZeRO-2 (ZeRO-1 ties with it in time and loses the tie)
    assert (stage, offload_level(plan), plan.activation_checkpointing) == (2, 0, False)

    def next_for(missing_gib: int) -> Candidate:
        evidence = Evidence("OOM_GPU", missing_bytes=missing_gib * GIB)
        return escalated(replan(spec, H100, plan, evidence, []))

    small = next_for(2)  # a smaller micro-batch at the same stage saves enough
    assert (small.zero_stage, offload_level(small)) == (stage, 0)
    assert small.micro_batch_size < plan.micro_batch_size
    mid = next_for(40)  # checkpointing at the same stage
    assert (mid.zero_stage, offload_level(mid), mid.activation_checkpointing) == (stage, 0, True)
    high = next_for(50)  # only a higher stage saves 50 GiB without offload
    assert (high.zero_stage, offload_level(high)) == (3, 0)
    offloaded = next_for(55)  # nothing without offload saves 55 GiB
    assert offload_level(offloaded) == 1


def test_the_fastest_qualifying_plan_is_chosen() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    nxt = escalated(replan(spec, H100, plan, Evidence("OOM_GPU", missing_bytes=2 * GIB), []))
    same_tier = [
        c
        for c in advise(spec, H100).candidates
        if c.zero_stage <= plan.zero_stage
        and offload_level(c) == 0
        and plan.per_gpu_bytes.total - c.per_gpu_bytes.total >= 2 * GIB
    ]
    assert nxt.relative_cost == min(c.relative_cost for c in same_tier)


def test_a_plan_already_tried_is_never_chosen_again() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    first = escalated(replan(spec, H100, plan, Evidence("OOM_GPU", missing_bytes=2 * GIB), []))
    again = escalated(replan(spec, H100, plan, Evidence("OOM_GPU", missing_bytes=2 * GIB), [first]))
    assert plan_identity(again) not in {plan_identity(first), plan_identity(plan)}


def test_the_observed_need_corrects_the_prediction() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    # The CUDA OOM said: this process held 75 GiB and tried 4 GiB more: 79 GiB needed where the
    # model predicted ~70 GiB, so every prediction of this job is scaled by ~1.13.
    evidence = Evidence(
        "OOM_GPU", missing_bytes=3 * GIB, tried_bytes=4 * GIB, process_bytes=75 * GIB,
        capacity_bytes=80 * GIB,
    )  # fmt: skip
    decision = replan(spec, H100, plan, evidence, [])
    nxt = escalated(decision)
    correction = 79 * GIB / plan.per_gpu_bytes.total
    assert f"x{correction:.2f} correction" in decision.reason  # type: ignore[union-attr]
    assert correction * nxt.per_gpu_bytes.total <= 0.9 * 80 * GIB
    assert correction * (plan.per_gpu_bytes.total - nxt.per_gpu_bytes.total) >= 3 * GIB


def test_an_oom_caused_by_other_processes_keeps_the_plan() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.50 GiB is free. Process 81231 has 40.25 GiB "
        "memory in use. Including non-PyTorch memory, this process has 37.40 GiB memory in use. "
        "Of the allocated memory 35.10 GiB is allocated by PyTorch, and 1.66 GiB is reserved by "
        "PyTorch but unallocated."
    )
    diagnosis = diagnose_failure(
        exit_code=1, native_state="", reason="", log_tail=text, runtime_tag=None
    )
    decision = replan(spec, H100, plan, evidence_from(diagnosis.as_record(), {}), [])
    assert decision is not None and decision.action == "retry"
    assert decision.plan == plan
    assert "other processes held 40.25 GiB of the GPU's 79.19 GiB" in decision.reason


def test_other_processes_seen_at_rank_start_count_as_evidence() -> None:
    record = {"failure_class": "OOM_GPU", "numbers": {"tried_bytes": 2 * GIB}}
    runtime = {"devices": {"0": {"numbers": {"other_processes_bytes": 30 * GIB}}}}
    assert evidence_from(record, runtime).other_processes_bytes == 30 * GIB
    # A rank's own CUDA context is neither free nor reserved by PyTorch: not a neighbour.
    context = {"devices": {"1": {"numbers": {"other_processes_bytes": 500 * MIB}}}}
    assert evidence_from(record, context).other_processes_bytes == 0


def test_an_oom_the_plan_itself_caused_is_not_retried_even_with_neighbours() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    evidence = Evidence(
        "OOM_GPU", missing_bytes=10 * GIB, tried_bytes=12 * GIB, process_bytes=70 * GIB,
        capacity_bytes=80 * GIB, other_processes_bytes=2 * GIB,
    )  # fmt: skip
    assert escalated(replan(spec, H100, plan, evidence, [])) != plan


def test_when_nothing_saves_enough_the_decision_says_so_with_numbers() -> None:
    spec = llama7b()
    plan = advise(spec, H100).plan
    decision = replan(spec, H100, plan, Evidence("OOM_GPU", missing_bytes=69 * GIB), [])
    assert decision is not None and decision.action == "stop"
    assert "save the 69.00 GiB needed" in decision.reason
    assert "the most saving, ZeRO-3 +offload(opt+params)" in decision.reason


def test_a_cpu_cluster_replans_the_host_as_its_device() -> None:
    spec = tiny_cpu_job()
    plan = advise(spec, LOCAL_PROFILE).plan
    assert plan.label() == "ZeRO-0 mb=8x1"
    # The real failure: a rank's step over its address-space cap missed 37 MiB.
    evidence = Evidence("OOM_HOST", missing_bytes=37 * MIB, tried_bytes=16 * MIB)
    nxt = escalated(replan(spec, LOCAL_PROFILE, plan, evidence, []))
    assert nxt.label() == "ZeRO-0 mb=4x2"  # the fastest that saves 37 MiB: no offload, no stage
    bigger = Evidence("OOM_HOST", missing_bytes=150 * MIB, tried_bytes=16 * MIB)
    assert escalated(replan(spec, LOCAL_PROFILE, plan, bigger, [])).label() == "ZeRO-0 mb=2x4"


def test_zero3_is_chosen_only_where_it_needs_less() -> None:
    spec = tiny_cpu_job()
    plan = advise(spec, LOCAL_PROFILE).plan
    zero3 = [c for c in advise(spec, LOCAL_PROFILE).candidates if c.zero_stage == 3]
    assert all(c.per_gpu_bytes.total > 0 for c in zero3)
    tried: list[Candidate] = []
    current = plan
    for _ in range(8):  # climb until nothing saves 5% more
        decision = replan(spec, LOCAL_PROFILE, current, Evidence("OOM_HOST"), tried)
        if decision is None or decision.action != "escalate" or decision.plan is None:
            break
        assert decision.plan.per_gpu_bytes.total < current.per_gpu_bytes.total
        tried.append(current)
        current = decision.plan
    assert len(tried) >= 2


def test_a_host_oom_on_a_gpu_cluster_stops_where_no_plan_saves_host_memory() -> None:
    # The advisor's host floor is every rank building the fp32 model (8 x 7B x 4 bytes here),
    # whatever the offload: leaving offload saves nothing the model can see, and it says so.
    spec = llama7b(stage=3, offload="optimizer", activation_checkpointing=True)
    plan = advise(spec, H100).plan
    decision = replan(spec, H100, plan, Evidence("OOM_HOST"), [])
    assert decision is not None and decision.action == "stop"
    assert "no untried plan is predicted to fit 1843.20 GiB" in decision.reason
    assert "saves 0.00 MiB" in decision.reason
