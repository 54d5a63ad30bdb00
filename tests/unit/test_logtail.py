"""Log reading for `zeropilot logs`: the tail, and following by byte offset."""

from __future__ import annotations

from pathlib import Path

from service.logtail import log_size, read_from, tail_lines


def test_tail_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert tail_lines(tmp_path, log, 3) == "line 99997\nline 99998\nline 99999\n"
    assert tail_lines(tmp_path, tmp_path / "missing.log", 3) == ""
    assert log_size(tmp_path, tmp_path / "missing.log") == 0


def test_follow_returns_whole_lines_and_the_next_offset(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text("step 1\nstep 2\nstep 3 (half")
    text, offset = read_from(tmp_path, log, 0)
    assert text == "step 1\nstep 2\n"
    with log.open("a") as handle:
        handle.write(" written)\nstep 4\n")
    more, offset = read_from(tmp_path, log, offset)
    assert more == "step 3 (half written)\nstep 4\n"
    assert read_from(tmp_path, log, offset) == ("", offset)
    assert log_size(tmp_path, log) == offset
