"""A job's files are read from the service's folder without following what the job put there.

Each case makes the real thing on disk (a symbolic link swapped in with ``os.replace`` as the
issue's attacker did, a linked folder, a FIFO, a hard link) and reads through ``open_beneath``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.contained_files import NotContained, open_beneath
from service.logtail import read_from, tail_lines

SECRET = "service secret key\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """attempts/<attempt>/node-0.log, and a private file of the service's beside them."""
    root = tmp_path / "attempts"
    attempt = root / "zp-a1"
    attempt.mkdir(parents=True)
    (attempt / "node-0.log").write_text("step 1\n")
    secret = tmp_path / "secret.key"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return root, attempt, secret


def test_a_plain_log_inside_its_folder_is_read(layout: tuple[Path, Path, Path]) -> None:
    root, attempt, _ = layout
    with open_beneath(root, attempt / "node-0.log") as handle:
        assert handle.read() == b"step 1\n"


def test_a_log_replaced_by_a_link_is_refused_and_named(layout: tuple[Path, Path, Path]) -> None:
    root, attempt, secret = layout
    link = attempt / "link.tmp"
    link.symlink_to(secret)
    os.replace(link, attempt / "node-0.log")  # what code inside the job did
    for read in (
        lambda: tail_lines(root, attempt / "node-0.log", 10),
        lambda: read_from(root, attempt / "node-0.log", 0),
    ):
        with pytest.raises(NotContained, match=r"node-0\.log is a symbolic link"):
            read()


def test_a_linked_folder_on_the_way_is_refused(layout: tuple[Path, Path, Path]) -> None:
    root, _, secret = layout
    elsewhere = secret.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "node-0.log").write_text(SECRET)
    (root / "zp-a2").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(NotContained, match="zp-a2 is a symbolic link"):
        open_beneath(root, root / "zp-a2" / "node-0.log")


def test_a_path_outside_the_root_is_refused_without_touching_it(
    layout: tuple[Path, Path, Path],
) -> None:
    root, attempt, secret = layout
    for path in (secret, attempt / ".." / ".." / "secret.key", root, Path("node-0.log")):
        with pytest.raises(NotContained, match="is not inside"):
            open_beneath(root, path)


def test_a_fifo_is_refused_without_blocking(layout: tuple[Path, Path, Path]) -> None:
    root, attempt, _ = layout
    fifo = attempt / "node-1.log"
    os.mkfifo(fifo)  # with no writer, a blocking open would wait for ever
    with pytest.raises(NotContained, match=r"node-1\.log is not a regular file"):
        open_beneath(root, fifo)


def test_a_hard_link_to_another_file_is_refused(layout: tuple[Path, Path, Path]) -> None:
    root, attempt, secret = layout
    os.link(secret, attempt / "node-2.log")
    with pytest.raises(NotContained, match="has 2 hard links"):
        open_beneath(root, attempt / "node-2.log")


def test_a_missing_log_is_not_an_error(layout: tuple[Path, Path, Path]) -> None:
    root, attempt, _ = layout
    assert tail_lines(root, attempt / "node-9.log", 5) == ""
    with pytest.raises(FileNotFoundError):
        open_beneath(root, attempt / "node-9.log")
