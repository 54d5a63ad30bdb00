"""The hang watch: running attempts that stopped making progress are found, asked for their
stacks and stopped; their end is classed ``HANG`` and ``service.core.outcomes`` resumes them.

Each reconcile pass (at most every ``workers.health_interval_s``) reads every running
attempt's progress in two statements and judges it against the job's own pace
(``service.core.progress``, the spec's ``health``). A hung attempt is marked in its evidence,
with the words that say why; its ranks print their Python stacks into their logs where the
backend can ask them (the runtime's SIGUSR1 handler); then the stop begins, with a short grace
(a hung collective cannot save), and each pass sends it again until the attempt has ended.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from service.core.progress import HangRule, Progress, hang
from service.core.spec import JobSpec
from service.db.models import Attempt, Job, utcnow
from service.db.progress import Running, running_attempts
from service.db.session import session_scope
from service.settings import Settings
from workers.backends import get_backend

log = logging.getLogger(__name__)

HANG_EVIDENCE = "hang"  # failure_evidence key: why zeropilot found the attempt hung
HANG_GRACE_S = 5.0  # SIGTERM to SIGKILL: a rank stuck in a collective cannot save anyway
_LAST_WATCH = [0.0]  # monotonic time of this process's last watch


def find_hung(settings: Settings) -> list[str]:
    """Mark the hung running attempts (at most once per interval); their ids, to stop."""
    now_s = time.monotonic()
    if now_s - _LAST_WATCH[0] < settings.workers.health_interval_s:
        return []
    _LAST_WATCH[0] = now_s
    now = utcnow()
    hung = []
    with session_scope(settings.database_url) as session:
        for running in running_attempts(session):
            why = _verdict(running, now)
            attempt = session.get(Attempt, running.attempt_id) if why else None
            if attempt is None or why is None:
                continue
            attempt.failure_evidence = {**attempt.failure_evidence, HANG_EVIDENCE: why}
            attempt.stop_grace_s, attempt.stop_grace = HANG_GRACE_S, "a hung attempt cannot save"
            session.add(attempt)
            hung.append(running.attempt_id)
            log.warning("attempt %s of job %s is hung: %s", running.attempt_id, running.job_id, why)
    return hung


def ask_for_stacks(settings: Settings, attempt: Attempt, job: Job) -> str:
    """The backend asks the attempt's ranks to print their stacks; what it did, in words."""
    profile = settings.cluster_profiles()[job.cluster]
    assert attempt.backend_ref is not None
    return get_backend(profile.kind).dump_stacks(profile, attempt.backend_ref)


def _verdict(running: Running, now: datetime) -> str | None:
    spec = JobSpec.model_validate(running.spec)
    health = spec.health
    if not health.watch:
        return None
    measured = spec.training.step_seconds(running.tokens_per_s)
    predicted = spec.training.step_seconds(running.plan.get("tokens_per_second"))
    basis = f"measured over {running.steps} steps" if measured else "predicted"
    progress = Progress(
        running.started_at, running.last_step, running.last_step_at, measured or predicted, basis
    )
    rule = HangRule(health.hang_floor_s, health.hang_factor, health.first_step_s)
    return hang(progress, rule, now)
