"""The step-time model and the choice it drives, on the cases the H200 runs settle.

The runs (bench/data/h200_runs.jsonl): 1.1B Llama at 2048 x 4 and 4096 x 2 tokens ran fastest at
ZeRO-2 without checkpointing (42,697 and 41,618 tokens/s, one neighbour each), which fits a
40 GiB GPU (37.75 GiB reserved); the 134M model alone on the GPU ran 12,774 tokens/s at ZeRO-0
and 4,686 at ZeRO-3, with no network involved.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from service.core.advisor import advise
from service.core.advisor.layout import Layout, Workload, model_sized_knobs
from service.core.advisor.step_time import predict_step_time
from service.core.advisor.workload import budget_bytes, build_workload
from service.core.escalation import Evidence, replan
from tests.unit.shapes import LLAMA_1B1, h100_node, single_gpu
from tests.unit.test_advisor_gpu import llama_job

GIB = 1024**3
LLAMA_134M = {
    "hidden_size": 768,
    "num_layers": 12,
    "num_heads": 12,
    "ffn_size": 2048,
    "vocab_size": 32000,
    "tied_embeddings": False,
    "mlp": "gated",
}


@pytest.mark.parametrize(("sequence", "batch"), [(2048, 4), (4096, 2)])
def test_1b1_llama_at_40_gib_gets_zero2_without_checkpointing(sequence: int, batch: int) -> None:
    advice = advise(
        llama_job(LLAMA_1B1, sequence_length=sequence, global_batch_size=batch), single_gpu(40)
    )

    plan = advice.plan
    assert (plan.zero_stage, plan.offload_optimizer, plan.activation_checkpointing) == (
        2, "none", False,
    )  # fmt: skip
    assert plan.micro_batch_size == batch
    # the runner-up in numbers: ZeRO-0 without checkpointing, a few percent slower
    assert "ZeRO-2 without checkpointing is the fastest plan that fits" in advice.reason
    assert "ZeRO-0 without checkpointing would be" in advice.reason
    zero0 = next(
        c
        for c in advice.candidates
        if (c.zero_stage, c.activation_checkpointing, c.micro_batch_size) == (0, False, batch)
    )
    assert zero0.fits and zero0.step_seconds is not None and plan.step_seconds is not None
    assert 1.0 < zero0.step_seconds / plan.step_seconds < 1.10


def layout(stage: int, checkpointing: bool = False) -> Layout:
    return Layout(stage, False, False, checkpointing, 1, 1, model_sized_knobs(134_000_000, stage))


def llama_134m_alone() -> Workload:
    spec = llama_job(LLAMA_134M, sequence_length=1024, global_batch_size=1)
    return build_workload(spec, single_gpu(139.8))


def test_zero3_on_one_gpu_is_predicted_slower_than_zero0() -> None:
    work = llama_134m_alone()

    zero0 = predict_step_time(work, layout(0)).seconds
    zero3 = predict_step_time(work, layout(3)).seconds

    # measured alone on the H200: 80.2 ms and 218.5 ms; within the +-20% the model claims
    assert zero0 == pytest.approx(0.0802, rel=0.20)
    assert zero3 == pytest.approx(0.2185, rel=0.20)
    assert zero3 > 2 * zero0


def test_checkpointing_costs_a_recompute() -> None:
    work = build_workload(
        llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4), single_gpu(139.8)
    )
    plain = Layout(2, False, False, False, 4, 1, model_sized_knobs(1_100_000_000, 2))

    without = predict_step_time(work, plain).seconds
    with_ckpt = predict_step_time(work, replace(plain, checkpointing=True)).seconds

    # a fourth forward of the blocks on top of three passes: at most a third more
    assert 1.1 < with_ckpt / without <= 4 / 3


def test_one_gpu_has_no_network_and_more_gpus_pay_the_profile_link() -> None:
    spec = llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4)
    one = Layout(0, False, False, False, 4, 1, model_sized_knobs(1_100_000_000, 0))
    slow_link = single_gpu(139.8).model_copy(update={"intra_node_gb_per_s": 1.0})
    assert predict_step_time(build_workload(spec, slow_link), one) == predict_step_time(
        build_workload(spec, single_gpu(139.8)), one
    )

    eight = spec.model_copy(
        update={"resources": spec.resources.model_copy(update={"gpus_per_node": 8})}
    )
    eight = eight.model_copy(
        update={"training": eight.training.model_copy(update={"global_batch_size": 32})}
    )
    fast = predict_step_time(build_workload(eight, h100_node()), one).seconds
    slow = h100_node(intra_node_gb_per_s=10.0)
    slower = predict_step_time(build_workload(eight, slow), one).seconds
    # ZeRO-0's all-reduce: 2 x 2 bytes x 1.1e9 x 7/8 over 10 GB/s instead of 360 GB/s
    assert slower - fast == pytest.approx(2 * 2 * 1.1e9 * 7 / 8 * (1 / 10e9 - 1 / 360e9), 0.05)


def test_the_gpu_headroom_is_the_measured_error_not_a_tenth() -> None:
    assert budget_bytes(single_gpu(40)) == int(40 * GIB - (GIB + 0.4 * GIB))
    assert budget_bytes(single_gpu(8)) == int(8 * GIB * 0.9)  # 10% is less than 1 GiB + 1%
    assert budget_bytes(single_gpu(40), 0.10) == int(40 * GIB * 0.9)
    # under optimizer offload the model's error is 8.4% on the runs: those plans keep 10%
    assert budget_bytes(single_gpu(40), offload=True) == int(40 * GIB * 0.9)


def test_a_crowded_out_plan_predicted_above_the_device_escalates_instead_of_retrying() -> None:
    spec = llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4)
    profile = single_gpu(40)
    plan = advise(spec, profile).plan  # ZeRO-2, 38.46 GiB predicted
    # the failed process held 20 GiB and tried 2 more while neighbours held the rest of a
    # 32 GiB device: held + tried fits the device, the prediction does not
    evidence = Evidence(
        "OOM_GPU", missing_bytes=1 * GIB, tried_bytes=2 * GIB, process_bytes=20 * GIB,
        capacity_bytes=32 * GIB, other_processes_bytes=11 * GIB,
    )  # fmt: skip

    decision = replan(spec, profile, plan, evidence, [])

    assert decision is not None and decision.action == "escalate"
    assert decision.plan is not None and decision.plan.per_gpu_bytes.total < 31 * GIB


def test_an_oom_inside_initialize_is_matched_against_the_initialize_prediction() -> None:
    spec = llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4)
    profile = single_gpu(40)
    plan = advise(spec, profile).plan  # ZeRO-2: 38.46 GiB in training, 10.88 GiB at init
    assert plan.initialize_bytes is not None
    assert plan.initialize_bytes < plan.per_gpu_bytes.total
    figures = {"missing_bytes": 1 * GIB, "tried_bytes": 2 * GIB, "process_bytes": 12 * GIB}

    at_init = replan(spec, profile, plan, Evidence("OOM_GPU", **figures, phase="initialize"), [])
    unknown = replan(spec, profile, plan, Evidence("OOM_GPU", **figures), [])

    # 14 GiB held + tried is 1.29x the initialize prediction, but below the training peak's
    correction = 14 * GIB / plan.initialize_bytes
    assert at_init is not None and f"x{correction:.2f} correction" in at_init.reason
    assert "inside deepspeed.initialize" in at_init.reason
    assert unknown is not None and "x1.00 correction" in unknown.reason


def test_the_initialize_peak_is_a_phase_of_the_prediction() -> None:
    work = build_workload(
        llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4), single_gpu(139.8)
    )
    from service.core.advisor.memory import predict_memory

    zero2 = predict_memory(work, Layout(2, False, False, True, 4, 1, model_sized_knobs(0, 2)))
    # the H200 run: 10.28 GiB allocated inside deepspeed.initialize at ZeRO-2 (10 bytes/param)
    context = 600 * 1024**2
    assert (zero2.initialize_bytes - context) / GIB == pytest.approx(10.28, abs=0.05)
