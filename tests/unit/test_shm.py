"""Removing DeepSpeed's leftover CPU all-reduce buffers by the names DeepSpeed gives them."""

from __future__ import annotations

import mmap
import os
import subprocess
from pathlib import Path

from workers.backends.shm import (
    PREFIX,
    remove_deepspeed_buffers,
    remove_orphaned_buffers,
    shell_removal,
)


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


def test_only_buffers_that_no_live_process_maps_are_orphans(tmp_path: Path) -> None:
    uid = os.getuid()
    shm = tmp_path / "shm"
    shm.mkdir()
    buffers(shm, *(f"{PREFIX}_{uid}_127.0.0.1_{port}_0" for port in (1, 2, 3)))
    young = shm / f"{PREFIX}_{uid}_127.0.0.1_3_0"
    for path in shm.iterdir():
        if path != young:
            os.utime(path, (0, 0))  # old enough to judge
    with (shm / f"{PREFIX}_{uid}_127.0.0.1_2_0").open("r+b") as held:
        mapping = mmap.mmap(held.fileno(), 1)  # a live world's buffer: this process maps it

        removed = remove_orphaned_buffers(shm)

        mapping.close()
    assert removed == [f"{PREFIX}_{uid}_127.0.0.1_1_0"]
    assert sorted(p.name for p in shm.iterdir()) == [
        f"{PREFIX}_{uid}_127.0.0.1_2_0",
        young.name,  # may be between its creation and its mapping
    ]
