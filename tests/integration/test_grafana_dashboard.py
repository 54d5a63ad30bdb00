"""The Grafana dashboard in deploy/grafana asks only for metrics the service exports, and shows
every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from service import metrics
from service.api.routes.prometheus import DatabaseCollector
from service.db.migrate import upgrade
from tests.integration.helpers import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "zeropilot-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_series(tmp_path: Path) -> dict[str, str]:
    """Every series name /metrics can carry, mapped to its family's name."""
    families = [
        family
        for metric in vars(metrics).values()
        if isinstance(metric, MetricWrapperBase)
        for family in metric.describe()
    ]
    database_url = f"sqlite:///{tmp_path / 'zeropilot.db'}"
    upgrade(database_url)
    families += list(DatabaseCollector(database_url).collect())
    return {
        family.name + suffix: family.name for family in families for suffix in SUFFIXES[family.type]
    }


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_query_names_an_exported_metric_and_every_metric_has_a_panel(
    tmp_path: Path,
) -> None:
    series = exported_series(tmp_path)
    used: set[str] = set()
    for expr in queries():
        names = set(re.findall(r"\bzeropilot_[a-z0-9_]+", expr))
        assert names, f"query names no zeropilot metric: {expr}"
        unknown = names - set(series)
        assert not unknown, f"{expr} asks for {unknown}, which /metrics never exports"
        used |= {series[name] for name in names}
    assert set(series.values()) - used == set()


def test_metric_names_follow_prometheus_conventions(tmp_path: Path) -> None:
    for name in exported_series(tmp_path):
        assert name.startswith("zeropilot_")
        assert not name.endswith("_total_total")
        if "duration" in name or "wait" in name or "latency" in name:
            assert "_seconds" in name, name
