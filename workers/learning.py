"""The advisor's learning, on the beat: ended attempts become observations, then each cluster
with enough new ones is refitted (never inside a request). Idempotent: an attempt is observed
once, a cluster refitted only when due."""

from __future__ import annotations

import logging

from service.db.calibrations import forget, refit_if_due, row_of
from service.db.learning import record_ended
from service.db.session import session_scope
from service.settings import Settings

log = logging.getLogger(__name__)


def learn(settings: Settings) -> None:
    profiles = settings.cluster_profiles()
    with session_scope(settings.database_url) as session:
        recorded = record_ended(session, profiles)
    if recorded:
        log.info("recorded %d ended attempts for the advisor", recorded)
    for profile in profiles.values():
        with session_scope(settings.database_url) as session:
            if refit_if_due(session, profile, settings.workers.refit_after):
                row = row_of(session, profile.name)
                log.info("calibration of cluster %s refitted on %d observations, typical"
                         " error %.1f%%", profile.name, row.observations,
                         100 * row.typical_error)  # fmt: skip
    forget()  # this process plans with what was just stored
