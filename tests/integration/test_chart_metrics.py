"""The chart's optional ServiceMonitor scrapes the API Service's /metrics; off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.api.routes.prometheus import router as prometheus_router
from tests.integration.test_chart import find, render


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def test_service_monitor_scrapes_the_api_service_metrics_route(helm_home: Path) -> None:
    assert not [d for d in render(helm_home) if d["kind"] == "ServiceMonitor"]
    changes = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s",
                                              "labels": {"release": "prom"}}}}  # fmt: skip
    docs = render(helm_home, changes)
    monitor = find(docs, "ServiceMonitor", "zeropilot-api")
    service = find(docs, "Service", "zeropilot-api")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert "http" in {port["name"] for port in service["spec"]["ports"]}
    assert "/metrics" in {route.path for route in prometheus_router.routes}  # type: ignore[attr-defined]
