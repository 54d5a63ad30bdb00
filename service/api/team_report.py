"""The showback of a team's GPU time (``GET /v1/teams/{name}/report``): used, kept, lost by
cause, and what it cost where the clusters' profiles set a price."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlmodel import Session

from service.api.schemas import TeamReport
from service.core.clusters import ClusterProfile
from service.core.goodput import LOST_CAUSES, Cause, Tally, tally
from service.db.goodput import job_timeline, jobs_in_window
from service.db.models import Team

HOUR_S = 3600.0


def team_report(
    session: Session,
    team: Team,
    since: datetime,
    until: datetime,
    profiles: Mapping[str, ClusterProfile],
) -> TeamReport:
    assert team.id is not None
    by_cause = dict.fromkeys(Cause, 0.0)
    cost, lost_cost, unpriced, jobs, priced = 0.0, 0.0, 0.0, 0, False
    for job in jobs_in_window(session, team.id, since, until):
        counted = tally(job_timeline(session, job).segments, since, until)
        if counted.held <= 0:
            continue
        jobs += 1
        for cause, seconds in counted.by_cause.items():
            by_cause[cause] += seconds
        price = profiles[job.cluster].usd_per_gpu_hour if job.cluster in profiles else None
        if price is None:
            unpriced += counted.held / HOUR_S
            continue
        priced = True
        cost += price * counted.held / HOUR_S
        lost_cost += price * (counted.held - counted.productive) / HOUR_S
    total = Tally(by_cause)
    return TeamReport(
        team=team.name,
        since=since,
        until=until,
        jobs=jobs,
        gpu_hours=total.held / HOUR_S,
        productive_gpu_hours=total.productive / HOUR_S,
        goodput=total.goodput,
        lost_gpu_hours={c.value: by_cause[c] / HOUR_S for c in LOST_CAUSES},
        cost_usd=cost if priced else None,
        lost_cost_usd=lost_cost if priced else None,
        unpriced_gpu_hours=unpriced,
    )
