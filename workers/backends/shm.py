"""DeepSpeed's CPU all-reduce leaves its shared-memory buffers behind; backends remove them.

On CPU ranks DeepSpeed 0.19.8's shm_comm op creates one
``/dev/shm/deepspeed_allreduce_buffer_<uid>_<master addr>_<master port>_<rank>`` per rank (66 MiB
each, measured) and never unlinks it. A machine that runs many jobs fills its memory with them:
this project's CI machine reached 22 GB of them and the kernel killed the test run. Once a
world's ranks have ended, its buffers are removed by the name DeepSpeed gives them.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")  # noqa: S108 (where POSIX shared memory lives on Linux)
PREFIX = "deepspeed_allreduce_buffer"


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


def shell_removal(addr_expr: str, port_expr: str) -> str:
    """The same, as a shell command; the expressions are already-quoted shell words."""
    return f'rm -f -- {SHM_DIR}/{PREFIX}_"$(id -u)"_{addr_expr}_{port_expr}_*'
