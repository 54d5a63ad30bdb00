"""The advisor learning from a cluster (service/core/advisor/calibration.py).

A synthetic cluster whose constants differ from today's produces observations through the model
itself, with noise: the fit must find its constants again, not move past its bounds for an odd
run, weigh a run on a shared GPU less than one alone, and never make memory less safe from one run.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

import pytest

from service.core.advisor.calibration import Observation, fit, steady_step_seconds
from service.core.advisor.calibration_memory import (
    FEWEST_TO_LOWER,
    MOST_LOWERED,
    PeakKind,
    allowance,
)
from service.core.advisor.constants import CALIBRATION, Calibration
from service.core.advisor.layout import Layout, Workload, model_sized_knobs
from service.core.advisor.memory import predict_memory
from service.core.advisor.step_time import predict_step_time
from service.core.advisor.workload import build_workload
from service.core.spec import JobSpec
from tests.unit.shapes import LLAMA_1B1, h100_node
from tests.unit.test_advisor_time import LLAMA_134M

# The synthetic cluster: slower device and links, a slower host, a slower host optimizer
TRUTH = {
    "mfu_max": 0.75,
    "host_seconds_per_block_pass": 1.6,
    "host_seconds_per_zero3_hook": 1.4,
    "host_torch_adam_params_per_s": 0.7,
    "link_efficiency": 0.6,
}


def workload(model: dict[str, Any], sequence: int, batch: int, nodes: int = 1) -> Workload:
    gpus = 8 if nodes > 1 else 1
    spec = JobSpec(
        name="learn",
        entrypoint="train.py",
        model=model,
        training={
            "optimizer_impl": "torch",
            "sequence_length": sequence,
            "global_batch_size": batch * gpus * nodes,
        },
        resources={"cluster": "h100", "nodes": nodes, "gpus_per_node": gpus},
    )
    return build_workload(spec, h100_node())


def layout(work: Workload, stage: int, ckpt: bool = False, offload: bool = False) -> Layout:
    knobs = model_sized_knobs(work.shape.parameters, stage)
    return Layout(stage, offload, False, ckpt, work.per_rank_batch, 1, knobs)


def plans() -> list[tuple[Workload, Layout]]:
    """Host-bound, device-bound, ZeRO-3, offload and two-node plans: each knob exercised."""
    out = []
    for model, sequence, batch in ((LLAMA_134M, 1024, 1), (LLAMA_1B1, 4096, 4)):
        work = workload(model, sequence, batch)
        out += [(work, layout(work, s, c)) for s in (0, 2, 3) for c in (False, True)]
        out.append((work, layout(work, 2, True, offload=True)))
    for sequence, batch in ((1024, 1), (2048, 2)):
        work = workload(LLAMA_1B1, sequence, batch, nodes=2)
        out += [(work, layout(work, s)) for s in (0, 1, 2)]
    return out


def cluster(truth: dict[str, float] = TRUTH) -> Calibration:
    speeds = CALIBRATION.speeds
    changed = {name: getattr(speeds, name) * factor for name, factor in truth.items()}
    return replace(CALIBRATION, speeds=replace(speeds, **changed))


def observe(
    work: Workload,
    lay: Layout,
    constants: Calibration,
    key: str,
    noise: float = 1.0,
    neighbours: int = 0,
) -> Observation:
    seconds = predict_step_time(work, lay, constants).seconds * noise
    return Observation(key, work, lay, seconds, neighbours)


def synthetic(seed: int = 37, spread: float = 0.03) -> list[Observation]:
    rng, truth = random.Random(seed), cluster()
    return [
        observe(work, lay, truth, f"run {i}", math.exp(rng.gauss(0.0, spread)))
        for i, (work, lay) in enumerate(plans())
    ]


def test_no_observations_leave_the_advisor_exactly_as_it_is() -> None:
    calibrated = fit([])
    assert calibrated.constants == CALIBRATION
    work, lay = plans()[0]
    assert predict_step_time(work, lay, calibrated.constants) == predict_step_time(work, lay)


def test_a_known_cluster_s_constants_are_recovered_from_its_noisy_runs() -> None:
    calibrated = fit(synthetic())

    for name, factor in TRUTH.items():
        assert calibrated.multipliers[name] == pytest.approx(factor, rel=0.08), name
        assert name in calibrated.identified
    # no plan runs DeepSpeedCPUAdam: its constant keeps today's value and says so
    assert calibrated.multipliers["host_cpu_adam_params_per_s"] == 1.0
    assert "host_cpu_adam_params_per_s" not in calibrated.identified
    assert calibrated.typical_error < 0.05


def test_the_record_names_the_run_that_moved_the_host_optimizer() -> None:
    calibrated = fit(synthetic())

    strongest = calibrated.moves_of("host_torch_adam_params_per_s")[0]
    offloaded = {o.key for o in synthetic() if o.layout.offload_optimizer}
    assert strongest.observation in offloaded
    assert strongest.log_shift < 0  # the cluster's host optimizer is slower than today's


def test_one_odd_run_among_many_hardly_moves_the_constants() -> None:
    runs = synthetic()
    work, lay = runs[0].work, runs[0].layout
    stalled = observe(work, lay, cluster(), "dataloader-bound", noise=5.0)

    without, with_odd = fit(runs).multipliers, fit([*runs, stalled]).multipliers

    for name in TRUTH:
        assert with_odd[name] == pytest.approx(without[name], rel=0.05), name


def test_one_extreme_run_alone_stops_at_the_bound() -> None:
    work, lay = plans()[0]  # 134M at 1024 tokens: host-bound
    stalled = observe(work, lay, CALIBRATION, "hung for minutes", noise=1000.0)

    calibrated = fit([stalled])

    assert max(calibrated.multipliers.values()) <= 10.0 + 1e-9
    assert calibrated.constants.speeds.mfu_max <= 1.0


def test_a_run_on_a_shared_gpu_weighs_less_than_one_alone() -> None:
    truth = synthetic()
    work, lay = truth[0].work, truth[0].layout
    slow = {n: observe(work, lay, CALIBRATION, f"{n} neighbours", 1.5, n) for n in (0, 3)}

    moved = {n: fit([o]).multipliers["host_seconds_per_block_pass"] for n, o in slow.items()}
    assert 1.0 < moved[3] < moved[0]
    # the two disagree about the same plan: the fit sides with the run alone
    alone = observe(work, lay, CALIBRATION, "alone, as today")
    both = fit([alone, slow[3]]).multipliers["host_seconds_per_block_pass"]
    assert both < math.sqrt(1.5)


def measured(work: Workload, lay: Layout, extra: float, kind: PeakKind = "reserved") -> Observation:
    """An observation whose reserved peak is the prediction plus ``extra`` of its headroom's
    allowance (1.0: exactly what the smallest budget that fits would hold)."""
    total = predict_memory(work, lay).per_gpu.total
    context = CALIBRATION.overhead.gpu_context_bytes
    probe = Observation("probe", work, lay, 1.0)
    peak = int(total + extra * allowance(total, probe)) - context
    return Observation(f"{extra:+.1f} x allowance", work, lay, 1.0, peak_bytes=peak, peak_kind=kind)


def fits_its_smallest_budget(o: Observation, constants: Calibration) -> bool:
    total = predict_memory(o.work, o.layout, constants).per_gpu.total
    assert o.peak_bytes is not None
    need = o.peak_bytes + constants.overhead.gpu_context_bytes
    return need <= total + allowance(total, o)


def test_memory_is_never_lowered_on_one_run() -> None:
    work, lay = plans()[7]  # 1.1B ZeRO-0 on one GPU
    roomy = measured(work, lay, -5.0)

    calibrated = fit([roomy])

    assert calibrated.memory.gpu_share == 0.0
    before = predict_memory(work, lay).per_gpu.total
    assert predict_memory(work, lay, calibrated.constants).per_gpu.total == before


def test_one_run_that_would_not_have_fitted_raises_memory_until_it_does() -> None:
    work, lay = plans()[7]
    tight = measured(work, lay, 3.0)
    assert not fits_its_smallest_budget(tight, CALIBRATION)

    calibrated = fit([tight])

    assert calibrated.memory.gpu_share > 0
    assert fits_its_smallest_budget(tight, calibrated.constants)
    assert tight.key in calibrated.memory.reason


@pytest.mark.parametrize("kind", ["reserved", "allocated"])
def test_memory_goes_down_only_on_many_exact_peaks_and_keeps_every_one_fitting(
    kind: PeakKind,
) -> None:
    gpu_plans = [(w, lay) for w, lay in plans() if w.world_size == 1]
    roomy = [measured(w, lay, -3.0, kind) for w, lay in gpu_plans][:FEWEST_TO_LOWER]
    assert len(roomy) == FEWEST_TO_LOWER

    calibrated = fit(roomy)

    if kind == "allocated":  # a lower bound of what was reserved says nothing of room
        assert calibrated.memory.gpu_share == 0.0
        return
    assert MOST_LOWERED <= calibrated.memory.gpu_share < 0
    assert all(fits_its_smallest_budget(o, calibrated.constants) for o in roomy)
    assert fit(roomy[:-1]).memory.gpu_share == 0.0  # one fewer: unchanged


def test_steady_steps_leave_out_the_warm_up_and_need_enough_of_them() -> None:
    assert steady_step_seconds([9.0, 5.0, 3.0, 1.0, 1.2, 1.1, 0.9, 1.0]) == 1.0
    assert steady_step_seconds([9.0, 5.0, 3.0, 1.0, 1.2, 1.1]) is None


def test_an_observation_without_a_positive_step_time_is_refused() -> None:
    work, lay = plans()[0]
    with pytest.raises(ValueError, match="step_seconds must be positive"):
        Observation("attempt 7", work, lay, 0.0)
