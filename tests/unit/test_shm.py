"""Removing DeepSpeed's leftover CPU all-reduce buffers by the names DeepSpeed gives them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from workers.backends.shm import PREFIX, remove_deepspeed_buffers, shell_removal


def buffers(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).write_bytes(b"x")


def test_only_the_ended_worlds_buffers_go(tmp_path: Path) -> None:
    uid = os.getuid()
    mine = [f"{PREFIX}_{uid}_127.0.0.1_29511_0", f"{PREFIX}_{uid}_127.0.0.1_29511_1"]
    others = [
        f"{PREFIX}_{uid}_127.0.0.1_29512_0",  # another world, maybe still running
        f"{PREFIX}_{uid}_10.0.0.1_29511_0",  # another master
        f"{PREFIX}_{uid + 1}_127.0.0.1_29511_0",  # another user
        "PostgreSQL.1234",
    ]
    buffers(tmp_path, *mine, *others)

    assert remove_deepspeed_buffers("127.0.0.1", "29511", tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


def test_the_node_scripts_command_removes_the_same(tmp_path: Path) -> None:
    uid = os.getuid()
    buffers(tmp_path, f"{PREFIX}_{uid}_10.0.0.1_29511_0", f"{PREFIX}_{uid}_10.0.0.1_29512_0")
    command = shell_removal('"$ADDR"', '"$PORT"').replace("/dev/shm", str(tmp_path))

    subprocess.run(["bash", "-c", command], env={"ADDR": "10.0.0.1", "PORT": "29511"}, check=True)

    assert [p.name for p in tmp_path.iterdir()] == [f"{PREFIX}_{uid}_10.0.0.1_29512_0"]
