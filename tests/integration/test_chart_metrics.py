"""The chart's optional ServiceMonitor scrapes the API Service's /metrics; off by default."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from service.api.routes.prometheus import router as prometheus_router
from tests.integration.test_chart import container, find, pod_spec, render


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


def test_workers_serve_their_own_metrics_when_given_a_port(helm_home: Path) -> None:
    changes = {"metrics": {"workerPort": 9808, "serviceMonitor": {"enabled": True}}}
    docs = render(helm_home, changes)
    worker = container(docs, "worker")
    env = {item["name"]: item.get("value") for item in worker["env"]}
    assert env["ZEROPILOT_WORKERS__METRICS_PORT"] == "9808"
    assert {"name": "metrics", "mountPath": env["PROMETHEUS_MULTIPROC_DIR"]} in worker[
        "volumeMounts"
    ]
    assert worker["ports"] == [{"name": "metrics", "containerPort": 9808}]
    spec = pod_spec(docs, "Deployment", "zeropilot-worker")
    assert {"name": "metrics", "emptyDir": {}} in spec["volumes"]
    service = find(docs, "Service", "zeropilot-worker-metrics")
    pod_labels = find(docs, "Deployment", "zeropilot-worker")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["clusterIP"] == "None"  # every pod scraped, not one behind a VIP
    monitor = find(docs, "ServiceMonitor", "zeropilot-worker")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    api_monitor = find(docs, "ServiceMonitor", "zeropilot-api")["spec"]["selector"]["matchLabels"]
    assert not api_monitor.items() <= service["metadata"]["labels"].items()  # each its own
    for doc in docs:
        if doc["kind"] != "ServiceMonitor":  # a CRD: not in the official schemas
            kubernetes_validate.validate(doc, "1.35.0", strict=True)
