"""The Helm chart: a real helm lints and renders it, and what it renders is what we mean to run.

No Kubernetes API server runs on our build machines: the rendered objects are checked against the
official OpenAPI schemas (kubernetes-validate, strict) instead of being installed. helm comes from
ZEROPILOT_HELM (scripts/test.sh sets it with scripts/tools.sh) or PATH; without one these tests
fail rather than skip, so a machine that cannot run them says so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from service.api.routes.health import router as health_router
from service.settings import ApiSettings, ClusterSettings, Settings
from tests.integration.helpers import REPO

CHART = REPO / "charts" / "zeropilot"
SECRET_KEY = "3f9c2b7e5a1d4c8e9b0a6f2d7c1e5b4a8d3f6c9e2b7a0d5f1c4e8b3a6d9f2c7e"
SECRET_VALUES: dict[str, Any] = {
    "secret": {
        "secretKey": SECRET_KEY,
        "databaseUrl": "postgresql+psycopg://zeropilot:pw@db:5432/zeropilot",
        "brokerUrl": "redis://redis:6379/0",
    }
}
SECRET_ENV = {
    "ZEROPILOT_DB__URL": "db-url",
    "ZEROPILOT_BROKER__URL": "broker-url",
    "ZEROPILOT_AUTH__SECRET_KEY": "secret-key",
}
SERVICES = ("api", "worker", "scheduler")
Doc = dict[str, Any]


def helm_binary() -> str:
    helm = os.environ.get("ZEROPILOT_HELM") or shutil.which("helm")
    if not helm:
        pytest.fail("no helm: set ZEROPILOT_HELM=$(scripts/tools.sh helm) or put helm on PATH")
    return helm


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keeps helm's cache, config and data out of the user's home."""
    return tmp_path_factory.mktemp("helm-home")


def helm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [helm_binary(), *args], env=env, capture_output=True, text=True, check=False
    )


def merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def helm_with_values(
    home: Path, command: list[str], values: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    values_file = home / f"values-{os.urandom(4).hex()}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    return helm(home, *command, "--values", str(values_file))


def template(
    home: Path,
    values: dict[str, Any],
    release: str = "zeropilot",
    kube_version: str | None = None,
) -> subprocess.CompletedProcess[str]:
    command = ["template", release, str(CHART), "--namespace", "zeropilot"]
    if kube_version:
        command += ["--kube-version", kube_version]
    return helm_with_values(home, command, values)


def render(home: Path, changes: dict[str, Any] | None = None, **kwargs: Any) -> list[Doc]:
    result = template(home, merge(SECRET_VALUES, changes or {}), **kwargs)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def pod_spec(docs: list[Doc], kind: str, name: str) -> Doc:
    spec: Doc = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def container(docs: list[Doc], component: str) -> Doc:
    kind = "Job" if component == "migrate" else "Deployment"
    first: Doc = pod_spec(docs, kind, f"zeropilot-{component}")["containers"][0]
    return first


def env_of(spec: Doc) -> dict[str, Doc]:
    return {item["name"]: item for item in spec.get("env", [])}


def plain_manifest() -> list[Doc]:
    text = (REPO / "deploy" / "kubernetes" / "zeropilot.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load_profiles(clusters_yaml: str, tmp_path: Path) -> dict[str, Any]:
    """The profiles file as the service reads it (test_deploy does the same for the example)."""
    path = tmp_path / "clusters.yaml"
    path.write_text(clusters_yaml)
    settings = Settings(data_dir=tmp_path, clusters=ClusterSettings(profiles_file=path))
    return dict(settings.cluster_profiles())


def test_chart_metadata_follows_the_project() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert (chart["apiVersion"], chart["name"], chart["version"]) == ("v2", "zeropilot", "0.1.0")
    assert chart["appVersion"] == project["version"]


def test_helm_lint_strict_passes(helm_home: Path) -> None:
    result = helm_with_values(helm_home, ["lint", "--strict", str(CHART)], SECRET_VALUES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", ["1.29.0", "1.35.0", "1.37.0"])
def test_rendered_objects_pass_the_official_schemas(helm_home: Path, version: str) -> None:
    docs = render(helm_home, kube_version=version)
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises on any error
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim", "Secret",
         "Job", "Deployment", "Deployment", "Deployment", "Service"]
    )  # fmt: skip


def test_the_chart_makes_the_plain_manifests_objects(helm_home: Path) -> None:
    """Released as zeropilot in namespace zeropilot, it names its objects as the manifest does."""
    chart = {
        (d["kind"], d["metadata"]["name"], d["metadata"]["namespace"]) for d in render(helm_home)
    }
    plain = {
        (d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
        for d in plain_manifest()
        if d["kind"] != "Namespace"  # the release's namespace is helm's (--create-namespace)
    }
    assert chart == plain | {("Secret", "zeropilot", "zeropilot")}


def test_api_limits_default_to_the_settings_and_reach_the_pod(helm_home: Path) -> None:
    defaults = ApiSettings()
    api = env_of(container(render(helm_home), "api"))
    assert {name: api[name]["value"] for name in LIMIT_ENV} == {
        name: str(getattr(defaults, name.removeprefix("ZEROPILOT_API__").lower())).removesuffix(
            ".0"
        )
        for name in LIMIT_ENV
    }
    changed = render(helm_home, {"api": {"limits": {"headerTimeoutS": 2.5, "maxConnections": 64}}})
    env = env_of(container(changed, "api"))
    assert env["ZEROPILOT_API__HEADER_TIMEOUT_S"]["value"] == "2.5"
    assert env["ZEROPILOT_API__MAX_CONNECTIONS"]["value"] == "64"


LIMIT_ENV = [
    "ZEROPILOT_API__MAX_HEADER_BYTES",
    "ZEROPILOT_API__MAX_HEADER_COUNT",
    "ZEROPILOT_API__HEADER_TIMEOUT_S",
    "ZEROPILOT_API__MAX_CONNECTIONS",
]


def test_worker_runs_celery_as_the_only_account_bound_to_the_launcher_role(
    helm_home: Path,
) -> None:
    docs = render(helm_home, {"worker": {"concurrency": 6}})
    worker = container(docs, "worker")
    assert worker["command"] == [
        "celery", "-A", "workers.celery_app", "worker", "--loglevel", "INFO",
        "--concurrency", "6",
    ]  # fmt: skip
    assert pod_spec(docs, "Deployment", "zeropilot-worker")["serviceAccountName"] == (
        "zeropilot-worker"
    )
    find(docs, "ServiceAccount", "zeropilot-worker")
    binding = find(docs, "RoleBinding", "zeropilot-worker-launches")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "zeropilot-worker", "namespace": "zeropilot"}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "zeropilot-launcher",
    }
    plain_role = next(d for d in plain_manifest() if d["kind"] == "Role")
    assert find(docs, "Role", "zeropilot-launcher")["rules"] == plain_role["rules"]
    for other in ("api", "scheduler"):
        spec = pod_spec(docs, "Deployment", f"zeropilot-{other}")
        assert "serviceAccountName" not in spec
        assert spec["automountServiceAccountToken"] is False
    scheduler = container(docs, "scheduler")
    assert scheduler["command"][:5] == ["celery", "-A", "workers.celery_app", "beat", "--loglevel"]
    assert find(docs, "Deployment", "zeropilot-scheduler")["spec"]["replicas"] == 1


def test_api_serves_on_its_port_with_probes_on_the_real_health_routes(helm_home: Path) -> None:
    docs = render(helm_home)
    api = container(docs, "api")
    real_paths = {route.path for route in health_router.routes}  # type: ignore[attr-defined]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"/readyz", "/healthz"} <= real_paths
    assert api["ports"] == [{"name": "http", "containerPort": 8321}]
    assert api["command"][:3] == ["python", "-m", "service.api.serve"]  # with the head limits
    assert api["command"][-2:] == ["--port", "8321"]
    service = find(docs, "Service", "zeropilot-api")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8321, "targetPort": "http"}]
    pod_labels = find(docs, "Deployment", "zeropilot-api")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert pod_labels["app.kubernetes.io/component"] == "api"
    assert pod_labels["helm.sh/chart"] == "zeropilot-0.1.0"


def test_services_get_every_setting_the_plain_manifest_gives(helm_home: Path) -> None:
    docs = render(helm_home)
    plain = [d for d in plain_manifest() if d["kind"] in ("Deployment", "Job")]
    for component in (*SERVICES, "migrate"):
        expected = next(d for d in plain if d["metadata"]["name"] == f"zeropilot-{component}")
        wanted = env_of(expected["spec"]["template"]["spec"]["containers"][0])
        assert env_of(container(docs, component)) == wanted, component


def test_secrets_are_referenced_never_inlined(helm_home: Path) -> None:
    docs = render(helm_home)
    for component in (*SERVICES, "migrate"):
        env = env_of(container(docs, component))
        for name, key in SECRET_ENV.items():
            assert "value" not in env[name]
            assert env[name]["valueFrom"] == {"secretKeyRef": {"name": "zeropilot", "key": key}}
    holders = [d for d in docs if SECRET_KEY in yaml.safe_dump(d)]
    assert [(d["kind"], d["metadata"]["name"]) for d in holders] == [("Secret", "zeropilot")]
    secret = holders[0]
    assert secret["stringData"]["secret-key"] == SECRET_KEY
    assert set(secret["stringData"]) == set(SECRET_ENV.values())


def test_values_reach_the_objects(helm_home: Path, tmp_path: Path) -> None:
    profiles = {
        "clusters": [
            {"name": "h100-pool", "kind": "kubernetes", "accelerator": "nvidia-h100-80gb",
             "gpu_memory_gib": 80, "gpus_per_node": 8, "namespace": "training"},
        ]
    }  # fmt: skip
    docs = render(
        helm_home,
        {
            "image": {"repository": "registry.example/zeropilot", "tag": "1.2.3"},
            "worker": {"replicas": 5},
            "api": {"replicas": 3, "service": {"type": "LoadBalancer"}},
            "clusterProfiles": profiles,
            "rbac": {"extraNamespaces": ["training"]},
            "persistence": {"size": "100Gi", "storageClass": "nfs"},
            "nodeSelector": {"pool": "services"},
        },
    )
    for component in (*SERVICES, "migrate"):
        assert container(docs, component)["image"] == "registry.example/zeropilot:1.2.3"
    assert find(docs, "Deployment", "zeropilot-worker")["spec"]["replicas"] == 5
    assert find(docs, "Deployment", "zeropilot-api")["spec"]["replicas"] == 3
    assert find(docs, "Service", "zeropilot-api")["spec"]["type"] == "LoadBalancer"
    claim = find(docs, "PersistentVolumeClaim", "zeropilot-data")["spec"]
    assert (claim["storageClassName"], claim["resources"]["requests"]["storage"]) == (
        "nfs",
        "100Gi",
    )
    assert pod_spec(docs, "Deployment", "zeropilot-worker")["nodeSelector"] == {"pool": "services"}
    clusters_yaml = find(docs, "ConfigMap", "zeropilot-clusters")["data"]["clusters.yaml"]
    loaded = load_profiles(clusters_yaml, tmp_path)
    assert loaded["h100-pool"].namespace == "training"
    assert loaded["h100-pool"].gpu_memory_gib == 80
    launcher = [d for d in docs if d["metadata"]["name"] == "zeropilot-worker-launches"]
    assert sorted(d["metadata"]["namespace"] for d in launcher) == ["training", "zeropilot"]
    assert all(d["subjects"][0]["namespace"] == "zeropilot" for d in launcher)


def test_default_cluster_profiles_load_with_the_service_loader(
    helm_home: Path, tmp_path: Path
) -> None:
    clusters_yaml = find(render(helm_home), "ConfigMap", "zeropilot-clusters")["data"]
    assert set(load_profiles(clusters_yaml["clusters.yaml"], tmp_path)) == {"local"}


def test_cluster_profiles_may_be_given_as_the_example_file(helm_home: Path, tmp_path: Path) -> None:
    example = (REPO / "deploy" / "clusters.example.yaml").read_text()
    docs = render(helm_home, {"clusterProfiles": example})
    clusters_yaml = find(docs, "ConfigMap", "zeropilot-clusters")["data"]["clusters.yaml"]
    profiles = load_profiles(clusters_yaml, tmp_path)
    assert {"local", "slurm-a100"} <= set(profiles)
    assert profiles["slurm-a100"].gpu_memory_gib == 80


def test_an_existing_secret_replaces_the_charts_own(helm_home: Path) -> None:
    result = template(helm_home, {"secret": {"existingSecret": "team-zeropilot"}})
    assert result.returncode == 0, result.stderr
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert not [d for d in docs if d["kind"] == "Secret"]
    for component in (*SERVICES, "migrate"):
        env = env_of(container(docs, component))
        for name in SECRET_ENV:
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "team-zeropilot"


@pytest.mark.parametrize("missing", ["secretKey", "databaseUrl", "brokerUrl"])
def test_rendering_without_a_secret_value_fails_naming_it(helm_home: Path, missing: str) -> None:
    values = {"secret": {k: v for k, v in SECRET_VALUES["secret"].items() if k != missing}}
    result = template(helm_home, values)
    assert result.returncode != 0
    assert f"secret.{missing} is required" in result.stderr
    assert "secret.existingSecret" in result.stderr


@pytest.mark.parametrize(
    ("changes", "where"),
    [
        ({"worker": {"replicas": -1}}, "/worker/replicas"),
        ({"worker": {"replicas": "many"}}, "/worker/replicas"),
        ({"worker": {"replica": 3}}, "/worker"),
        ({"api": {"service": {"type": "Ingress"}}}, "/api/service/type"),
        ({"secret": {"secretKey": "short"}}, "/secret/secretKey"),
        ({"persistence": {"size": "lots"}}, "/persistence/size"),
    ],
)
def test_bad_values_fail_through_the_schema(
    helm_home: Path, changes: dict[str, Any], where: str
) -> None:
    values = merge(SECRET_VALUES, changes)
    for command in (["template", "zeropilot", str(CHART)], ["lint", "--strict", str(CHART)]):
        result = helm_with_values(helm_home, command, values)
        assert result.returncode != 0, command
        output = result.stdout + result.stderr
        assert "don't meet the specifications of the schema" in output
        assert f"'{where}'" in output


def test_migration_is_a_hook_that_runs_after_its_secret_exists(helm_home: Path) -> None:
    docs = render(helm_home)
    job = find(docs, "Job", "zeropilot-migrate")["metadata"]["annotations"]
    secret = find(docs, "Secret", "zeropilot")["metadata"]["annotations"]
    for hook in (job, secret):
        assert hook["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(secret["helm.sh/hook-weight"]) < int(job["helm.sh/hook-weight"])
    # The Job's log holds the first admin token: it must outlive its success.
    assert "hook-succeeded" not in job["helm.sh/hook-delete-policy"]
    assert container(docs, "migrate")["command"] == ["zeropilot", "migrate"]
    disabled = render(helm_home, {"migration": {"enabled": False}})
    assert not [d for d in disabled if d["kind"] == "Job"]


def test_pods_run_as_non_root(helm_home: Path) -> None:
    docs = render(helm_home)
    for kind, name in [("Deployment", f"zeropilot-{c}") for c in SERVICES] + [
        ("Job", "zeropilot-migrate")
    ]:
        spec = pod_spec(docs, kind, name)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        assert spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


def test_names_derive_from_the_release_and_an_existing_claim_is_used(helm_home: Path) -> None:
    docs = render(helm_home, {"persistence": {"existingClaim": "shared-data"}}, release="team-a")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "team-a-zeropilot-api") in names
    assert ("RoleBinding", "team-a-zeropilot-worker-launches") in names
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    volumes = pod_spec(docs, "Deployment", "team-a-zeropilot-worker")["volumes"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "shared-data"}} in volumes
    env = env_of(pod_spec(docs, "Deployment", "team-a-zeropilot-api")["containers"][0])
    public_url = env["ZEROPILOT_API__PUBLIC_URL"]["value"]
    assert public_url == "http://team-a-zeropilot-api.zeropilot.svc:8321"


def test_notes_tell_how_to_get_the_admin_token_and_reach_the_api(helm_home: Path) -> None:
    command = ["install", "zeropilot", str(CHART), "--namespace", "zeropilot", "--dry-run=client"]
    result = helm_with_values(helm_home, command, SECRET_VALUES)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n zeropilot logs job/zeropilot-migrate" in notes
    assert "kubectl -n zeropilot port-forward svc/zeropilot-api 8321:8321" in notes
