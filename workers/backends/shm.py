"""DeepSpeed's CPU all-reduce leaves its shared-memory buffers behind; backends remove them.

On CPU ranks DeepSpeed 0.19.8's shm_comm op creates one
``/dev/shm/deepspeed_allreduce_buffer_<uid>_<master addr>_<master port>_<rank>`` per rank (66 MiB
each, measured) and never unlinks it. A machine that runs many jobs fills its memory with them:
this project's CI machine reached 22 GB of them and the kernel killed the test run. Once a
world's ranks have ended, its buffers are removed by the name DeepSpeed gives them; and a
buffer that no live process maps any more (its world was killed, or ran outside zeropilot) is
an orphan that the local supervisor and the test session sweep away.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHM_DIR = Path("/dev/shm")  # noqa: S108 (where POSIX shared memory lives on Linux)
PREFIX = "deepspeed_allreduce_buffer"
PROC = Path("/proc")
# A rank creates its buffer, then maps it: a younger file may be between the two.
ORPHAN_MIN_AGE_S = 60.0


def remove_deepspeed_buffers(master_addr: str, master_port: str, shm_dir: Path = SHM_DIR) -> int:
    """Unlink this user's buffers of the world at ``master_addr:master_port``; how many."""
    removed = 0
    for path in shm_dir.glob(f"{PREFIX}_{os.getuid()}_{master_addr}_{master_port}_*"):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass  # another node's cleanup on a shared /dev/shm got there first
    return removed


def mapped_paths(proc: Path = PROC) -> set[str]:
    """Every file some live process maps now (from /proc/<pid>/maps; gone processes skipped)."""
    paths: set[str] = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue  # the process ended, or is not ours to read
        for line in text.splitlines():
            fields = line.split(None, 5)  # address, perms, offset, device, inode[, path]
            if len(fields) == 6:
                paths.add(fields[5].strip())
    return paths


def remove_orphaned_buffers(
    shm_dir: Path = SHM_DIR, proc: Path = PROC, min_age_s: float = ORPHAN_MIN_AGE_S
) -> list[str]:
    """Unlink this user's buffers that no live process maps and that are older than
    ``min_age_s``; their names."""
    candidates = list(shm_dir.glob(f"{PREFIX}_{os.getuid()}_*"))
    if not candidates:
        return []
    in_use, now, removed = mapped_paths(proc), time.time(), []
    for path in candidates:
        try:
            if str(path) in in_use or now - path.stat().st_mtime < min_age_s:
                continue
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass  # its own world's cleanup got there first
    return removed


def shell_removal(addr_expr: str, port_expr: str) -> str:
    """The same, as a shell command; the expressions are already-quoted shell words."""
    return f'rm -f -- {SHM_DIR}/{PREFIX}_"$(id -u)"_{addr_expr}_{port_expr}_*'
