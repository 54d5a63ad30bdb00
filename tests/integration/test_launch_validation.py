"""Values no backend can launch are refused at submit, the same way on local, Slurm and
Kubernetes cluster profiles: 422 naming the field, and nothing stored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from service.api.app import create_app
from service.db.migrate import upgrade
from service.db.models import Attempt, Job
from service.db.session import get_engine
from service.settings import (
    AuthSettings,
    BrokerSettings,
    ClusterSettings,
    DatabaseSettings,
    Settings,
)
from tests.integration.helpers import auth, three_users, tiny_spec

PROFILES = [
    {"name": "slurm-a", "kind": "slurm", "gpus_per_node": 2, "max_nodes": 2},
    {"name": "k8s-a", "kind": "kubernetes", "gpus_per_node": 2, "max_nodes": 2},
]
CLUSTERS = ["local", "slurm-a", "k8s-a"]
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
DEEP = "/" + "/".join(["d" * 200] * 21)  # 4,221 bytes, each part within NAME_MAX

# (what is wrong, the spec's changes, the field the refusal names, words of its message)
BAD = [
    ("NUL in env value", {"env": {"DEBUG": "a\x00b"}}, ["env", "DEBUG"], "NUL bytes"),
    ("escape in env value", {"env": {"DEBUG": "\x1b[2J"}}, ["env", "DEBUG"], "control char"),
    ("33 KiB env value", {"env": {"BLOB": "x" * 33_000}}, ["env", "BLOB"], "32,768 bytes"),
    (
        "270 KB of env",
        {"env": {f"PART{i}": "x" * 30_000 for i in range(9)}},
        ["env"],
        "262,144 bytes",
    ),
    ("env name with a dash", {"env": {"MY-FLAG": "1"}}, ["env", "MY-FLAG"], "pattern"),
    ("reserved env name", {"env": {"ZEROPILOT_URL": "x"}}, ["env", "ZEROPILOT_URL"], "reserved"),
    ("NUL in an argument", {"args": ["--steps", "1\x00"]}, ["args", 1], "NUL bytes"),
    ("270 KB of arguments", {"args": ["x" * 30_000] * 9}, ["args"], "262,144 bytes"),
    ("2,000 arguments", {"args": ["1"] * 2_000}, ["args"], "at most 1024"),
    ("newline in entrypoint", {"entrypoint": "train\n.py"}, ["entrypoint"], "control char"),
    ("NUL in working_dir", {"working_dir": "/tmp/a\x00b"}, ["working_dir"], "NUL bytes"),
    ("256-byte path part", {"working_dir": "/tmp/" + "d" * 256}, ["working_dir"], "at most 255"),
    ("4 KiB path", {"working_dir": DEEP}, ["working_dir"], "at most 4,096"),
    ("blank in image", {"image": "nvcr.io/nvidia/pytorch:24.05 py3"}, ["image"], "image reference"),
    ("uppercase image name", {"image": "ghcr.io/Org/trainer"}, ["image"], "image reference"),
]  # fmt: skip


@pytest.fixture
def api(tmp_path: Path, postgres_url: str, redis_url: str) -> Iterator[Api]:
    upgrade(postgres_url)
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(yaml.safe_dump({"clusters": PROFILES}))
    settings = Settings(
        data_dir=tmp_path / "data",
        db=DatabaseSettings(url=postgres_url),
        broker=BrokerSettings(url=redis_url),
        auth=AuthSettings(secret_key="test-secret-key"),
        clusters=ClusterSettings(profiles_file=profiles),
    )
    headers = auth(three_users(postgres_url)["alice"])
    with TestClient(create_app(settings)) as client:
        yield Api(client, postgres_url, headers)
    get_engine(postgres_url).dispose()


@dataclass
class Api:
    client: TestClient
    database_url: str
    headers: dict[str, str]

    def submit(self, spec: dict[str, Any]) -> tuple[int, Any]:
        response = self.client.post("/v1/jobs", json=spec, headers=self.headers)
        return response.status_code, response.json()

    def stored(self) -> tuple[int, int]:
        """Jobs and attempts in the database."""
        with Session(get_engine(self.database_url)) as session:
            jobs = session.exec(select(func.count()).select_from(Job)).one()
            return jobs, session.exec(select(func.count()).select_from(Attempt)).one()


def spec_for(cluster: str, **changes: Any) -> dict[str, Any]:
    spec = tiny_spec(**{"image": IMAGE, **changes})
    spec["resources"] = {**spec["resources"], "cluster": cluster}
    return spec


@pytest.mark.parametrize(("_why", "changes", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_refused_alike_on_every_backend_and_nothing_is_stored(
    api: Api, _why: str, changes: dict[str, Any], field: list[Any], words: str
) -> None:
    answers = {cluster: api.submit(spec_for(cluster, **changes)) for cluster in CLUSTERS}

    status, body = answers["local"]
    detail = body["detail"]
    assert status == 422
    assert answers["slurm-a"] == answers["k8s-a"] == answers["local"]  # the same refusal
    locations = [error["loc"][1 : 1 + len(field)] for error in detail]
    assert field in locations, detail
    assert any(words in error["msg"] for error in detail), detail
    assert api.stored() == (0, 0)


def test_the_same_spec_without_the_bad_value_is_accepted_on_every_backend(api: Api) -> None:
    statuses = [api.submit(spec_for(cluster))[0] for cluster in CLUSTERS]

    assert statuses == [201, 201, 201]
    assert api.stored() == (3, 3)


def test_a_kubernetes_cluster_refuses_a_job_without_an_image_at_submit(api: Api) -> None:
    spec = spec_for("k8s-a")
    del spec["image"]

    status, body = api.submit(spec)

    assert status == 422
    assert body["detail"][0]["loc"] == ["body", "image"]
    assert "cluster 'k8s-a' runs each node in a container" in body["detail"][0]["msg"]
    assert api.stored() == (0, 0)
