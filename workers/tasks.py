"""Celery tasks: thin wrappers that take ids and call the launch / reconcile / cancel logic."""

from __future__ import annotations

import time

from celery import Task

from service.metrics import RECONCILE_LAST_PASS, RECONCILE_SECONDS
from service.settings import get_settings
from service.tasks import ATTEMPT_ENDED, CANCEL_ATTEMPT, LAUNCH_ATTEMPT, LEARN, RECONCILE
from workers import launch, learning, reconcile
from workers.backends.base import TemporaryError
from workers.celery_app import app


@app.task(name=LAUNCH_ATTEMPT, bind=True)
def launch_attempt(self: Task, attempt_id: str) -> None:
    # Tries are counted on the attempt, not by Celery: a sweep's re-send counts too, and the
    # last one ends the attempt. A plain re-send, not self.retry: one log line per try.
    retry_in = launch.launch_attempt(get_settings(), attempt_id)
    if retry_in is not None:
        self.apply_async((attempt_id,), countdown=retry_in)


@app.task(name=CANCEL_ATTEMPT, autoretry_for=(TemporaryError,), retry_backoff=5, max_retries=10)
def cancel_attempt(attempt_id: str) -> None:
    reconcile.cancel_attempt(get_settings(), attempt_id)


@app.task(name=ATTEMPT_ENDED, autoretry_for=(TemporaryError,), retry_backoff=2, max_retries=5)
def attempt_ended(attempt_id: str) -> None:
    reconcile.attempt_ended(get_settings(), attempt_id)


@app.task(name=RECONCILE)
def reconcile_all() -> None:
    with RECONCILE_SECONDS.time():
        reconcile.reconcile(get_settings())
    RECONCILE_LAST_PASS.set(time.time())


@app.task(name=LEARN)
def learn() -> None:
    learning.learn(get_settings())
