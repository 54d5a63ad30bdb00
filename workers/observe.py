"""What a worker process records about its own work: task durations and failures, the ids its
log lines carry (the request id sent by the API, the attempt id a task is for), and the job
transitions it commits (``service.metrics``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import signals
from prometheus_client import start_http_server

from service import logs
from service.metrics import (
    TASK_FAILURES,
    TASK_SECONDS,
    install_transition_metrics,
    process_registry,
)
from service.settings import Settings

_started: dict[str, tuple[float, Any]] = {}  # task id -> start time, context tokens


def install(settings: Settings) -> None:
    install_transition_metrics()
    signals.task_prerun.connect(_task_started, weak=False)
    signals.task_postrun.connect(_task_ended, weak=False)
    signals.task_failure.connect(_task_failed, weak=False)
    if settings.workers.metrics_port is not None:
        port = settings.workers.metrics_port
        signals.worker_ready.connect(lambda **_: _serve_metrics(port), weak=False)
    if settings.log.format == "json":
        signals.after_setup_logger.connect(_json_handlers, weak=False)
        signals.after_setup_task_logger.connect(_json_handlers, weak=False)


def _task_started(task_id: str, task: Any, args: tuple[Any, ...] = (), **_: Any) -> None:
    request_id = task.request.get(logs.REQUEST_ID_HEADER)
    attempt_id = args[0] if args and isinstance(args[0], str) else None
    tokens = (logs.request_id.set(request_id), logs.attempt_id.set(attempt_id))
    _started[task_id] = (time.perf_counter(), tokens)


def _task_ended(task_id: str, task: Any, **_: Any) -> None:
    started = _started.pop(task_id, None)
    if started is None:
        return
    began, (request_token, attempt_token) = started
    TASK_SECONDS.labels(task.name).observe(time.perf_counter() - began)
    logs.attempt_id.reset(attempt_token)
    logs.request_id.reset(request_token)
    logs.job_id.set(None)


def _task_failed(sender: Any = None, **_: Any) -> None:
    TASK_FAILURES.labels(getattr(sender, "name", "unknown")).inc()


def _serve_metrics(port: int) -> None:
    """Workers run where no API is (their own pods): they serve their metrics themselves."""
    start_http_server(port, registry=process_registry())
    logging.getLogger(__name__).info("serving Prometheus metrics on port %d", port)


def _json_handlers(logger: logging.Logger, **_: Any) -> None:
    for handler in logger.handlers:
        logs.use_json(handler)
