"""Numbers read from out-of-memory texts: what was tried, what the device had, who held it.

The formats are the allocators' own: PyTorch's CUDA caching allocator (``CUDA out of memory.
Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.02 GiB is free.
Process 4711 has 30.00 GiB memory in use. Including non-PyTorch memory, this process has ...``,
sizes from ``format_size``: B, KiB, MiB, GiB with two decimals), its older form ``(GPU 0; 7.93
GiB total capacity; ... free; ...)``, and the CPU allocator's ``you tried to allocate N bytes``.
Pure: stdlib only.
"""

from __future__ import annotations

import re

_UNITS = {"B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4}
_SIZE = r"([\d.]+) ?([KMGT]?i?B)"

_CUDA_TRIED = re.compile(r"out of memory\. Tried to allocate " + _SIZE, re.IGNORECASE)
_CUDA_CAPACITY = re.compile(
    r"has a total capac(?:i)?ty of " + _SIZE + r"(?: of which " + _SIZE + r" is free)?"
)
_CUDA_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_CUDA_THIS = re.compile(r"this process has " + _SIZE + r" memory in use")
_CUDA_ALLOWED = re.compile(_SIZE + r" allowed;")
_CUDA_OLD = re.compile(r"\(GPU \d+; " + _SIZE + r" total capacity;.*?" + _SIZE + r" free;")
_HOST_TRIED = re.compile(r"you tried to allocate (\d+) bytes")


def size_bytes(number: str, unit: str) -> int:
    """``format_size``'s text back to bytes (its two decimals make it exact to 1/200 of a unit)."""
    return int(float(number) * _UNITS[unit.upper()])


def cuda_oom_numbers(line: str) -> dict[str, int]:
    """Bytes tried, capacity, free, held by this process and by other processes."""
    numbers: dict[str, int] = {}
    if tried := _CUDA_TRIED.search(line):
        numbers["tried_bytes"] = size_bytes(*tried.groups())
    if capacity := _CUDA_CAPACITY.search(line):
        numbers["capacity_bytes"] = size_bytes(capacity[1], capacity[2])
        if capacity[3]:
            numbers["free_bytes"] = size_bytes(capacity[3], capacity[4])
    elif old := _CUDA_OLD.search(line):
        numbers["capacity_bytes"] = size_bytes(old[1], old[2])
        numbers["free_bytes"] = size_bytes(old[3], old[4])
    others = _CUDA_OTHER.findall(line)
    if others:
        numbers["other_processes_bytes"] = sum(size_bytes(n, u) for _pid, n, u in others)
        numbers["other_processes"] = len(others)
    if this := _CUDA_THIS.search(line):
        numbers["process_bytes"] = size_bytes(*this.groups())
    if allowed := _CUDA_ALLOWED.search(line):
        numbers["allowed_bytes"] = size_bytes(*allowed.groups())
    return numbers


def host_oom_numbers(line: str) -> dict[str, int]:
    tried = _HOST_TRIED.search(line)
    return {"tried_bytes": int(tried[1])} if tried else {}


def missing_bytes(numbers: dict[str, int]) -> int | None:
    """Bytes the failed allocation lacked, where the numbers say.

    A device: tried minus free (at least the allocation itself when fragmentation, not capacity,
    refused it). A process under a limit: in use plus tried minus the limit.
    """
    tried = numbers.get("tried_bytes")
    if tried is None:
        return None
    if "limit_bytes" in numbers and "in_use_bytes" in numbers:
        return max(numbers["in_use_bytes"] + tried - numbers["limit_bytes"], 0) or tried
    if "free_bytes" in numbers:
        return max(tried - numbers["free_bytes"], 0) or tried
    return None
