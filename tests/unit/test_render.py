"""Renderers: hostfile, launcher command, write-once files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.db.jobs import backend_name
from workers.render import launcher_argv, render_hostfile, write_json_once


def test_hostfile_lists_nodes_in_rank_order() -> None:
    assert render_hostfile(["node-0", "node-1"], 8) == "node-0 slots=8\nnode-1 slots=8\n"
    with pytest.raises(ValueError, match="slots must be at least 1"):
        render_hostfile(["a"], 0)


def test_launcher_is_ssh_less_and_keeps_arguments_literal() -> None:
    argv = launcher_argv(
        python="/usr/bin/python3",
        hostfile="/a/hostfile",
        node_rank="1",
        master_addr="10.0.0.1",
        master_port="29500",
        entrypoint="train.py",
        args=["--name", "x; rm -rf / $(id) `id`"],
        ds_config="/a/ds_config.json",
    )
    assert argv[:4] == ["/usr/bin/python3", "-m", "deepspeed.launcher.runner", "--no_ssh"]
    assert argv[argv.index("--node_rank") + 1] == "1"
    assert argv[argv.index("--master_addr") + 1] == "10.0.0.1"
    assert "x; rm -rf / $(id) `id`" in argv  # one element, never split or interpreted
    assert argv[-2:] == ["--deepspeed_config", "/a/ds_config.json"]


def test_write_json_once_keeps_the_first_version(tmp_path: Path) -> None:
    target = tmp_path / "launch.json"
    assert write_json_once(target, {"port": 1}) == {"port": 1}
    assert write_json_once(target, {"port": 2}) == {"port": 1}
    assert json.loads(target.read_text()) == {"port": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["launch.json"]


def test_backend_names_are_deterministic_dns_labels() -> None:
    name = backend_name("a-very-long-job-name-that-goes-on", "0123456789abcdef", 12)
    assert name == backend_name("a-very-long-job-name-that-goes-on", "0123456789abcdef", 12)
    assert name == "zp-a-very-long-job-name-01234567-a12"
    assert len(name) <= 63
    assert (
        backend_name("abcdefghijklmnopqrs-tuv", "0123456789abcdef", 1)
        == "zp-abcdefghijklmnopqrs-01234567-a1"
    )
