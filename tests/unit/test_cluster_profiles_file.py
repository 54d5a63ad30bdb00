"""The cluster profiles file is parsed once per content, not at every call (each submit asks
twice, and the reconcile pass once per job), and an edit takes effect at the next call."""

from __future__ import annotations

from pathlib import Path

import yaml

from service.settings import ClusterSettings, Settings

PROFILE = {
    "name": "slurm-a",
    "kind": "slurm",
    "accelerator": "nvidia-a100-80gb",
    "gpu_memory_gib": 80,
    "gpus_per_node": 8,
    "cpu_memory_gib": 1000,
    "max_nodes": 4,
}


def write(path: Path, **changes: object) -> None:
    path.write_text(yaml.safe_dump({"clusters": [{**PROFILE, **changes}]}))


def test_an_unchanged_file_is_parsed_once_and_an_edit_is_seen_at_once(tmp_path: Path) -> None:
    path = tmp_path / "clusters.yaml"
    write(path)
    settings = Settings(data_dir=tmp_path, clusters=ClusterSettings(profiles_file=path))
    first = settings.cluster_profiles()
    assert set(first) == {"local", "slurm-a"} and first["slurm-a"].max_nodes == 4
    assert settings.cluster_profiles()["slurm-a"] is first["slurm-a"]  # not parsed again
    write(path, max_nodes=16)
    assert settings.cluster_profiles()["slurm-a"].max_nodes == 16
