"""``GET /metrics``: Prometheus text format, for the monitoring that operators already run.

It adds up what this host's or pod's API and worker processes recorded (``service.metrics``,
through ``PROMETHEUS_MULTIPROC_DIR`` when set) and reads the current state from the database
at scrape time: jobs by status and cluster, each team's queue and GPUs, which any replica
reports the same. No bearer token, as scrapers expect; it carries counts and team names only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime

from fastapi import APIRouter, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sqlalchemy import func
from sqlmodel import Session, col, select

from service.api.deps import SettingsDep
from service.core.sharing import sharing
from service.core.states import JobStatus
from service.db.admission import held
from service.db.models import AttemptObservation, ClusterCalibrationRow, Job, Team
from service.db.session import get_engine
from service.metrics import process_registry

router = APIRouter(tags=["operations"])


@router.get("/metrics", include_in_schema=False)
def metrics(settings: SettingsDep) -> Response:
    database = CollectorRegistry(auto_describe=False)
    database.register(DatabaseCollector(settings.database_url))
    body = generate_latest(process_registry()) + generate_latest(database)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class DatabaseCollector:
    """Gauges of what the database holds now, read once per scrape."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def collect(self) -> Iterator[Metric]:
        with Session(get_engine(self.database_url)) as session:
            yield _jobs_by_status(session)
            yield from _team_gauges(session)
            yield from _advisor_gauges(session)


def _jobs_by_status(session: Session) -> Metric:
    family = GaugeMetricFamily(
        "zeropilot_jobs", "Jobs in each status, by cluster.", labels=["cluster", "status"]
    )
    query = select(Job.cluster, Job.status, func.count()).group_by(Job.cluster, Job.status)
    for cluster, status, count in session.exec(query).all():
        family.add_metric([cluster, status], count)
    return family


def _team_gauges(session: Session) -> Iterator[Metric]:
    teams = session.exec(select(Team).order_by(Team.name)).all()
    names = {team.id: team.name for team in teams if team.id is not None}
    usage = held(session, names)
    depth = GaugeMetricFamily(
        "zeropilot_queue_depth", "Jobs waiting for admission.", labels=["team"]
    )
    oldest = GaugeMetricFamily(
        "zeropilot_queue_oldest_wait_seconds",
        "How long the team's oldest waiting job has waited.",
        labels=["team"],
    )
    gpus = GaugeMetricFamily(
        "zeropilot_team_gpus_held", "GPUs held by admitted jobs.", labels=["team"]
    )
    quota = GaugeMetricFamily(
        "zeropilot_team_gpu_quota", "GPU quota, where one is set.", labels=["team"]
    )
    borrowed = GaugeMetricFamily(
        "zeropilot_team_gpus_borrowed",
        "GPUs held past the team's quota, on other teams' idle GPUs.",
        labels=["team"],
    )
    lent = GaugeMetricFamily(
        "zeropilot_team_gpus_lent",
        "Of the team's idle quota, GPUs other teams' borrowing jobs use now.",
        labels=["team"],
    )
    waiting = session.exec(
        select(Job.team_id, func.count(), func.min(Job.created_at))
        .where(col(Job.status) == JobStatus.PENDING)
        .group_by(col(Job.team_id))
    ).all()
    by_team: dict[int | None, tuple[int, datetime | None]] = {
        team_id: (count, first) for team_id, count, first in waiting
    }
    now = datetime.now(UTC)
    shown = sharing(usage.by_team, {team.name: team.gpu_quota for team in teams})
    for team in teams:
        count, first = by_team.get(team.id, (0, None))
        depth.add_metric([team.name], count)
        oldest.add_metric([team.name], _age_s(now, first))
        gpus.add_metric([team.name], usage.by_team.get(team.name, 0))
        borrowed.add_metric([team.name], shown[team.name].borrowed)
        lent.add_metric([team.name], shown[team.name].lent)
        if team.gpu_quota is not None:
            quota.add_metric([team.name], team.gpu_quota)
    yield from (depth, oldest, gpus, quota, borrowed, lent)


def _age_s(now: datetime, since: datetime | None) -> float:
    if since is None:
        return 0.0
    if since.tzinfo is None:  # SQLite returns naive UTC
        since = since.replace(tzinfo=UTC)
    return max(0.0, (now - since).total_seconds())


RECENT_OBSERVATIONS = 20  # per cluster: the running prediction error follows the latest runs


def _advisor_gauges(session: Session) -> Iterator[Metric]:
    """Each cluster's calibration and how far the plans' step times were from the runs."""
    runs = GaugeMetricFamily("zeropilot_advisor_calibration_runs",
                             "Runs the cluster's stored calibration was fitted on.",
                             labels=["cluster"])  # fmt: skip
    fitted = GaugeMetricFamily("zeropilot_advisor_step_time_fit_error",
                               "Median |predicted / measured - 1| of step time after the fit.",
                               labels=["cluster"])  # fmt: skip
    for row in session.exec(select(ClusterCalibrationRow)).all():
        runs.add_metric([row.cluster], row.observations)
        fitted.add_metric([row.cluster], row.typical_error)
    yield runs
    yield fitted
    yield _prediction_error(session)


def _prediction_error(session: Session) -> Metric:
    family = GaugeMetricFamily(
        "zeropilot_advisor_step_time_prediction_error",
        "Median |predicted / measured - 1| of step time over the cluster's latest runs, as the"
        " plans predicted them when submitted.",
        labels=["cluster"],
    )
    query = (
        select(AttemptObservation.cluster, AttemptObservation.predicted_step_seconds,
               AttemptObservation.step_seconds)
        .where(col(AttemptObservation.step_seconds).is_not(None),
               col(AttemptObservation.predicted_step_seconds).is_not(None))
        .order_by(col(AttemptObservation.created_at).desc())
        .limit(50 * RECENT_OBSERVATIONS)
    )  # fmt: skip
    errors: dict[str, list[float]] = defaultdict(list)
    for cluster, predicted, measured in session.exec(query).all():
        if predicted and measured and len(errors[cluster]) < RECENT_OBSERVATIONS:
            errors[cluster].append(abs(predicted / measured - 1))
    for cluster, found in sorted(errors.items()):
        family.add_metric([cluster], statistics.median(found))
    return family
