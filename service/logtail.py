"""Reading the end of a log file, or what was appended since a byte offset, without loading it.

Logs live in attempt folders the job itself can write to, so each read opens the file through
``open_beneath`` from the folder the service made (``NotContained`` when it is a link or not a
plain file); a log that does not exist yet reads as empty.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from service.contained_files import open_beneath

_CHUNK = 64 * 1024


def tail_lines(root: Path, path: Path, lines: int, max_bytes: int = 1024 * 1024) -> str:
    """The last ``lines`` lines of ``path`` (reading at most ``max_bytes`` from its end)."""
    handle = _open(root, path)
    if handle is None:
        return ""
    with handle:
        size = handle.seek(0, os.SEEK_END)
        data = b""
        while size > 0 and data.count(b"\n") <= lines and len(data) < max_bytes:
            step = min(_CHUNK, size)
            size -= step
            handle.seek(size)
            data = handle.read(step) + data
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) + ("\n" if text.endswith("\n") else "")


def read_from(root: Path, path: Path, offset: int, max_bytes: int = 256 * 1024) -> tuple[str, int]:
    """Text appended since byte ``offset`` (whole lines only) and the offset to ask for next."""
    handle = _open(root, path)
    if handle is None:
        return "", offset
    with handle:
        handle.seek(offset)
        data = handle.read(max_bytes)
    if not data.endswith(b"\n") and b"\n" in data:  # keep a half-written line for the next read
        data = data[: data.rindex(b"\n") + 1]
    elif b"\n" not in data:
        data = b""
    return data.decode("utf-8", errors="replace"), offset + len(data)


def log_size(root: Path, path: Path) -> int:
    """Bytes in the log so far (0 before it exists): where a follower starts."""
    handle = _open(root, path)
    if handle is None:
        return 0
    with handle:
        return os.fstat(handle.fileno()).st_size


def _open(root: Path, path: Path) -> BinaryIO | None:
    try:
        return open_beneath(root, path)
    except FileNotFoundError:
        return None
