"""Deployment files: the compose file validates with docker-compose, and what it runs exists."""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path

import yaml

from service.settings import ClusterSettings, Settings
from tests.integration.helpers import REPO


def compose_config(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_compose_file_is_valid_and_demands_a_secret_key() -> None:
    result = compose_config(ZEROPILOT_SECRET_KEY="test")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    assert set(services) == {"postgres", "redis", "migrate", "api", "worker", "scheduler"}
    assert services["worker"]["environment"]["ZEROPILOT_BROKER__URL"] == "redis://redis:6379/0"
    missing = compose_config(ZEROPILOT_SECRET_KEY="")
    assert missing.returncode != 0 and "ZEROPILOT_SECRET_KEY" in missing.stderr


def test_compose_commands_name_real_entry_points() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    factory = services["api"]["command"][2]
    module, _, attribute = factory.partition(":")
    assert callable(getattr(importlib.import_module(module), attribute))
    for name in ("worker", "scheduler"):
        command = services[name]["command"]
        assert command[:3] == ["celery", "-A", "workers.celery_app"]
    importlib.import_module("workers.celery_app")


def test_example_cluster_profiles_load(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        clusters=ClusterSettings(profiles_file=REPO / "deploy" / "clusters.example.yaml"),
    )
    profiles = settings.cluster_profiles()
    assert {"local", "slurm-a100"} <= set(profiles)
    assert profiles["slurm-a100"].gpu_memory_gib == 80
