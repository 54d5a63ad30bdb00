"""The long polls' hub: however many requests wait, on however many jobs, one read a tick
covers them all; each waiter answers on its own job's news; a failed read reaches every
waiter (the API turns a lost database into 503)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from service.api.job_progress import NoSuchJob, ProgressHub, Seen, news
from service.core.states import JobStatus
from service.db.jobs import Progress

RUNNING = JobStatus.RUNNING


class Jobs:
    """Jobs' progress as a read sees it, and every read made."""

    def __init__(self, count: int) -> None:
        self.now = {f"j{n}": Progress(RUNNING, 1, 0) for n in range(count)}
        self.reads: list[list[str]] = []

    def read(self, ids: Sequence[str]) -> dict[str, Progress]:
        self.reads.append(list(ids))
        return {i: self.now[i] for i in ids if i in self.now}


SEEN = Seen(RUNNING, 1, 0)
T = TypeVar("T")


def run(scenario: Coroutine[Any, Any, T]) -> T:
    """On an event loop of its own thread: the suite's thread may hold one left running."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, scenario).result()


def test_news_is_an_event_a_status_or_an_end_before_metrics() -> None:
    assert news(Progress(RUNNING, 1, 0), SEEN) is None
    assert news(Progress(RUNNING, 1, 5), SEEN) == "metrics"
    assert news(Progress(RUNNING, 2, 5), SEEN) == "event"
    assert news(Progress(JobStatus.ESCALATING, 1, 0), SEEN) == "event"
    assert news(Progress(JobStatus.SUCCEEDED, 1, 0), Seen(JobStatus.SUCCEEDED, 1, 0)) == "event"


def test_a_hundred_waiters_on_ten_jobs_share_one_read_a_tick() -> None:
    jobs = Jobs(10)
    hub = ProgressHub(jobs.read, tick_s=0.05)

    async def scenario() -> list[tuple[bool, Progress]]:
        waits = [hub.wait(f"j{n % 10}", SEEN, timeout_s=5) for n in range(100)]
        tasks = [asyncio.ensure_future(w) for w in waits]
        await asyncio.sleep(0.3)
        jobs.now["j3"] = Progress(JobStatus.SUCCEEDED, 2, 0)  # j3 ends: its ten waiters answer
        done, pending = await asyncio.wait(tasks, timeout=1.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return [task.result() for task in done]

    answered = run(scenario())
    assert len(answered) == 10
    assert all(changed and p.status == JobStatus.SUCCEEDED for changed, p in answered)
    assert len(jobs.reads) < 40, "one read a tick, not one per waiter"
    assert sorted(jobs.reads[1]) == sorted(jobs.now), "each read covers every waited job"


def test_an_unknown_job_and_a_failed_read_reach_the_waiter() -> None:
    jobs = Jobs(1)
    hub = ProgressHub(jobs.read, tick_s=0.01)
    with pytest.raises(NoSuchJob):
        run(hub.wait("gone", SEEN, timeout_s=2))

    def lost(_: Sequence[str]) -> dict[str, Progress]:
        raise ConnectionError("the database went away")

    with pytest.raises(ConnectionError):
        run(ProgressHub(lost, tick_s=0.01).wait("j0", SEEN, timeout_s=2))


def test_a_release_answers_the_held_waits_at_once_unchanged() -> None:
    """As the API shuts down: uvicorn would otherwise hold them to its graceful timeout."""
    jobs = Jobs(1)
    hub = ProgressHub(jobs.read, tick_s=0.05)

    async def scenario() -> tuple[float, tuple[bool, Progress]]:
        loop = asyncio.get_running_loop()
        held = asyncio.ensure_future(hub.wait("j0", SEEN, timeout_s=20))
        await asyncio.sleep(0.3)
        released_at = loop.time()
        hub.release()  # what release_waiters() does to every hub of the process
        answer = await asyncio.wait_for(held, 5)
        return loop.time() - released_at, answer

    took, (changed, progress) = run(scenario())
    assert not changed and progress == jobs.now["j0"]
    assert took < 1, "answered at the release, not at its timeout"
