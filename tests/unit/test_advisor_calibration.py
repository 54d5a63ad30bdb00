"""The GPU calibration command's plan, checked without a GPU: what it would measure, in what
order, and that the advisor can size every probe (the scheduler packs probes by it)."""

from __future__ import annotations

import json

from bench.gpu_calibrate import Probe, can_start, command, plan
from bench.gpu_runs import H200_RUNS

GIB = 1024**3
H200 = int(139.8 * GIB)


def shared_specs() -> list[dict[str, object]]:
    return [json.loads(line)["spec"] for line in H200_RUNS.read_text().splitlines() if line]


def test_one_gpu_times_alone_then_remeasures_the_grid_then_fused_adam_then_held_out() -> None:
    probes = plan(1)

    timed = [p for p in probes if p.spec.get("alone")]
    assert probes[: len(timed)] == timed and len(timed) == 16
    assert all(p.spec["steps"] > p.spec["warmup"] >= 2 for p in timed)
    assert [p.spec for p in probes[len(timed) : len(timed) + 44]] == shared_specs()
    fused = [p for p in probes if p.spec.get("optimizer") == "fused"]
    assert {p.spec["stage"] for p in fused} == {0, 1, 2, 3}
    assert all(p.gpus == 1 for p in probes)
    assert probes[-2].spec["name"] == "llama-6.7b" and probes[-2].spec["stage"] == 3
    assert all(p.predicted > 0 for p in probes)


def test_several_gpus_add_runs_under_the_deepspeed_launcher() -> None:
    several = [p for p in plan(8) if p.gpus > 1]

    assert {p.spec["stage"] for p in several} == {1, 2, 3} and {p.gpus for p in several} == {8}
    argv = command(several[0], 29650)
    assert argv[:5] == ["deepspeed", "--num_gpus", "8", "--master_port", "29650"]
    assert json.loads(argv[-1])["port"] == 29650


def test_a_timed_probe_has_the_gpu_to_itself() -> None:
    timed, other = Probe({"alone": True}, 1, 5 * GIB), Probe({}, 1, 5 * GIB)

    assert can_start(timed, [], H200, jobs=4)
    assert not can_start(timed, [other], H200, jobs=4)
    assert not can_start(other, [timed], H200, jobs=4)


def test_probes_share_the_gpu_only_while_the_predictions_fit() -> None:
    big, small = Probe({}, 1, 80 * GIB), Probe({}, 1, 30 * GIB)
    several = Probe({}, 8, 5 * GIB)

    assert can_start(big, [], H200, jobs=4)
    assert can_start(small, [big], H200, jobs=4)  # 110 GiB of 118.8 (85%)
    assert not can_start(small, [big, small], H200, jobs=4)
    assert not can_start(several, [small], H200, jobs=4)  # a several-GPU run goes alone
    assert not can_start(small, [small, small], H200, jobs=2)
