"""A worker's own copy of zeropilot's Jobs and Pods in a namespace, kept current by a WATCH.

A reconcile pass that LISTs 10,000 Jobs and their pods every few seconds makes the API server
serialize tens of megabytes each time, however little changed; controllers instead list once
and watch (client-go's informers), and so does this: the first pass that polls a namespace
LISTs it (as before), then a thread WATCHes from that LIST's ``resourceVersion`` and applies
each ADDED, MODIFIED and DELETED to the copy. The server ends a watch after ``WATCH_TIMEOUT_S``;
the thread opens the next one from the last version it saw (bookmarks keep that recent), and
LISTs again when the server says that version is gone (410 Gone, after etcd compacted it).

A pass reads the copy only while its watch is connected; otherwise it LISTs, as before. A copy
no pass has read for ``IDLE_S`` stops (its process no longer runs passes). Nothing the copy
misses is lost for good: a restarted worker starts with a new LIST, and a Job the copy lacks
is read directly by the caller. The thread's requests are counted as ``kubernetes-watch``,
apart from the calls a pass makes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workers.backends.calls import count_call
from workers.backends.kubernetes_status import Json

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 60  # the server ends each watch after this; the next opens at once
READ_TIMEOUT_S = 90.0  # a watch silent for longer (no event, no bookmark, no end) is dead
IDLE_S = 300.0  # a copy no pass has read for this long stops
RETRY_S = (0.5, 30.0)  # first and longest wait before reopening a failed watch
WATCH_CALLS = "kubernetes-watch"


class Gone(Exception):
    """The version a watch resumes from was compacted away: only a new LIST can go on."""


@dataclass(frozen=True)
class Feed:
    """How one kind of object in one namespace is listed and watched (raw JSON, not models)."""

    what: str  # e.g. "Jobs in team-a", for the log
    list_all: Callable[[], Json]  # one LIST: ``{"metadata": {"resourceVersion"}, "items"}``
    open_watch: Callable[[str], Any]  # a WATCH from a version: a streaming urllib3 response
    kept: Callable[[Json], Json]  # what the copy keeps of an object (the fields a pass reads)


class Mirror:
    """The objects of one feed by name, as the last LIST and the events since have them."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self._objects: dict[str, Json] = {}
        self._version: str | None = None
        self._live = False
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.last_read = time.monotonic()

    def start(self) -> None:
        """LIST now (its errors are the caller's, as a pass's own LIST's), then watch."""
        self._relist()
        self._thread = threading.Thread(
            target=self._run, name=f"watch {self.feed.what}", daemon=True
        )
        self._thread.start()

    def items(self) -> list[Json] | None:
        """Every object, or None while the watch is not connected (the copy may be behind)."""
        self.last_read = time.monotonic()
        with self._lock:
            return list(self._objects.values()) if self._live else None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def watching(self) -> bool:
        """Whether a watch is open now (after the LIST, before the first one opens: not yet)."""
        return self._response is not None

    def stop(self) -> None:
        self._stopped.set()
        self.disconnect()

    def disconnect(self) -> None:
        """Drop the open watch as a network fault would (the thread resumes from its version)."""
        response = self._response
        if response is not None:
            # A shutdown ends the thread's blocked read at once; a close would wait for it.
            with contextlib.suppress(ValueError, RuntimeError, OSError):
                response.shutdown()

    def _run(self) -> None:
        wait = RETRY_S[0]
        while not self._stopped.is_set():
            if time.monotonic() - self.last_read > IDLE_S:
                log.info("watch of %s stopped: no pass read it for %.0f s", self.feed.what, IDLE_S)
                break
            try:
                if self._version is None:
                    self._relist()
                self._watch_once()
                wait = RETRY_S[0]
            except Gone:
                log.info("watch of %s: version %s is gone, listing again", self.feed.what,
                         self._version)  # fmt: skip
                self._set_live(False)
                self._version = None
            except Exception as exc:  # the API server restarted, the network broke, ...
                if self._stopped.is_set():
                    break
                self._set_live(False)
                log.warning("watch of %s failed (%s); again in %.1f s", self.feed.what, exc, wait)
                self._stopped.wait(wait)
                wait = min(wait * 2, RETRY_S[1])
        self._set_live(False)
        self._stopped.set()

    def _relist(self) -> None:
        listed = self.feed.list_all()
        kept = self.feed.kept
        objects = {_name(item): kept(item) for item in listed.get("items") or []}
        with self._lock:
            self._objects = objects
            self._version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            self._live = True

    def _watch_once(self) -> None:
        """One watch from the current version until the server ends it."""
        count_call(WATCH_CALLS)
        response = self.feed.open_watch(str(self._version))
        self._response = response
        try:
            if self._stopped.is_set():
                return
            self._set_live(True)
            for line in _lines(response):
                self.apply(json.loads(line))
        finally:
            self._response = None
            response.close()  # never back to the pool: it may be shut down
            response.release_conn()

    def apply(self, event: Json) -> None:
        """One watch event: the copy and the version it is current to."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(str(obj.get("message") or "410 Gone"))
            raise RuntimeError(f"the watch answered {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._objects[_name(obj)] = self.feed.kept(obj)
            elif kind == "DELETED":
                self._objects.pop(_name(obj), None)
            if version:  # a BOOKMARK carries only this
                self._version = str(version)

    def _set_live(self, live: bool) -> None:
        with self._lock:
            self._live = live


def _name(obj: Json) -> str:
    return str(obj["metadata"]["name"])


def _lines(response: Any) -> Iterator[bytes]:
    """The watch's events, one JSON document per line, as the chunks bring them."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


_MIRRORS: dict[tuple[Any, ...], Mirror] = {}
_REGISTRY = threading.Lock()


def watched_items(key: tuple[Any, ...], feed: Callable[[], Feed]) -> list[Json] | None:
    """The objects of the feed ``key`` names: its copy's, started (with a LIST) on first use;
    None while its watch is not connected."""
    with _REGISTRY:
        mirror = _MIRRORS.get(key)
        if mirror is None or not mirror.running:
            mirror = Mirror(feed())
            mirror.start()
            _MIRRORS[key] = mirror
    return mirror.items()


def mirrors() -> list[Mirror]:
    with _REGISTRY:
        return list(_MIRRORS.values())


def stop_all() -> None:
    """Every copy stopped (a worker shutting down; a test done with its control plane)."""
    with _REGISTRY:
        stopping = list(_MIRRORS.values())
        _MIRRORS.clear()
    for mirror in stopping:
        mirror.stop()
