"""Reading the end of a log file, or what was appended since a byte offset, without loading it."""

from __future__ import annotations

import os
from pathlib import Path

_CHUNK = 64 * 1024


def tail_lines(path: Path, lines: int, max_bytes: int = 1024 * 1024) -> str:
    """The last ``lines`` lines of ``path`` (reading at most ``max_bytes`` from its end)."""
    if not path.is_file():
        return ""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        data = b""
        while size > 0 and data.count(b"\n") <= lines and len(data) < max_bytes:
            step = min(_CHUNK, size)
            size -= step
            handle.seek(size)
            data = handle.read(step) + data
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) + ("\n" if text.endswith("\n") else "")


def read_from(path: Path, offset: int, max_bytes: int = 256 * 1024) -> tuple[str, int]:
    """Text appended since byte ``offset`` (whole lines only) and the offset to ask for next."""
    if not path.is_file():
        return "", offset
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read(max_bytes)
    if not data.endswith(b"\n") and b"\n" in data:  # keep a half-written line for the next read
        data = data[: data.rindex(b"\n") + 1]
    elif b"\n" not in data:
        data = b""
    return data.decode("utf-8", errors="replace"), offset + len(data)
