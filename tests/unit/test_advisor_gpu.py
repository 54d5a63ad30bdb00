"""The advisor on real GPUs: the two cases the H200 runs settle, and the GPU memory paths.

The real runs (bench/data/h200_runs.jsonl, one H200, bf16, torch AdamW via ``torch_adam``) say
which configurations fit; the advisor must never call one fit that really needs more.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from service.core.advisor import NoPlanFits, advise
from service.core.advisor.constants import CALIBRATION
from service.core.advisor.layout import Layout, Workload, model_sized_knobs
from service.core.advisor.memory import predict_memory
from service.core.advisor.models import PHASE_WORDS
from service.core.advisor.shape import resolve_shape
from service.core.spec import JobSpec, ModelSpec
from tests.unit.shapes import LLAMA_1B1, LLAMA_6B7, single_gpu

GIB = 1024**3


def llama_job(model: dict[str, Any], **training: Any) -> JobSpec:
    return JobSpec(
        name="llama",
        entrypoint="train.py",
        model=model,
        training={"optimizer_impl": "torch", **training},  # as the H200 runs were made
        resources={"cluster": "gpu", "nodes": 1, "gpus_per_node": 1},
    )


def test_6b7_llama_on_an_h200_gets_zero3_with_checkpointing_decided_by_the_step() -> None:
    spec = llama_job(LLAMA_6B7, sequence_length=2048, global_batch_size=4)

    advice = advise(spec, single_gpu(139.8))

    plan = advice.plan
    # the real runs: ZeRO-0 runs out of memory inside deepspeed.initialize; ZeRO-3 with
    # checkpointing fits. Nothing below ZeRO-3 may be called fit without offload.
    assert (plan.zero_stage, plan.offload_optimizer, plan.activation_checkpointing) == (
        3, "none", True,
    )  # fmt: skip
    on_gpu = [c for c in advice.candidates if c.offload_optimizer == "none"]
    assert not any(c.fits for c in on_gpu if c.zero_stage < 3)
    assert plan.peak_phase == "step"
    assert "peak in the optimizer step" in advice.reason
    assert plan.per_gpu_bytes.total <= 139.8 * GIB * 0.9


def test_1b1_llama_on_24_gib_offloads_the_optimizer() -> None:
    spec = llama_job(LLAMA_1B1, sequence_length=2048, global_batch_size=4)

    advice = advise(spec, single_gpu(24))

    # the real runs: every layout without offload reserves at least 26.9 GiB (the optimizer
    # step alone allocates 22.7); ZeRO-2 with optimizer offload reserves 7.3 GiB
    without_offload = [c for c in advice.candidates if c.offload_optimizer == "none"]
    assert not any(c.fits for c in without_offload)
    assert advice.plan.offload_optimizer == "cpu"
    zero0 = [c for c in without_offload if c.zero_stage == 0]
    assert min(c.per_gpu_bytes.total for c in zero0) > 24 * GIB
    # the reason names the faster plan that does not fit, its speed and its need
    assert "ZeRO-2 without checkpointing would be" in advice.reason
    assert "tokens/s but needs 38.46 GiB" in advice.reason


def gpu_work(model: dict[str, Any], impl: str = "torch", **changes: Any) -> Workload:
    work = Workload(
        shape=resolve_shape(ModelSpec(**model)),
        sequence_length=1024,
        global_batch=1,
        precision="bf16",
        optimizer="adamw",
        optimizer_impl=impl,
        nodes=1,
        gpus_per_node=1,
        on_cpu=False,
    )
    return replace(work, **changes)


def layout(stage: int, offload: bool = False, **knobs: Any) -> Layout:
    base = replace(model_sized_knobs(1_104_218_112, stage), **knobs)
    return Layout(stage, offload, False, True, 1, 1, base)


def step_bytes(work: Workload, lay: Layout) -> int:
    per_gpu = predict_memory(work, lay).per_gpu
    return per_gpu.total - per_gpu.overhead


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fused_adam_needs_less_than_torch_foreach_in_the_step(stage: int) -> None:
    torch_adam = step_bytes(gpu_work(LLAMA_1B1, "torch"), layout(stage))
    fused = step_bytes(gpu_work(LLAMA_1B1, "fused"), layout(stage))

    parameters = 1_104_218_112
    assert fused < torch_adam
    # torch's foreach sqrt copy is 4 bytes per stepped element, less the 16-bit partition
    # the fp32 conversion briefly keeps beside it (ZeRO-3 steps a 1e9 sub-group, not all)
    assert torch_adam - fused <= 2 * parameters


def test_zero0_in_bf16_peaks_when_fp16_optimizer_flattens_fp32_gradients() -> None:
    work = gpu_work(LLAMA_1B1)

    prediction = predict_memory(work, layout(0))

    # 2 params + 12 fp32 master and moments + 2 grads + 4 fp32 copies + 4 flat fp32 gradient
    per_param = (prediction.per_gpu.total - prediction.per_gpu.overhead) / 1_104_218_112
    assert prediction.phase == "step"
    assert 24.0 <= per_param < 24.2  # the H200 measured 24.07 bytes per parameter


def test_zero3_steps_one_sub_group_at_a_time() -> None:
    work = gpu_work(LLAMA_1B1, "fused")

    whole = step_bytes(work, layout(3, sub_group_size=2_000_000_000))
    split = step_bytes(work, layout(3, sub_group_size=100_000_000))

    assert split < whole


def test_optimizer_offload_takes_the_step_off_the_gpu() -> None:
    work = gpu_work(LLAMA_1B1)

    on_gpu = predict_memory(work, layout(2)).per_gpu
    offloaded = predict_memory(work, layout(2, offload=True)).per_gpu

    assert offloaded.optimizer == 0 and offloaded.temporaries == 0
    assert offloaded.total < on_gpu.total / 3


def test_the_verdict_counts_reserved_memory_and_the_cuda_context() -> None:
    prediction = predict_memory(gpu_work(LLAMA_1B1), layout(2))
    per_gpu = prediction.per_gpu
    allocated = per_gpu.total - per_gpu.overhead

    allocator = per_gpu.overhead - CALIBRATION.overhead.gpu_context_bytes
    assert allocator > 0.1 * allocated  # the caching allocator's reserve is in the total
    assert per_gpu.total == allocated + allocator + CALIBRATION.overhead.gpu_context_bytes


def test_gated_mlp_keeps_more_activations_than_a_plain_one() -> None:
    plain = {**LLAMA_1B1, "mlp": "plain"}
    for_gated = gpu_work(LLAMA_1B1, sequence_length=4096)
    for_plain = gpu_work(plain, sequence_length=4096)
    unchecked = replace(layout(2), checkpointing=False)

    gated_peak = predict_memory(for_gated, unchecked).per_gpu.activations
    plain_peak = predict_memory(for_plain, unchecked).per_gpu.activations

    assert gated_peak > plain_peak


def test_nothing_fits_on_the_gpu_names_where_the_closest_peaks() -> None:
    spec = llama_job(LLAMA_6B7, sequence_length=4096, global_batch_size=8)
    tiny_gpu = single_gpu(4).model_copy(update={"cpu_memory_gib": 4096})

    with pytest.raises(NoPlanFits) as raised:
        advise(spec, tiny_gpu)

    message = str(raised.value)
    assert message.startswith("no configuration fits the per-GPU budget of 3.60 GiB")
    assert raised.value.closest.peak_phase is not None
    assert f"(peak {PHASE_WORDS[raised.value.closest.peak_phase]})" in message
