"""The kernel's count of OOM kills in this machine's memory cgroup: evidence for a SIGKILL.

A rank the OOM killer ended looks like any SIGKILLed rank from its exit status. The cgroup
counts its kills (v2 ``memory.events``, v1 ``memory.oom_control``: ``oom_kill N``); a count that
rose while an attempt ran is evidence of memory. The cgroup may be shared with other work on
the machine, so the evidence says "in this cgroup", not "this rank".
"""

from __future__ import annotations

import re
from pathlib import Path

_FILES = (
    Path("/sys/fs/cgroup/memory.events"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.oom_control"),  # cgroup v1
)
_COUNT = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)


def oom_kill_count() -> int | None:
    """The cgroup's OOM kills so far, or None where no cgroup file says."""
    for path in _FILES:
        try:
            found = _COUNT.search(path.read_text())
        except OSError:
            continue
        if found:
            return int(found[1])
    return None


def oom_kill_evidence(before: int | None, after: int | None) -> str:
    """A line the classifier reads as memory evidence when the count rose, else nothing."""
    if before is None or after is None or after <= before:
        return ""
    return f"memory cgroup: oom_kill {after - before} while the attempt ran"
