"""Opening a file a job can write to without following its links out of the service's folder.

Training code may replace its own log with a symbolic link (or a FIFO, or a hard link to a file
of the service's) and wait for the API or a worker to read it on its behalf. So a read walks
from a root the service trusts one component at a time, each opened with ``O_NOFOLLOW``, and
takes only a regular file with a single name. Resolving the path once at report time is not
enough: a checked path can be swapped for a link afterwards.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO must not block us


class NotContained(Exception):
    """The path leaves its root, or is not a plain file there; the message says which part."""


def parts_below(root: Path, path: Path) -> list[str]:
    """The components of ``path`` under ``root``, read without touching the filesystem."""
    relative = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    parts = relative.split(os.sep)
    if not os.path.isabs(path) or relative == os.curdir or parts[0] == os.pardir:
        raise NotContained(f"{path} is not inside {root}")
    return parts


def open_beneath(root: Path, path: Path) -> BinaryIO:
    """``path`` opened for reading, if no component below ``root`` is a link and it is a regular
    file with one name. FileNotFoundError when it does not exist (yet)."""
    parts = parts_below(root, path)
    handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts[:-1]):
            inner = _open_part(part, _DIRECTORY, handle, root, parts[: index + 1])
            os.close(handle)
            handle = inner
        fd = _open_part(parts[-1], _FILE, handle, root, parts)
    finally:
        os.close(handle)
    return _regular(fd, root.joinpath(*parts))


def _open_part(part: str, flags: int, folder: int, root: Path, walked: list[str]) -> int:
    try:
        return os.open(part, flags, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, folder):
            where = root.joinpath(*walked)
            raise NotContained(f"{where} is a symbolic link; zeropilot does not follow it") from exc
        raise


def _is_link(part: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(part, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _regular(fd: int, path: Path) -> BinaryIO:
    info = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(info.st_mode):
        why = "is not a regular file"
    elif info.st_nlink != 1:  # a hard link to a file outside: the same inode under two names
        why = f"has {info.st_nlink} hard links; zeropilot reads only files with one name"
    if why:
        os.close(fd)
        raise NotContained(f"{path} {why}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")
