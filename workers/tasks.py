"""Celery tasks: thin wrappers that take ids and call the launch / reconcile / cancel logic."""

from __future__ import annotations

import time

from service.metrics import RECONCILE_LAST_PASS, RECONCILE_SECONDS
from service.settings import get_settings
from service.tasks import CANCEL_ATTEMPT, LAUNCH_ATTEMPT, RECONCILE
from workers import launch, reconcile
from workers.backends.base import TemporaryError
from workers.celery_app import app


@app.task(
    name=LAUNCH_ATTEMPT,
    autoretry_for=(TemporaryError,),
    retry_backoff=5,
    retry_backoff_max=120,
    max_retries=20,
)
def launch_attempt(attempt_id: str) -> None:
    launch.launch_attempt(get_settings(), attempt_id)


@app.task(name=CANCEL_ATTEMPT, autoretry_for=(TemporaryError,), retry_backoff=5, max_retries=10)
def cancel_attempt(attempt_id: str) -> None:
    reconcile.cancel_attempt(get_settings(), attempt_id)


@app.task(name=RECONCILE)
def reconcile_all() -> None:
    with RECONCILE_SECONDS.time():
        reconcile.reconcile(get_settings())
    RECONCILE_LAST_PASS.set(time.time())
