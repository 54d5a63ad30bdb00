"""``zeropilot advise --explain`` as a user reads it: with the server's calibration of the
cluster (five finished runs fitted by the real API and learning task, served to the CLI as
recorded), offline, and where the server does not know the cluster."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.db import calibrations
from service.settings import Settings
from tests.integration.helpers import auth
from tests.integration.observed_runs import SHAPES, finished, shaped_spec, submitted
from tests.unit.scripted_api import ScriptedApi
from workers.learning import learn
from zeropilot.cli import app


@pytest.fixture(autouse=True)
def fresh_copies() -> None:
    calibrations.forget()  # another test's cluster of the same name must not be remembered


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(shaped_spec("explained", 96, 64)))
    return path


def explain(url: str, spec_file: Path, monkeypatch: pytest.MonkeyPatch, *more: str) -> Any:
    monkeypatch.setenv("ZEROPILOT_URL", url)
    monkeypatch.setenv("ZEROPILOT_TOKEN", "zp_t")
    return CliRunner().invoke(
        app, ["advise", str(spec_file), "--explain", *more], terminal_width=200
    )


def test_explain_prints_the_calibrated_plan_its_error_and_why_the_others_lost(
    client: TestClient,
    settings: Settings,
    tokens: dict[str, str],
    spec_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = [submitted(client, tokens["alice"], shape) for shape in SHAPES[:5]]
    for job, shape in zip(jobs, SHAPES, strict=False):
        finished(client, settings, job, shape)
    learn(settings)
    calibration = client.get("/v1/clusters/local/calibration", headers=auth(tokens["bob"]))
    shown = calibration.json()
    error = f"{shown['typical_error']:.0%}"
    api = ScriptedApi([(200, {}, shown)])
    try:
        text = explain(api.url, spec_file, monkeypatch)
        as_json = explain(api.url, spec_file, monkeypatch, "--json")
    finally:
        api.server.shutdown()

    assert text.exit_code == 0, text.output
    out = text.output
    assert out.startswith(
        f"cluster local: calibrated on 5 runs, typical step-time error {error}; "
    ), out
    assert f"(from the server at {api.url})" in out
    block = shown["multipliers"]["host_seconds_per_block_pass"]
    assert re.search(rf"│ host_seconds_per_block_pass +│ 0\.00187 +│ {block:.3g} +│", out), out
    parsed = json.loads(as_json.output)
    plan = parsed["options"][0]
    assert plan["outcome"] == "chosen" and plan["option"] == parsed["plan"]
    assert f"→ {plan['option']}" in out
    assert f"{plan['step_seconds'] * 1000:.1f} ms ±{error}" in out
    assert f"step time ± the calibration's typical error ({error})" in out
    assert parsed["reason"].endswith(
        f"calibrated on 5 runs of this cluster, typical error {error}."
    )
    assert parsed["calibration"] | {"constants": None} == {
        "from_server": True, "calibrated": True, "says": out.splitlines()[0],
        "runs": 5, "typical_error": shown["typical_error"], "constants": None,
        "memory": shown["memory_reason"],
    }  # fmt: skip
    others = parsed["options"][1:]
    assert others and {o["outcome"] for o in others} <= {"does not fit", "slower", "tie"}
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if "│   ZeRO-" in line}
    for o in others:  # each one's row, with the first words of why it lost
        assert o["why"].split(":")[0] in {"does not fit", "slower", "ties within 2%"}
        assert o["why"][:40] in rows[o["option"]]


def test_offline_it_plans_with_the_advisors_own_constants_and_says_so(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    text = explain(closed, spec_file, monkeypatch)
    as_json = json.loads(explain(closed, spec_file, monkeypatch, "--json").output)

    assert text.exit_code == 0, text.output
    first = text.output.splitlines()[0]
    assert first.startswith(f"offline (no zeropilot server at {closed}: ")
    assert first.endswith("the advisor's own constants, not calibrated on cluster local")
    assert "Step-time constants (not calibrated)" in text.output
    assert "its error on this cluster not measured" in text.output
    assert as_json["reason"].endswith("from the advisor's constants (not calibrated here yet).")
    assert as_json["calibration"]["from_server"] is False
    assert as_json["calibration"]["typical_error"] is None
    assert {c["multiplier"] for c in as_json["calibration"]["constants"]} == {1.0}


def test_a_server_without_the_cluster_leaves_the_advisors_constants(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = ScriptedApi([(404, {}, {"detail": "no cluster 'local'"})])
    try:
        text = explain(api.url, spec_file, monkeypatch)
    finally:
        api.server.shutdown()
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[0] == (
        f"the server at {api.url} answered 404 no cluster 'local': the advisor's own "
        "constants, not calibrated on cluster local"
    )
