"""A namespace's GPU quota as the bound on zeropilot's GPUs there (kubernetes_quota)."""

from __future__ import annotations

from typing import Any

from workers.backends.kubernetes_quota import gpu_bound

GPU = "nvidia.com/gpu"


def quota(name: str, hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": {"hard": hard, **spec}}


def test_the_tightest_gpu_limit_bounds_and_names_its_quota() -> None:
    quotas = [
        quota("team", {"requests.nvidia.com/gpu": "16", "requests.memory": "1Ti"}),
        quota("lab", {"requests.nvidia.com/gpu": "12"}),
        quota("pods-only", {"pods": "100"}),
    ]
    assert gpu_bound(quotas, GPU) == (12, "namespace quota ml/lab: requests.nvidia.com/gpu=12")


def test_no_gpu_limit_is_no_bound() -> None:
    assert gpu_bound([], GPU) is None
    assert gpu_bound([quota("mem", {"requests.memory": "1Ti"})], GPU) is None
    # another accelerator's resource does not limit this profile's
    assert gpu_bound([quota("amd", {"requests.amd.com/gpu": "4"})], GPU) is None


def test_a_scoped_quota_may_not_apply_to_zeropilots_pods_and_is_left_out() -> None:
    scoped = quota("high", {"requests.nvidia.com/gpu": "2"}, scopes=["PriorityClass"])
    selected = quota(
        "sel",
        {"requests.nvidia.com/gpu": "4"},
        scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass", "operator": "Exists"}]},
    )
    plain = quota("team", {"requests.nvidia.com/gpu": "16"})
    assert gpu_bound([scoped, selected, plain], GPU) == (
        16,
        "namespace quota ml/team: requests.nvidia.com/gpu=16",
    )


def test_quantities_are_read_as_kubernetes_writes_them_and_rounded_down() -> None:
    assert gpu_bound([quota("k", {"requests.nvidia.com/gpu": "1k"})], GPU) == (
        1000,
        "namespace quota ml/k: requests.nvidia.com/gpu=1k",
    )
    assert gpu_bound([quota("m", {"requests.nvidia.com/gpu": "7500m"})], GPU) == (
        7,
        "namespace quota ml/m: requests.nvidia.com/gpu=7500m",
    )
    assert gpu_bound([quota("bad", {"requests.nvidia.com/gpu": "lots"})], GPU) is None
