"""Young's checkpoint interval from a save time and a cluster's interruptions, its bounds, the
prior before any interruption is seen, and when a recomputed interval replaces the current."""

from __future__ import annotations

import pytest

from service.core.cadence import (
    Cadence,
    Interruptions,
    first_cadence,
    launch_steps,
    resolve_setting,
    worth_changing,
    young_cadence,
)
from service.core.clusters import LOCAL_PROFILE
from service.core.spec import CheckpointSpec


def test_the_issues_example_a_41_s_save_on_a_cluster_that_loses_a_16_gpu_job_every_19_h() -> None:
    seen = Interruptions(gpu_hours=3 * 16 * 19.0, count=3)  # 304 GPU-hours each
    chosen = young_cadence(save_s=41.0, step_s=7.0, gpus=16, seen=seen)
    # sqrt(2 x 41 s x 68,400 s) = 2,368 s; at 7 s a step, 338 steps.
    assert chosen.steps == 338
    assert chosen.reason == (
        "every 338 steps: a save takes 41 s, this cluster loses a 16-GPU job every 19 h"
    )


def test_before_any_interruption_the_prior_and_the_upper_bound_hold() -> None:
    chosen = young_cadence(41.0, 7.0, 16, Interruptions(gpu_hours=12.0, count=0))
    # 50,000 GPU-hours / 16 = 3,125 h: Young says 8.4 h between saves; at most 4 h.
    assert chosen.steps == round(4 * 3600 / 7.0)
    assert "(none seen in 12 GPU-hours: assumed one per 50,000 GPU-hours)" in chosen.reason
    assert chosen.reason.endswith("at most 240 min between saves (506.2 min by Young)")


def test_a_fast_save_on_a_flaky_cluster_saves_no_more_often_than_every_5_minutes() -> None:
    chosen = young_cadence(0.1, 0.5, 2, Interruptions(gpu_hours=20.0, count=1))
    assert chosen.steps == 600 and "at least 5 min between saves" in chosen.reason


def test_before_a_save_is_measured_the_first_comes_after_10_minutes() -> None:
    assert first_cadence(2.0).steps == 300
    assert first_cadence(2.0, total_steps=120).steps == 120
    assert first_cadence(None).steps == 100
    assert launch_steps("auto", 2.0, None) == 300 and launch_steps(40, 2.0, None) == 40


def test_the_spec_overrides_the_clusters_default() -> None:
    auto_cluster = LOCAL_PROFILE.model_copy(update={"checkpoint_interval_steps": "auto"})
    assert resolve_setting(None, LOCAL_PROFILE) == 100
    assert resolve_setting(None, auto_cluster) == "auto"
    assert resolve_setting(25, auto_cluster) == 25 and resolve_setting("auto", None) == "auto"


def test_a_recomputed_interval_within_10_percent_is_noise() -> None:
    assert not worth_changing(379, Cadence(355, ""))
    assert worth_changing(379, Cadence(300, ""))
    assert worth_changing(None, Cadence(600, ""))


@pytest.mark.parametrize("given", ["auto", 40, "40"])
def test_the_spec_takes_steps_or_auto(given: object) -> None:
    assert CheckpointSpec.model_validate({"interval_steps": given}).interval_steps in ("auto", 40)


@pytest.mark.parametrize("given", ["often", 0, -5, "auto "])
def test_the_spec_refuses_anything_else(given: object) -> None:
    with pytest.raises(ValueError, match="interval_steps"):
        CheckpointSpec.model_validate({"interval_steps": given})
