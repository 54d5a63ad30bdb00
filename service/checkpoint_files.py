"""Reading and deleting a job's checkpoint folders without following a link out of them.

A training job can replace a checkpoint (or a folder above it) with a symbolic link to files
that are not its own, then wait for retention to delete "its" checkpoint. So every walk starts
from the fence's trusted root and opens each component below it with ``O_NOFOLLOW``; sizes come
from ``os.fwalk`` without following links, and deletion is ``shutil.rmtree`` on a folder file
descriptor (its link-safe variant): a link inside is removed, never what it points to.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from service.checkpoint_paths import Fence
from service.contained_files import NotContained, open_beneath, parts_below
from service.core.retention import (
    DEEPSPEED_LATEST,
    TRAINER_STATE,
    is_trainer_checkpoint,
    missing_deepspeed_files,
)

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_TAG_CHARS = 256  # a `latest` file names one folder


@dataclass(frozen=True)
class Found:
    complete: bool
    size_bytes: int
    why: str  # what is missing, or "" when complete


def _below(fence: Fence, path: str) -> tuple[Path, list[str]]:
    """The resolved trusted root and the path's components below it, as written."""
    root = Path(os.path.realpath(fence.root))
    for base in (Path(fence.root), root):
        try:
            return root, parts_below(base, Path(path))
        except NotContained:
            continue
    raise NotContained(f"{path} is not inside {fence.folder}")


@contextmanager
def opened_folder(fence: Fence, path: str, parent: bool = False) -> Iterator[int]:
    """A folder descriptor for ``path`` (or its parent), every component opened no-follow."""
    root, parts = _below(fence, path)
    if not _inside_fence(fence, root, parts):
        raise NotContained(f"{path} is not inside the job's checkpoint folder {fence.folder}")
    walk = parts[:-1] if parent else parts
    handle = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(walk):
            inner = _open_dir(part, handle, root.joinpath(*walk[: index + 1]))
            os.close(handle)
            handle = inner
        yield handle
    finally:
        os.close(handle)


def _inside_fence(fence: Fence, root: Path, parts: list[str]) -> bool:
    below = os.path.normpath(fence.below).split(os.sep)
    return parts[: len(below)] == below and len(parts) > len(below)


def _open_dir(part: str, folder: int, where: Path) -> int:
    try:
        return os.open(part, _DIRECTORY, dir_fd=folder)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, folder):
            raise NotContained(f"{where} is a symbolic link; zeropilot does not follow it") from exc
        raise


def _is_link(name: str, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


# torch.save writes a zip archive whose last record is the end of its central directory: a
# file cut short by a killed rank lacks it (read, never unpickled).
_ZIP_END = b"PK\x05\x06"
_ZIP_END_SIZE = 22  # torch writes no archive comment


def _regular_names(folder: int) -> set[str]:
    """The regular files (not links) directly in the folder with a size above zero; a ``.pt``
    file only when it ends as a whole torch archive does."""
    names = set()
    for name in os.listdir(folder):
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0:
            continue
        if not name.endswith(".pt") or _ends_as_archive(name, folder, info.st_size):
            names.add(name)
    return names


def _ends_as_archive(name: str, folder: int, size: int) -> bool:
    if size < _ZIP_END_SIZE:
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    try:
        return os.pread(fd, _ZIP_END_SIZE, size - _ZIP_END_SIZE).startswith(_ZIP_END)
    finally:
        os.close(fd)


def folder_bytes(folder: int) -> int:
    """The bytes of the regular files below the folder; links are not followed."""
    total = 0
    for _path, _dirs, files, fd in os.fwalk(".", dir_fd=folder, follow_symlinks=False):
        for name in files:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    return total


def inspect(fence: Fence, path: str, stage: int, world_size: int) -> Found:
    """Whether the checkpoint at ``path`` holds every rank's files, and its size. A Trainer
    checkpoint (``checkpoint-N``) must also hold ``trainer_state.json``, which the Trainer
    writes after every rank's save returned; its DeepSpeed tag is what its ``latest`` names."""
    try:
        with opened_folder(fence, path) as folder:
            names = _regular_names(folder)
            size = folder_bytes(folder)
            missing = _missing(fence, path, folder, names, stage, world_size)
    except NotContained as exc:
        return Found(False, 0, str(exc))
    except FileNotFoundError:
        return Found(False, 0, f"{path} does not exist")
    return Found(not missing, size, ", ".join(missing))


def _missing(
    fence: Fence, path: str, folder: int, names: set[str], stage: int, world_size: int
) -> list[str]:
    if not is_trainer_checkpoint(names) and not os.path.basename(path).startswith("checkpoint-"):
        return missing_deepspeed_files(names, stage, world_size)  # a DeepSpeed tag folder
    if TRAINER_STATE not in names:
        return [TRAINER_STATE]
    if DEEPSPEED_LATEST not in names:
        return [DEEPSPEED_LATEST]
    with open_beneath(Path(os.path.realpath(fence.root)), _latest_path(fence, path)) as latest:
        tag = latest.read(MAX_TAG_CHARS).decode(errors="replace").strip()
    if not tag or "/" in tag or tag in (".", ".."):
        return [f"{DEEPSPEED_LATEST} names no folder ({tag!r})"]
    try:
        inner = _open_dir(tag, folder, Path(path) / tag)
    except FileNotFoundError:
        return [f"{tag}/"]
    try:
        return [
            f"{tag}/{m}" for m in missing_deepspeed_files(_regular_names(inner), stage, world_size)
        ]
    finally:
        os.close(inner)


def _latest_path(fence: Fence, path: str) -> Path:
    root, parts = _below(fence, path)
    return root.joinpath(*parts, DEEPSPEED_LATEST)


def delete(fence: Fence, path: str) -> None:
    """Delete the checkpoint folder at ``path``; a link there is refused (NotContained)."""
    with opened_folder(fence, path, parent=True) as parent:
        name = os.path.basename(os.path.normpath(path))
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            raise NotContained(f"{path} is not a folder (a link?); zeropilot does not follow it")
        shutil.rmtree(name, dir_fd=parent)
