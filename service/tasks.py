"""Names of the Celery tasks, shared by the API (which sends) and the workers (which run them).

The API sends tasks by name so that it never imports the worker code that talks to clusters.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

LAUNCH_ATTEMPT = "zeropilot.launch_attempt"
CANCEL_ATTEMPT = "zeropilot.cancel_attempt"
RECONCILE = "zeropilot.reconcile"

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _producer(broker_url: str) -> Any:
    from celery import Celery  # only the sending side is needed here

    return Celery("zeropilot-api", broker=broker_url, set_as_current=False)


def send_task(broker_url: str, name: str, *args: str) -> None:
    """Enqueue a task; call it only after the transaction that made the work has committed."""
    _producer(broker_url).send_task(name, args=list(args))


def send_or_leave_to_sweep(broker_url: str, name: str, attempt_id: str) -> None:
    """Enqueue after a commit; if the broker is down, the work is stored and the reconcile
    sweep re-sends launches left without progress, so a request never fails for it."""
    try:
        send_task(broker_url, name, attempt_id)
    except Exception:
        log.warning("could not enqueue %s for attempt %s", name, attempt_id, exc_info=True)
