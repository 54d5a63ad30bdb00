"""Long polls on jobs' progress (``GET /v1/jobs/{id}/wait``), answered from one read a tick.

A follower (``zeropilot submit --wait``, a script) says what it has seen: the job's status and
the ids of its newest event and metric point. Its request is held until the job moves past
that, or until its timeout. However many requests wait, on however many jobs, each API process
reads the progress of all of them in one statement per tick, off the event loop: a thousand
followers cost the database one query a tick, not two full reads each per look.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from anyio import to_thread
from sqlmodel import Session

from service.core.states import JobStatus
from service.db.jobs import Progress, progress_of
from service.db.session import get_engine

logger = logging.getLogger("zeropilot.api")
TICK_S = 0.1  # how stale an answer may be: a job's end reaches its follower within this
# New metrics alone are held this long for more to join them (or for an event, answered at
# once): a job stepping ten times a second wakes its followers once a second, not ten times.
METRICS_SETTLE_S = 1.0

ReadProgress = Callable[[Sequence[str]], dict[str, Progress]]


@dataclass(frozen=True)
class Seen:
    """What the caller already knows of the job."""

    status: JobStatus | None
    last_event_id: int
    last_metric_id: int


def news(progress: Progress, seen: Seen) -> str | None:
    """What in ``progress`` the caller has not seen: "event" (the status or an event moved,
    or the job has ended), "metrics" (only new points), or None."""
    if progress.status.terminal or progress.status != seen.status:
        return "event"
    if progress.last_event_id > seen.last_event_id:
        return "event"
    if progress.last_metric_id > seen.last_metric_id:
        return "metrics"
    return None


def read_from(database_url: str) -> ReadProgress:
    def read(job_ids: Sequence[str]) -> dict[str, Progress]:
        with Session(get_engine(database_url)) as session:
            return progress_of(session, job_ids)

    return read


class NoSuchJob(Exception):
    """The job waited on is no longer there."""


class ShuttingDown(Exception):
    """The API process is stopping before the job's progress was read: ask again."""


_HUBS: weakref.WeakSet[ProgressHub] = weakref.WeakSet()


def release_waiters() -> None:
    """Answer every held long poll of this process now (the server is shutting down: it
    would otherwise wait for them until its graceful timeout). Call it on the event loop."""
    for hub in list(_HUBS):
        hub.release()


class ProgressHub:
    """One API process's long polls: a tick task runs while any request waits."""

    def __init__(self, read: ReadProgress, tick_s: float = TICK_S) -> None:
        self._read = read
        self._tick_s = tick_s
        self._waiting: Counter[str] = Counter()
        self._latest: dict[str, Progress] = {}
        self._read_ids: frozenset[str] = frozenset()
        self._failure: Exception | None = None
        self._ticked = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._released = False
        _HUBS.add(self)

    def release(self) -> None:
        """Answer the waiting requests at once, and every later one without holding it."""
        self._released = True
        self._ticked.set()

    async def wait(self, job_id: str, seen: Seen, timeout_s: float) -> tuple[bool, Progress]:
        """``(True, progress)`` once the job has news for the caller, else ``(False, the
        progress at the timeout)``; NoSuchJob if it disappears, the read's error if it fails."""
        self._follow_this_loop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        hold_until: float | None = None  # set by the first new metrics
        self._waiting[job_id] += 1
        self._start_ticking()
        try:
            while True:
                ticked = self._ticked
                with_time = min(deadline, hold_until or deadline) - loop.time()
                if with_time > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ticked.wait(), with_time)
                progress = self._progress(job_id)
                if progress is None:  # not read yet: the request came between two ticks
                    if self._released:
                        raise ShuttingDown(job_id)
                    if loop.time() < deadline:
                        continue
                    raise NoSuchJob(job_id)
                found = news(progress, seen)
                if self._released:
                    return found is not None, progress
                now = loop.time()
                if found == "event" or (hold_until is not None and now >= hold_until):
                    return True, progress
                if found == "metrics" and hold_until is None:
                    hold_until = min(now + METRICS_SETTLE_S, deadline)
                if now >= deadline:
                    return found is not None, progress
        finally:
            self._waiting[job_id] -= 1
            if not self._waiting[job_id]:
                del self._waiting[job_id]

    def _progress(self, job_id: str) -> Progress | None:
        if self._failure is not None:
            raise self._failure
        if job_id not in self._read_ids:
            return None
        found = self._latest.get(job_id)
        if found is None:
            raise NoSuchJob(job_id)
        return found

    def _follow_this_loop(self) -> None:
        """Tests serve requests on more than one event loop: the hub starts afresh on each."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._ticked, self._task = loop, asyncio.Event(), None
            self._read_ids, self._latest = frozenset(), {}

    def _start_ticking(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._tick_while_waited())

    async def _tick_while_waited(self) -> None:
        while self._waiting:
            ids = sorted(self._waiting)
            try:
                self._latest = await to_thread.run_sync(self._read, ids)
                self._failure = None
            except Exception as exc:  # e.g. the database is away: every waiter answers 503
                logger.warning("reading the progress of %d waited jobs failed: %s", len(ids), exc)
                self._failure = exc
            self._read_ids = frozenset(ids)
            ticked, self._ticked = self._ticked, asyncio.Event()
            ticked.set()
            await asyncio.sleep(self._tick_s)
