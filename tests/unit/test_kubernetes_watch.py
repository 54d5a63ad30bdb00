"""The watched copy's bookkeeping: events applied in order, a compacted version relisted.

The API server's answers are replayed here as the lines a WATCH sends; the same copy against
the real control plane is tests/integration/test_kubernetes_watch.py (a real 410 Gone needs etcd
to have compacted the version away, which no test waits for)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from workers.backends.kubernetes_watch import Feed, Gone, Mirror


def job(name: str, version: str, phase: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "status": {"phase": phase}}


class Stream:
    """A watch response: the given events, then the server's end of the watch."""

    def __init__(self, *events: dict[str, Any]) -> None:
        self.lines = b"".join(json.dumps(e).encode() + b"\n" for e in events)

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield self.lines[:7]  # a line split across chunks is joined again
        yield self.lines[7:]

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


def test_events_change_the_copy_and_its_version() -> None:
    mirror = Mirror(Feed("Jobs", lambda: {"metadata": {"resourceVersion": "5"},
                                          "items": [job("a", "4"), job("b", "5")]},
                         lambda version: None, kept=lambda obj: obj))  # fmt: skip
    mirror._relist()

    mirror.apply({"type": "MODIFIED", "object": job("a", "6", "Done")})
    mirror.apply({"type": "DELETED", "object": job("b", "7")})
    mirror.apply({"type": "ADDED", "object": job("c", "8")})
    mirror.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})

    items = {o["metadata"]["name"]: o["status"]["phase"] for o in mirror.items() or []}
    assert items == {"a": "Done", "c": ""}
    assert mirror._version == "9"
    compacted = {"kind": "Status", "code": 410, "message": "too old resource version"}
    with pytest.raises(Gone):
        mirror.apply({"type": "ERROR", "object": compacted})


def test_a_version_gone_is_listed_again_and_the_watch_goes_on_from_the_new_one() -> None:
    lists = iter([
        {"metadata": {"resourceVersion": "10"}, "items": [job("a", "10")]},
        {"metadata": {"resourceVersion": "50"}, "items": [job("a", "40", "Done")]},
    ])  # fmt: skip
    opened: list[str] = []
    quiet = threading.Event()

    def open_watch(version: str) -> Stream:
        opened.append(version)
        if len(opened) == 1:
            return Stream({"type": "ERROR", "object": {"code": 410, "message": "gone"}})
        if len(opened) == 2:
            return Stream({"type": "ADDED", "object": job("b", "51")})
        quiet.wait(5)  # the next watch: nothing happens until the test ends
        return Stream()

    mirror = Mirror(Feed("Jobs", lambda: next(lists), open_watch, kept=lambda obj: obj))
    mirror.start()
    deadline = time.monotonic() + 5
    while len(opened) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    items = {o["metadata"]["name"]: o["status"]["phase"] for o in mirror.items() or []}
    quiet.set()
    mirror.stop()

    assert opened[:3] == ["10", "50", "51"]  # relisted after the 410, then from each last version
    assert items == {"a": "Done", "b": ""}
