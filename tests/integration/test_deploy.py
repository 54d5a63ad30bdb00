"""Deployment files: compose and Kubernetes manifests validate, and what they run exists.

No Kubernetes API server can run on our build machines: the manifests are checked against the
official OpenAPI schemas (kubernetes-validate, strict) instead of being applied.
"""

from __future__ import annotations

import importlib
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
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
    api = services["api"]["command"]
    assert api[:3] == ["python", "-m", "service.api.serve"]  # uvicorn with the head limits
    assert callable(importlib.import_module(api[2]).main)
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


def kubernetes_documents() -> list[dict[str, Any]]:
    text = (REPO / "deploy" / "kubernetes" / "zeropilot.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("version", ["1.29.0", "1.37.0"])
def test_kubernetes_manifests_pass_the_official_schemas(version: str) -> None:
    for document in kubernetes_documents():
        kubernetes_validate.validate(document, version, strict=True)  # raises on any error


def test_kubernetes_worker_alone_may_launch_training_objects() -> None:
    documents = kubernetes_documents()
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for document in documents:
        by_kind.setdefault(document["kind"], []).append(document)
    binding = by_kind["RoleBinding"][0]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "zeropilot-worker", "namespace": "zeropilot"}
    ]
    accounts = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"].get("serviceAccountName")
        for d in by_kind["Deployment"]
    }
    assert accounts == {
        "zeropilot-api": None,
        "zeropilot-worker": "zeropilot-worker",
        "zeropilot-scheduler": None,
    }
    rules = by_kind["Role"][0]["rules"]
    assert {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["create", "get", "list", "watch", "delete", "patch"],
    } in rules
    api = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == "zeropilot-api")
    container = api["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
