"""The advisor's HTTP routes and CLI commands, called the way users call them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.api.routes import advice
from service.core.clusters import LOCAL_PROFILE
from service.settings import get_settings
from tests.unit.shapes import LLAMA_7B, h100_node
from zeropilot.cli_advice import advise_command, lint_command

H100 = h100_node()
TINY: dict[str, Any] = {
    "name": "tiny",
    "entrypoint": "examples/train_tiny.py",
    "model": {
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "vocab_size": 128,
        "tied_embeddings": False,
    },
    "training": {"sequence_length": 32, "global_batch_size": 8},
    "resources": {"nodes": 1, "gpus_per_node": 2},
}
LLAMA_PARTS: dict[str, Any] = {
    "model": LLAMA_7B,
    "training": {"sequence_length": 4096, "global_batch_size": 256},
    "resources": {"cluster": "h100", "nodes": 1, "gpus_per_node": 8},
}


@pytest.fixture
def api() -> TestClient:
    app = FastAPI()
    app.include_router(advice.router)
    app.dependency_overrides[advice.cluster_profiles] = lambda: {
        "local": LOCAL_PROFILE,
        "h100": H100,
    }
    return TestClient(app)


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    app.command("advise")(advise_command)
    app.command("lint")(lint_command)
    return app


def test_post_advice_returns_plan_candidates_and_warnings(api: TestClient) -> None:
    response = api.post("/v1/advice", json=TINY)

    assert response.status_code == 200
    body = response.json()
    assert {"plan", "candidates", "warnings"} <= set(body)
    assert body["plan"]["fits"] and body["plan"]["ds_config"]["train_batch_size"] == 8
    assert len(body["candidates"]) > 1
    # every candidate carries the step-time model's prediction; the plan is the fastest that fits
    assert all(c["step_seconds"] > 0 and c["tokens_per_second"] > 0 for c in body["candidates"])
    fitting = [c["tokens_per_second"] for c in body["candidates"] if c["fits"]]
    assert body["plan"]["tokens_per_second"] >= max(fitting) / 1.02


def test_post_advice_accepts_only_the_model_training_resources_parts(api: TestClient) -> None:
    response = api.post("/v1/advice", json=LLAMA_PARTS)

    assert response.status_code == 200
    assert response.json()["plan"]["zero_stage"] in (1, 2)


def test_capacity_policy_from_query_or_body(api: TestClient) -> None:
    by_query = api.post("/v1/advice", params={"policy": "capacity"}, json=LLAMA_PARTS).json()
    by_body = api.post("/v1/advice", json={**LLAMA_PARTS, "policy": "capacity"}).json()

    assert by_query["plan"] == by_body["plan"]
    assert by_query["plan"]["per_gpu_bytes"]["total"] == min(
        c["per_gpu_bytes"]["total"] for c in by_query["candidates"] if c["fits"]
    )


def test_bad_specs_get_422_naming_the_field(api: TestClient) -> None:
    bad_heads = {**TINY, "model": {**TINY["model"], "num_heads": 5}}
    unknown_cluster = {**TINY, "resources": {"cluster": "mars"}}

    first = api.post("/v1/advice", json=bad_heads)
    second = api.post("/v1/advice", json=unknown_cluster)

    assert first.status_code == 422 and "must divide" in json.dumps(first.json())
    assert second.status_code == 422 and "unknown cluster 'mars'" in json.dumps(second.json())


def test_nothing_fits_gets_422_with_the_closest_candidate(api: TestClient) -> None:
    huge = {
        **LLAMA_PARTS,
        "resources": {"cluster": "local", "nodes": 1, "gpus_per_node": 2},
        "training": {"sequence_length": 4096, "global_batch_size": 8},
    }

    response = api.post("/v1/advice", json=huge)

    assert response.status_code == 422
    [detail] = response.json()["detail"]
    assert "over by" in detail["msg"] and detail["over_by_bytes"] > 0
    closest = detail["closest"]
    assert closest["fits"] is False
    assert closest["per_gpu_bytes"]["total"] - detail["over_by_bytes"] == int(16 * 0.9 * 1024**3)


def test_post_lint_with_and_without_a_job(api: TestClient) -> None:
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 3},
    }

    alone = api.post("/v1/advice/lint", json={"ds_config": config}).json()
    with_job = api.post("/v1/advice/lint", json={"ds_config": config, "job": TINY}).json()

    assert not alone["has_errors"]
    assert with_job["has_errors"]  # 4 x 2 x 2 ranks is 16, not 8
    assert any(
        f["key"] == "train_batch_size" and f["severity"] == "error" for f in with_job["findings"]
    )


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_advise_prints_a_table_with_the_plan_marked(cli: typer.Typer, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["advise", str(write(tmp_path / "job.yaml", TINY))], terminal_width=200
    )

    assert result.exit_code == 0, result.output
    assert "plan: ZeRO-0 mb=4x1" in result.output
    # ZeRO-0 ties ZeRO-2 with offload (within 2%): the article's order breaks the tie
    assert "\u2192" in result.output and "ties the fastest plan that fits" in result.output
    assert "tok/s" in result.output and "tokens/s predicted" in result.output


def test_cli_advise_json_and_chart(cli: typer.Typer, tmp_path: Path) -> None:
    spec = write(
        tmp_path / "llama.yaml", {"name": "llama", "entrypoint": "train.py", **LLAMA_PARTS}
    )
    chart = tmp_path / "chart.svg"

    result = CliRunner().invoke(
        cli, ["advise", str(spec), "--gpu-memory-gib", "80", "--json", "--chart", str(chart)]
    )

    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert body["plan"]["zero_stage"] in (1, 2) and body["candidates"]
    svg = chart.read_text()
    # 80 GiB less the measured headroom: 1 GiB + 1% (constants.py), under the old fixed 10%
    assert svg.startswith("<svg") and "budget 78.2 GiB" in svg
    assert svg.count("<g>") == len(body["candidates"])


def test_cli_advise_options_override_the_spec(cli: typer.Typer, tmp_path: Path) -> None:
    spec = write(
        tmp_path / "llama.yaml", {"name": "llama", "entrypoint": "train.py", **LLAMA_PARTS}
    )

    result = CliRunner().invoke(
        cli,
        [
            "advise",
            str(spec),
            "--gpu-memory-gib",
            "80",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--json",
        ],
    )

    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plan"]
    assert plan["micro_batch_size"] * plan["gradient_accumulation_steps"] * 8 == 256


def test_cli_advise_bad_input_exits_2(cli: typer.Typer, tmp_path: Path) -> None:
    bad = write(
        tmp_path / "bad.yaml", {**TINY, "training": {"sequence_length": 0, "global_batch_size": 8}}
    )
    missing = tmp_path / "missing.yaml"
    unknown = write(tmp_path / "unknown.yaml", {"name": "x", "entrypoint": "t.py", **LLAMA_PARTS})

    assert CliRunner().invoke(cli, ["advise", str(bad)]).exit_code == 2
    assert CliRunner().invoke(cli, ["advise", str(missing)]).exit_code == 2
    assert CliRunner().invoke(cli, ["advise", str(unknown)]).exit_code == 2


@pytest.fixture
def profiles_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The server's profiles setting, as the CLI reads it, holding the H100 node."""
    path = tmp_path / "clusters.yaml"
    path.write_text(yaml.safe_dump({"clusters": [H100.model_dump(mode="json")]}))
    monkeypatch.setenv("ZEROPILOT_CLUSTERS__PROFILES_FILE", str(path))
    get_settings.cache_clear()
    yield path
    get_settings.cache_clear()


def test_cli_advise_uses_the_configured_cluster_profile(
    cli: typer.Typer, tmp_path: Path, profiles_file: Path
) -> None:
    spec = write(
        tmp_path / "llama.yaml", {"name": "llama", "entrypoint": "train.py", **LLAMA_PARTS}
    )

    result = CliRunner().invoke(cli, ["advise", str(spec)], terminal_width=200)

    assert result.exit_code == 0, result.output
    usable = H100.gpu_memory_gib * 0.99 - 1  # the measured headroom: 1 GiB + 1%
    assert f"of {usable:.2f} GiB usable per GPU" in result.output


def test_cli_advise_unknown_cluster_names_the_profiles_setting(
    cli: typer.Typer, tmp_path: Path, profiles_file: Path
) -> None:
    spec = write(
        tmp_path / "job.yaml",
        {**TINY, "resources": {"cluster": "a100-pool", "nodes": 1, "gpus_per_node": 2}},
    )

    result = CliRunner().invoke(cli, ["advise", str(spec)])

    assert result.exit_code == 2
    assert "'a100-pool' is not a known cluster profile" in result.output
    assert "ZEROPILOT_CLUSTERS__PROFILES_FILE" in result.output
    assert f"zeropilot advise {spec} --gpu-memory-gib" in result.output  # a command that works


def test_cli_advise_nothing_fits_exits_1_naming_the_overshoot(
    cli: typer.Typer, tmp_path: Path
) -> None:
    spec = write(
        tmp_path / "llama.yaml", {"name": "llama", "entrypoint": "train.py", **LLAMA_PARTS}
    )

    result = CliRunner().invoke(
        cli, ["advise", str(spec), "--gpu-memory-gib", "2", "--gpus-per-node", "1"]
    )

    assert result.exit_code == 1
    assert "over by" in result.output


def test_cli_lint_exit_codes(cli: typer.Typer, tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps(
            {
                "train_batch_size": 8,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 1,
                "bf16": {"enabled": True},
                "optimizer": {"type": "AdamW", "params": {"torch_adam": True}},
            }
        )
    )
    broken = tmp_path / "broken.json"
    broken.write_text(
        json.dumps(
            {
                "train_batch_size": 7,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 1,
            }
        )
    )
    not_json = tmp_path / "bad.json"
    not_json.write_text("{nope")
    job = write(tmp_path / "job.yaml", TINY)
    runner = CliRunner()

    assert runner.invoke(cli, ["lint", str(good), "--job", str(job)]).exit_code == 0
    result = runner.invoke(cli, ["lint", str(broken), "--json"])
    assert result.exit_code == 1
    assert any(f["severity"] == "error" for f in json.loads(result.output))
    assert runner.invoke(cli, ["lint", str(not_json)]).exit_code == 2


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LLAMA_CONFIG: dict[str, Any] = json.loads((EXAMPLES / "llama-7b" / "config.json").read_text())


def test_post_advice_plans_from_an_inline_hf_config(api: TestClient) -> None:
    parts = {**LLAMA_PARTS, "model": {"hf_config": LLAMA_CONFIG}}

    response = api.post("/v1/advice", json=parts)

    assert response.status_code == 200, response.text
    by_shape = api.post("/v1/advice", json={**LLAMA_PARTS, "model": {**LLAMA_7B, "mlp": "gated"}})
    assert response.json()["plan"] == by_shape.json()["plan"]  # the same model, said two ways


def test_post_advice_refuses_a_config_path_naming_the_field(api: TestClient) -> None:
    parts = {**LLAMA_PARTS, "model": {"hf_config": "config.json"}}

    response = api.post("/v1/advice", json=parts)

    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["loc"][-2:] == ["model", "hf_config"]
    assert "send the config.json content inline" in detail["msg"]


def test_cli_advise_reads_the_spec_example_with_its_config_json(cli: typer.Typer) -> None:
    spec = EXAMPLES / "llama-7b-h200.yaml"

    result = CliRunner().invoke(
        cli, ["advise", str(spec), "--gpu-memory-gib", "139.8", "--json"], terminal_width=200
    )

    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plan"]
    assert (plan["zero_stage"], plan["activation_checkpointing"], plan["peak_phase"]) == (
        3, True, "step",
    )  # fmt: skip


def test_cli_advise_hf_config_option_replaces_the_model(cli: typer.Typer, tmp_path: Path) -> None:
    spec = write(tmp_path / "job.yaml", TINY)
    small = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512}
    config = {**LLAMA_CONFIG, **small, "num_attention_heads": 4, "num_key_value_heads": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))

    result = CliRunner().invoke(cli, ["advise", str(spec), "--hf-config", str(path), "--json"])

    assert result.exit_code == 0, result.output
    candidates = json.loads(result.output)["candidates"]
    # embeddings and head, 2 blocks of q/k/v/o, gate/up/down and 2 norms, the final norm
    parameters = 2 * 32000 * 256 + 2 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 256
    zero0 = next(c for c in candidates if c["zero_stage"] == 0)
    assert zero0["per_gpu_bytes"]["params"] == 2 * parameters  # bf16 weights of that model


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "model.hf_config: cannot read"),
        ("{not json", "is not valid JSON"),
        ('{"model_type": "bert"}', "model.hf_config.model_type 'bert' is not a family"),
    ],
)
def test_cli_advise_bad_hf_config_exits_2_naming_the_field(
    cli: typer.Typer, tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "config.json").write_text(content)
    spec = write(tmp_path / "job.yaml", {**TINY, "model": {"hf_config": "config.json"}})

    result = CliRunner().invoke(cli, ["advise", str(spec)], terminal_width=200)

    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_cli_advise_auto_shows_each_clusters_cost_and_places_by_cost(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = H100.model_copy(update={"usd_per_gpu_hour": 4.0})
    cheap = H100.model_copy(update={"name": "a100", "accelerator": "nvidia-a100-80gb",
                                    "usd_per_gpu_hour": 1.0})  # fmt: skip
    unpriced = H100.model_copy(update={"name": "spare"})
    path = tmp_path / "clusters.yaml"
    clusters = [p.model_dump(mode="json") for p in (fast, cheap, unpriced)]
    path.write_text(yaml.safe_dump({"clusters": clusters}))
    monkeypatch.setenv("ZEROPILOT_CLUSTERS__PROFILES_FILE", str(path))
    get_settings.cache_clear()
    resources = {**LLAMA_PARTS["resources"], "cluster": "auto", "placement": "cost"}
    training = {**LLAMA_PARTS["training"], "steps": 1000}
    body = {"name": "llama", "entrypoint": "train.py", **LLAMA_PARTS, "training": training,
            "resources": resources}  # fmt: skip
    try:
        shown = CliRunner().invoke(cli, ["advise", str(write(tmp_path / "a.yaml", body))])
        answer = CliRunner().invoke(cli, ["advise", str(tmp_path / "a.yaml"), "--json"])
    finally:
        get_settings.cache_clear()

    assert shown.exit_code == 0 and answer.exit_code == 0, shown.output + answer.output
    report = json.loads(answer.output)
    rows = {row["cluster"].removeprefix("→ "): row for row in report["clusters"]}
    assert report["chosen"] == "a100"
    assert rows["h100"]["why_not"] == "costs more" and rows["spare"]["why_not"] == "not priced"
    assert rows["spare"]["cost"] == "-" and rows["h100"]["cost"].startswith("$")
    assert "placed on a100 by cost (" in shown.output and "│ cost" in shown.output.replace("┃", "│")
