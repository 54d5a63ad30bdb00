"""``cluster: auto`` through the API: placement reads the real admission state of each cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import ClusterSettings, Settings
from tests.integration.helpers import auth, tiny_spec
from workers.launch import launch_attempt
from workers.reconcile import reconcile


@pytest.fixture
def two_clusters(settings: Settings, tmp_path: Path) -> Settings:
    """Two CPU clusters alike but for a cap of 2 GPUs on the first."""
    profiles = tmp_path / "clusters.yaml"
    cpu = {"kind": "local", "gpus_per_node": 2, "cpu_memory_gib": 16}
    profiles.write_text(yaml.safe_dump({"clusters": [
        {"name": "cpu-a", "max_gpus": 2, **cpu}, {"name": "cpu-b", **cpu},
    ]}))  # fmt: skip
    return settings.model_copy(update={"clusters": ClusterSettings(profiles_file=profiles)})


def auto(name: str, **resources: Any) -> dict[str, Any]:
    spec = tiny_spec(name)
    limited = {"cluster": "auto", "clusters": ["cpu-a", "cpu-b"], **resources}
    return {**spec, "resources": {**spec["resources"], **limited}}


def test_an_auto_job_goes_where_it_starts_now(
    two_clusters: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(two_clusters)) as client:
        alice = auth(tokens["alice"])
        first = client.post("/v1/jobs", json=auto("first"), headers=alice).json()
        second = client.post("/v1/jobs", json=auto("second"), headers=alice).json()
        only_b = client.post("/v1/jobs", json=auto("only", clusters=["cpu-a"]), headers=alice)
        nowhere = client.post("/v1/jobs", json=auto("big", nodes=4), headers=alice)

    assert (first["cluster"], first["status"]) == ("cpu-a", "QUEUED")  # a tie: the first profile
    assert first["advice_reason"].startswith("placed on cpu-a (ZeRO-0")
    assert first["spec"]["resources"]["cluster"] == "auto"  # stored as submitted
    assert (second["cluster"], second["status"]) == ("cpu-b", "QUEUED")  # cpu-a's cap is full
    assert "cpu-a: ZeRO-0" in second["advice_reason"]
    assert "waits: cluster cpu-a has 2 of its 2 GPUs admitted" in second["advice_reason"]
    assert only_b.json()["cluster"] == "cpu-a" and only_b.json()["status"] == "PENDING"
    assert nowhere.status_code == 422
    assert (
        "no cluster can run this job (cpu-a: the job needs 8 GPUs and zeropilot admits at most 2"
        " on cpu-a; cpu-b: offers at most 1 nodes, the job asks for 4)" in nowhere.text
    )
    assert "local" not in nowhere.text  # outside the job's own list


def test_advice_for_an_auto_job_names_the_cluster_and_the_others(
    two_clusters: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(two_clusters)) as client:
        answer = client.post("/v1/advice", json=auto("ask"), headers=auth(tokens["alice"]))

    assert answer.status_code == 200, answer.text
    assert answer.json()["reason"].startswith("placed on cpu-a (ZeRO-0")
    assert "; cpu-b: ZeRO-0" in answer.json()["reason"]


@pytest.fixture
def fast_and_slow(settings: Settings, tmp_path: Path) -> Settings:
    """An H100 cluster of 2 GPUs and an A100 one: the same tiny job runs faster on the first."""
    profiles = tmp_path / "clusters.yaml"
    gpu = {"kind": "slurm", "gpus_per_node": 2, "max_gpus": 2, "cpu_memory_gib": 64}
    profiles.write_text(yaml.safe_dump({"clusters": [
        {"name": "fast", "accelerator": "nvidia-h100-80gb", "gpu_memory_gib": 80, **gpu},
        {"name": "slow", "accelerator": "nvidia-a100-40gb", "gpu_memory_gib": 40, **gpu},
    ]}))  # fmt: skip
    return settings.model_copy(update={"clusters": ClusterSettings(profiles_file=profiles)})


def sized(name: str, steps: int, cluster: str = "auto") -> dict[str, Any]:
    # ~400M parameters: the GPUs' speed, not the per-step overhead, sets the pace
    model = {"hidden_size": 2048, "num_layers": 8, "num_heads": 16, "vocab_size": 32000}
    spec = {**tiny_spec(name), "model": model}
    resources = {**spec["resources"], "cluster": cluster, "clusters": ["fast", "slow"]}
    if cluster != "auto":
        resources.pop("clusters")
    training = {
        **spec["training"],
        "sequence_length": 2048,
        "global_batch_size": 16,
        "steps": steps,
    }
    return {**spec, "training": training, "resources": resources}


@pytest.mark.parametrize(
    ("holder_steps", "placed", "status"),
    [(1, "fast", "PENDING"), (10_000_000, "slow", "QUEUED")],
)
def test_an_auto_job_of_known_length_goes_where_it_would_end_first(
    fast_and_slow: Settings, tokens: dict[str, str], holder_steps: int, placed: str, status: str
) -> None:
    with TestClient(create_app(fast_and_slow)) as client:
        alice = auth(tokens["alice"])
        holder = client.post("/v1/jobs", json=sized("holder", holder_steps, "fast"), headers=alice)
        assert holder.json()["status"] == "QUEUED"  # it holds the fast cluster's 2 GPUs
        job = client.post("/v1/jobs", json=sized("long", 10_000), headers=alice).json()

    assert (job["cluster"], job["status"]) == (placed, status), job["advice_reason"]
    reason = job["advice_reason"]
    assert "fast: ZeRO-" in reason or "placed on fast (ZeRO-" in reason
    assert (
        "waits: cluster fast has 2 of its 2 GPUs admitted; this job needs 2 (expected to" in reason
    )
    assert "ends in" in reason


@pytest.fixture
def one_broken(settings: Settings, tmp_path: Path) -> Settings:
    """A GPU cluster whose launches always fail (its slurm.conf is empty) and a CPU one."""
    broken = tmp_path / "slurm.conf"
    broken.write_text("")  # sbatch: "ClusterName needs to be specified", at once
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": [
        {"name": "gpu-a", "kind": "slurm", "accelerator": "nvidia-h100-80gb", "gpu_memory_gib": 80,
         "gpus_per_node": 2, "slurm_conf": str(broken)},
        {"name": "cpu-b", "kind": "local", "gpus_per_node": 2, "cpu_memory_gib": 16},
    ]}))  # fmt: skip
    workers = settings.workers.model_copy(update={"launch_max_tries": 1})
    return settings.model_copy(
        update={"clusters": ClusterSettings(profiles_file=profiles), "workers": workers}
    )


def bigger(name: str, clusters: tuple[str, ...] = ("gpu-a", "cpu-b")) -> dict[str, Any]:
    """~400M parameters: far faster on the H100 than on the CPU, so placement picks gpu-a."""
    spec = auto(name, clusters=list(clusters))
    return {**spec, "model": {"hidden_size": 2048, "num_layers": 8, "num_heads": 16,
                              "vocab_size": 32000}}  # fmt: skip


def test_a_failed_launch_re_places_the_job_on_the_next_cluster(
    one_broken: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(one_broken)) as client:
        alice = auth(tokens["alice"])
        job = client.post("/v1/jobs", json=bigger("moved"), headers=alice).json()
        assert job["cluster"] == "gpu-a", job["advice_reason"]

        launch_attempt(one_broken, job["attempts"][0]["id"])  # sbatch cannot read its config
        moved = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
        reconcile(one_broken)  # the new cluster's admission starts it
        admitted = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()

    first, second = moved["attempts"]
    assert (first["status"], first["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert (moved["status"], moved["cluster"]) == ("PENDING", "cpu-b")
    assert second["rung"] == "re-placed on cpu-b after the launch on gpu-a failed"
    assert second["backend"] == "local"
    assert (
        second["plan"]["ds_config"] != first["plan"]["ds_config"] or second["plan"] != first["plan"]
    )
    reason = next(e["reason"] for e in moved["events"] if e["to_status"] == "PENDING" and
                  "re-placed" in e["reason"])  # fmt: skip
    assert "gpu-a: ruled out, a launch of this job failed there" in reason
    assert (admitted["status"], admitted["current_attempt"]) == ("QUEUED", 2)


def test_a_re_placed_job_within_its_quota_starts_at_once_and_only_its_clusters_are_named(
    one_broken: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(one_broken)) as client:
        quota = client.patch(
            "/v1/teams/vision", json={"gpu_quota": 2}, headers=auth(tokens["root"])
        )
        assert quota.status_code == 200, quota.text
        alice = auth(tokens["alice"])
        job = client.post("/v1/jobs", json=bigger("quota"), headers=alice).json()
        launch_attempt(one_broken, job["attempts"][0]["id"])  # holds vision's 2 GPUs until it moves
        moved = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()

    reason = next(e["reason"] for e in moved["events"] if e["to_status"] == "PENDING" and
                  "re-placed" in e["reason"])  # fmt: skip
    assert "placed on cpu-b (ZeRO-" in reason and ", starts now" in reason, reason
    assert "waits" not in reason  # the 2 GPUs it held on gpu-a were its own
    assert "local:" not in reason  # a cluster outside the job's list is never a choice


def test_with_nowhere_else_to_go_a_failed_launch_fails_the_job_and_says_why(
    one_broken: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(one_broken)) as client:
        alice = auth(tokens["alice"])
        job = client.post("/v1/jobs", json=bigger("stuck", clusters=("gpu-a",)), headers=alice)
        attempt_id = job.json()["attempts"][0]["id"]
        launch_attempt(one_broken, attempt_id)
        failed = client.get(f"/v1/jobs/{job.json()['id']}", headers=alice).json()

    assert (failed["status"], failed["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert (
        "no other cluster can run it (gpu-a: a launch of this job failed there)"
        in (failed["message"])
    )


@pytest.fixture
def broken_and_small(one_broken: Settings, tmp_path: Path) -> Settings:
    """The broken GPU cluster, and the CPU one capped at 1 GPU: a 2-GPU job can never run there."""
    profiles = yaml.safe_load(one_broken.clusters.profiles_file.read_text())  # type: ignore[union-attr]
    profiles["clusters"][1]["max_gpus"] = 1
    capped = tmp_path / "capped.yaml"
    capped.write_text(yaml.safe_dump(profiles))
    return one_broken.model_copy(update={"clusters": ClusterSettings(profiles_file=capped)})


def test_a_failed_launch_never_strands_a_job_where_it_can_never_be_admitted(
    broken_and_small: Settings, tokens: dict[str, str]
) -> None:
    with TestClient(create_app(broken_and_small)) as client:
        alice, bob = auth(tokens["alice"]), auth(tokens["bob"])
        alone = client.post("/v1/jobs", json=bigger("alone", clusters=("cpu-b",)), headers=alice)
        advised = client.post("/v1/advice", json=bigger("ask", ("cpu-b",)), headers=alice)
        job = client.post("/v1/jobs", json=bigger("big"), headers=alice).json()
        assert job["cluster"] == "gpu-a", job["advice_reason"]
        launch_attempt(broken_and_small, job["attempts"][0]["id"])  # sbatch cannot read its config
        failed = client.get(f"/v1/jobs/{job['id']}", headers=alice).json()
        small = {**tiny_spec("small"), "resources": {"cluster": "cpu-b", "gpus_per_node": 1}}
        other_team = client.post("/v1/jobs", json=small, headers=bob).json()

    never = "the job needs 2 GPUs and zeropilot admits at most 1 on cpu-b"
    assert alone.status_code == 422 and never in alone.text
    assert advised.status_code == 422 and never in advised.text  # advice has the same bound
    assert (failed["status"], failed["failure_class"]) == ("FAILED", "LAUNCH_ERROR")
    assert (
        f"no other cluster can run it (gpu-a: a launch of this job failed there; cpu-b: {never})"
        in failed["message"]
    )
    assert (other_team["cluster"], other_team["status"]) == ("cpu-b", "QUEUED")  # nothing ahead


@pytest.fixture
def priced_pair(fast_and_slow: Settings, tmp_path: Path) -> Settings:
    """The fast and slow clusters with prices: the H100s cost 4x the A100s by the hour."""
    profiles = yaml.safe_load(fast_and_slow.clusters.profiles_file.read_text())  # type: ignore[union-attr]
    for profile, price in zip(profiles["clusters"], (4.0, 1.0), strict=True):
        profile["usd_per_gpu_hour"] = price
    priced = tmp_path / "priced.yaml"
    priced.write_text(yaml.safe_dump(profiles))
    return fast_and_slow.model_copy(update={"clusters": ClusterSettings(profiles_file=priced)})


def test_cost_placement_takes_the_cheaper_cluster_where_time_takes_the_faster(
    priced_pair: Settings, tokens: dict[str, str]
) -> None:
    by_cost = sized("cheap", 10_000)
    by_cost["resources"]["placement"] = "cost"
    with TestClient(create_app(priced_pair)) as client:
        alice = auth(tokens["alice"])
        fastest = client.post("/v1/jobs", json=sized("quick", 10_000), headers=alice).json()
        cheapest = client.post("/v1/jobs", json=by_cost, headers=alice).json()
        typo = {**by_cost, "resources": {**by_cost["resources"], "placement": "cheapest"}}
        refused = client.post("/v1/jobs", json=typo, headers=alice)

    assert fastest["cluster"] == "fast", fastest["advice_reason"]
    assert cheapest["cluster"] == "slow", cheapest["advice_reason"]
    assert cheapest["advice_reason"].startswith("placed on slow by cost (ZeRO-")
    # the chosen cluster first, then the others: "costs $1.72" for each
    slow_cost, fast_cost = map(float, re.findall(r"costs \$([\d.]+)", cheapest["advice_reason"]))
    assert slow_cost < fast_cost, cheapest["advice_reason"]  # what the choice rests on
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "resources", "placement"]
