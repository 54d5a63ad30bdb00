"""A loopback stand-in for the Kubernetes API server, for what the real one cannot show here.

The backend's tests run against a real control plane (``k8s_control_plane.py``); this stand-in
remains for answers that control plane cannot give on demand: an admission webhook's denial,
429 and 500 to a create.

What it is: a real HTTP server on 127.0.0.1 (a random port, a thread) that the official
``kubernetes`` client reaches through a kubeconfig file, exactly as it would reach a cluster. It
answers the REST paths the backend uses (batch/v1 jobs; core/v1 services, configmaps, pods and
pods/log): create, get, list with a label selector, delete with a propagation policy. Like the
real server it checks the bearer token, validates every created object against the official
OpenAPI schema (``kubernetes_validate``, Kubernetes 1.35, strict) and the object names, answers
errors with ``Status`` objects (404 NotFound, 409 AlreadyExists, 422 Invalid, 415, 401), fills in
server metadata (uid, resourceVersion, creationTimestamp, namespace, a Job's selector and pod
labels), orphans a Job's pods when deleted without a propagation policy (batch/v1's default), and
cascades Background/Foreground deletes to the objects whose ownerReferences point at the deleted
one. An optional admission hook rejects creates the way a quota or a webhook would.

What it is not: a real API server. There is no scheduler, no kubelet, no containers, no Job
controller and no Kueue: the tests play those through Python methods on ``LoopbackApiServer``
(create an Indexed Job's pods, move them through Pending/Running/Succeeded/Failed, add
conditions, set logs). There is no TLS, RBAC, watch, patch/update, field selector, server-side
defaulting beyond the fields named above, or API-level validation beyond the schema and names
(e.g. a real server rejects some combinations the schema allows). Garbage collection and pod
termination are instant, where a real cluster takes seconds. Unknown fields are rejected (a real
server, under the default fieldValidation=Warn, would drop them with a warning): in our own
manifests an unknown field is a bug either way.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

SCHEMA_VERSION = "1.35"
TOKEN = "loopback-token"
JSON = dict[str, Any]

# resource → (kind, API group, apiVersion)
RESOURCES = {
    "jobs": ("Job", "batch", "batch/v1"),
    "services": ("Service", "", "v1"),
    "configmaps": ("ConfigMap", "", "v1"),
    "secrets": ("Secret", "", "v1"),
    "pods": ("Pod", "", "v1"),
}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>batch)/v1)/namespaces/(?P<namespace>[^/]+)/(?P<resource>[a-z]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
INDEX = "batch.kubernetes.io/job-completion-index"


class ApiError(Exception):
    """Answered as a ``Status`` object; admission hooks raise it to reject a create."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSON | None = None,
        headers: dict[str, str] | None = None,  # e.g. a 429's Retry-After
    ):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details
        self.headers = headers or {}

    def status(self) -> JSON:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details or {},
            "code": self.code,
        }


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Request:
    """One request as the server saw it (for tests that count calls)."""

    method: str
    path: str
    query: dict[str, str]


class LoopbackApiServer:
    """The store, the HTTP front and the test-only controller/kubelet controls."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._logs: dict[tuple[str, str], str] = {}
        self._lock = threading.RLock()
        self._versions = itertools.count(1000)
        self.requests: list[Request] = []
        # Called with (resource, object) before a create is stored; raise ApiError to reject it.
        self.admission: Callable[[str, JSON], None] | None = None
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "loopback", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": TOKEN}}],
            "contexts": [
                {
                    "name": "loopback",
                    "context": {"cluster": "loopback", "user": "tester", "namespace": namespace},
                }
            ],
            "current-context": "loopback",
        }
        path.write_text(json.dumps(kubeconfig))  # JSON is YAML
        return path

    # ---- the REST verbs (called by the HTTP handler) ----

    def create(self, resource: str, namespace: str, body: JSON) -> JSON:
        kind, group, api_version = RESOURCES[resource]
        if body.get("kind") != kind or body.get("apiVersion") != api_version:
            raise ApiError(400, "BadRequest", f"the body is not a {api_version} {kind}")
        metadata = body.setdefault("metadata", {})
        name = metadata.get("name") or ""
        if metadata.setdefault("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        self._validate(resource, body)
        with self._lock:
            if (resource, namespace, name) in self._objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{_qualified(resource)} "{name}" already exists',
                    {"name": name, "group": group, "kind": resource},
                )
            if self.admission is not None:
                self.admission(resource, body)
            stored = self._with_server_fields(resource, copy.deepcopy(body))
            self._objects[(resource, namespace, name)] = stored
            return copy.deepcopy(stored)

    def read(self, resource: str, namespace: str, name: str) -> JSON:
        with self._lock:
            found = self._objects.get((resource, namespace, name))
            if found is None:
                raise _not_found(resource, name)
            return copy.deepcopy(found)

    def list_objects(self, resource: str, namespace: str, selector: str = "") -> JSON:
        kind, _group, api_version = RESOURCES[resource]
        matches = _selector(selector)
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (res, ns, _name), obj in sorted(self._objects.items())
                if res == resource and ns == namespace and matches(obj)
            ]
            version = str(next(self._versions))
        return {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    def delete(self, resource: str, namespace: str, name: str, propagation: str | None) -> JSON:
        group = RESOURCES[resource][1]
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(422, "Invalid", f"unknown propagationPolicy {propagation!r}")
        if propagation is None:  # batch/v1 Jobs still default to orphaning their pods
            propagation = "Orphan" if resource == "jobs" else "Background"
        with self._lock:
            obj = self.read(resource, namespace, name)
            uid = obj["metadata"]["uid"]
            for dependent in self._dependents(uid):
                if propagation == "Orphan":
                    refs = dependent["metadata"]["ownerReferences"]
                    dependent["metadata"]["ownerReferences"] = [r for r in refs if r["uid"] != uid]
                else:
                    self._remove(dependent)
            stored = self._objects[(resource, namespace, name)]
            if stored["metadata"].get("finalizers"):  # someone else's finalizer holds it
                stored["metadata"].setdefault("deletionTimestamp", now())
                return copy.deepcopy(stored)
            self._remove(stored)
        details = {"name": name, "group": group, "kind": resource, "uid": uid}
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def read_log(self, namespace: str, name: str, container: str | None, tail: int | None) -> str:
        pod = self.read("pods", namespace, name)
        names = [c["name"] for c in pod["spec"]["containers"]]
        container = container or (names[0] if len(names) == 1 else "")
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        state = _container_status(pod, container).get("state") or {}
        if not ({"running", "terminated"} & state.keys()):
            waiting = (state.get("waiting") or {}).get("reason") or "ContainerCreating"
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: {waiting}',
            )
        text = self._logs.get((namespace, name), "")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:] if tail > 0 else [])
        return text

    # ---- test-only controls: the Job controller, the kubelet, Kueue ----

    def create_job_pods(self, namespace: str, job_name: str) -> list[str]:
        """What the Job controller does for an unsuspended Indexed Job: one pod per index."""
        job = self.read("jobs", namespace, job_name)
        spec = job["spec"]
        assert spec.get("completionMode") == "Indexed", "only Indexed Jobs are modelled"
        assert not spec.get("suspend"), "the Job controller creates no pods for a suspended Job"
        names = []
        for index in range(spec["completions"]):
            pod = self._pod_for_index(job, index)
            self._validate("pods", pod)
            with self._lock:
                stored = self._with_server_fields("pods", pod)
                self._objects[("pods", namespace, pod["metadata"]["name"])] = stored
            names.append(pod["metadata"]["name"])
        self._update("jobs", namespace, job_name, _job_started(len(names)))
        return names

    def unsuspend_job(self, namespace: str, job_name: str) -> None:
        """What Kueue does when the Job's workload is admitted."""
        self._update("jobs", namespace, job_name, lambda job: job["spec"].update(suspend=False))

    def set_pod_unschedulable(self, namespace: str, pod: str, message: str) -> None:
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now(),
        }
        self._update("pods", namespace, pod, _with_condition(condition))

    def set_pod_waiting(self, namespace: str, pod: str, reason: str, message: str = "") -> None:
        """Scheduled, its container not started (ContainerCreating, ImagePullBackOff, ...)."""
        state = {"waiting": {"reason": reason, "message": message}}
        self._update("pods", namespace, pod, _with_container_state("Pending", state, ready=False))

    def set_pod_running(self, namespace: str, pod: str) -> None:
        state = {"running": {"startedAt": now()}}
        self._update("pods", namespace, pod, _with_container_state("Running", state, ready=True))

    def set_pod_terminated(
        self, namespace: str, pod: str, exit_code: int, reason: str = "", message: str = ""
    ) -> None:
        """The container ended; with FallbackToLogsOnError the message defaults to the log tail."""
        terminated: JSON = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": now(),
            "finishedAt": now(),
        }
        if not message and exit_code != 0 and self._falls_back_to_logs(namespace, pod):
            lines = self._logs.get((namespace, pod), "").splitlines(keepends=True)[-80:]
            message = "".join(lines)[-2048:]  # the kubelet's limits: 80 lines, 2048 bytes
        if message:
            terminated["message"] = message
        phase = "Succeeded" if exit_code == 0 else "Failed"
        state = {"terminated": terminated}
        self._update("pods", namespace, pod, _with_container_state(phase, state, ready=False))

    def add_pod_condition(
        self, namespace: str, pod: str, kind: str, reason: str, message: str
    ) -> None:
        condition = {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now(),
        }
        self._update("pods", namespace, pod, _with_condition(condition))

    def set_job_condition(
        self, namespace: str, job: str, kind: str, reason: str, message: str
    ) -> None:
        condition = {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": now(),
            "lastTransitionTime": now(),
        }
        self._update("jobs", namespace, job, _with_condition(condition))

    def set_pod_log(self, namespace: str, pod: str, text: str) -> None:
        self.read("pods", namespace, pod)
        with self._lock:
            self._logs[(namespace, pod)] = text

    def add_finalizer(self, resource: str, namespace: str, name: str, finalizer: str) -> None:
        self._update(
            resource,
            namespace,
            name,
            lambda obj: obj["metadata"].setdefault("finalizers", []).append(finalizer),
        )

    def names(self, resource: str, namespace: str = "default") -> list[str]:
        with self._lock:
            return sorted(n for (r, ns, n) in self._objects if r == resource and ns == namespace)

    # ---- internals ----

    def _validate(self, resource: str, obj: JSON) -> None:
        kind = RESOURCES[resource][0]
        name = obj["metadata"].get("name") or ""
        pattern = _DNS_1035 if resource == "services" else _DNS_SUBDOMAIN
        limit = 63 if resource == "services" else 253
        problems = []
        if not pattern.match(name) or len(name) > limit:
            problems.append(f"metadata.name: Invalid value: {name!r}: must match {pattern.pattern}")
        if resource == "pods":
            hostname = obj["spec"].get("hostname")
            if hostname is not None and (not _DNS_LABEL.match(hostname) or len(hostname) > 63):
                problems.append(f"spec.hostname: Invalid value: {hostname!r}")
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(part) for part in exc.path) or "<object>"
            problems.append(f"{where}: {exc.message}")
        if problems:
            raise ApiError(
                422,
                "Invalid",
                f'{kind}{_group_suffix(resource)} "{name}" is invalid: {"; ".join(problems)}',
                {"name": name, "group": RESOURCES[resource][1], "kind": kind},
            )

    def _with_server_fields(self, resource: str, obj: JSON) -> JSON:
        metadata = obj["metadata"]
        metadata.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            creationTimestamp=now(),
        )
        if resource == "jobs":
            metadata["generation"] = 1
            uid, name = metadata["uid"], metadata["name"]
            controller = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
            obj["spec"].setdefault(
                "selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            )
            obj["spec"].setdefault("suspend", False)
            template_labels = (
                obj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
            )
            template_labels.update(
                controller, **{"batch.kubernetes.io/job-name": name, "job-name": name}
            )
            obj["status"] = {}
        elif resource == "services":
            obj["spec"].setdefault("type", "ClusterIP")
            obj["spec"].setdefault("clusterIPs", [obj["spec"].get("clusterIP", "10.96.0.10")])
            obj["status"] = {"loadBalancer": {}}
        return obj

    def _pod_for_index(self, job: JSON, index: int) -> JSON:
        name = job["metadata"]["name"]
        template = copy.deepcopy(job["spec"]["template"])
        metadata = template.get("metadata") or {}
        spec = template["spec"]
        spec["hostname"] = f"{name}-{index}"  # Indexed Jobs: stable hostnames
        for container in spec["containers"]:
            container.setdefault("env", []).append(
                {
                    "name": "JOB_COMPLETION_INDEX",
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}},
                }
            )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}-{secrets.token_hex(3)[:5]}",
                "namespace": job["metadata"]["namespace"],
                "labels": {**metadata.get("labels", {}), INDEX: str(index)},
                "annotations": {**metadata.get("annotations", {}), INDEX: str(index)},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        }

    def _falls_back_to_logs(self, namespace: str, pod: str) -> bool:
        containers: list[JSON] = self.read("pods", namespace, pod)["spec"]["containers"]
        return bool(containers[0].get("terminationMessagePolicy") == "FallbackToLogsOnError")

    def _update(
        self, resource: str, namespace: str, name: str, change: Callable[[JSON], Any]
    ) -> None:
        with self._lock:
            obj = self._objects.get((resource, namespace, name))
            if obj is None:
                raise _not_found(resource, name)
            change(obj)
            obj["metadata"]["resourceVersion"] = str(next(self._versions))

    def _dependents(self, uid: str) -> list[JSON]:
        return [
            obj
            for obj in self._objects.values()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def _remove(self, obj: JSON) -> None:
        for dependent in self._dependents(obj["metadata"]["uid"]):
            self._remove(dependent)
        resource = next(r for r, (kind, _g, _v) in RESOURCES.items() if kind == obj["kind"])
        key = (resource, obj["metadata"]["namespace"], obj["metadata"]["name"])
        self._objects.pop(key, None)
        if resource == "pods":
            self._logs.pop(key[1:], None)


@contextmanager
def loopback_api_server() -> Iterator[LoopbackApiServer]:
    server = LoopbackApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _handler_for(server: LoopbackApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the tests read server.requests instead

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.requests.append(Request(method, url.path, query))
            try:
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                answer = self._answer(method, url.path, query, body)
            except ApiError as exc:
                self._send(exc.code, exc.status(), headers=exc.headers)
                return
            if isinstance(answer, str):
                self._send(200, answer.encode(), "text/plain")
            else:
                self._send(201 if method == "POST" else 200, answer)

        def _answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> JSON | str:
            match = _PATH.match(path)
            if match is None or match["resource"] not in RESOURCES:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            resource, namespace, name = match["resource"], match["namespace"], match["name"]
            if (match["group"] or "") != RESOURCES[resource][1]:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if match["sub"] == "log" and resource == "pods" and method == "GET":
                tail = query.get("tailLines")
                return server.read_log(
                    namespace, name, query.get("container"), int(tail) if tail else None
                )
            if match["sub"] is not None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if method == "POST" and name is None:
                return server.create(resource, namespace, _json_body(self.headers, body))
            if method == "GET" and name is None:
                return server.list_objects(resource, namespace, query.get("labelSelector", ""))
            if method == "GET":
                return server.read(resource, namespace, name)
            if method == "DELETE" and name is not None:
                options = _json_body(self.headers, body) if body else {}
                policy = query.get("propagationPolicy") or options.get("propagationPolicy")
                return server.delete(resource, namespace, name, policy)
            raise ApiError(
                405, "MethodNotAllowed", f"{method} is not supported by this loopback server"
            )

        def _send(
            self,
            code: int,
            payload: JSON | bytes,
            content_type: str = "application/json",
            headers: dict[str, str] | None = None,
        ) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _json_body(headers: Any, body: bytes) -> JSON:
    content_type = (headers.get("Content-Type") or "application/json").split(";")[0].strip()
    if content_type != "application/json":  # no Content-Type: the server's default, JSON
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/json (got {content_type})",
        )
    try:
        loaded = json.loads(body)
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the body is not JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ApiError(400, "BadRequest", "the body is not a JSON object")
    return loaded


def _selector(text: str) -> Callable[[JSON], bool]:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma-joined."""
    terms = [t.strip() for t in text.split(",") if t.strip()]

    def matches(obj: JSON) -> bool:
        labels: dict[str, str] = obj["metadata"].get("labels") or {}
        return all(_term_matches(term, labels) for term in terms)

    return matches


def _term_matches(term: str, labels: dict[str, str]) -> bool:
    if "!=" in term:
        key, value = term.split("!=", 1)
        return labels.get(key) != value
    if "=" in term:
        key, value = term.replace("==", "=").split("=", 1)
        return labels.get(key) == value
    if term.startswith("!"):
        return term[1:] not in labels
    return term in labels


def _qualified(resource: str) -> str:
    group = RESOURCES[resource][1]
    return f"{resource}.{group}" if group else resource


def _group_suffix(resource: str) -> str:
    group = RESOURCES[resource][1]
    return f".{group}" if group else ""


def _not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(resource)} "{name}" not found',
        {"name": name, "group": RESOURCES[resource][1], "kind": resource},
    )


def _container_status(pod: JSON, container: str) -> JSON:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s["name"] == container), {})


def _with_condition(condition: JSON) -> Callable[[JSON], None]:
    def change(obj: JSON) -> None:
        status = obj.setdefault("status", {})
        others = [c for c in status.get("conditions", []) if c["type"] != condition["type"]]
        status["conditions"] = [*others, condition]

    return change


def _with_container_state(phase: str, state: JSON, ready: bool) -> Callable[[JSON], None]:
    def change(pod: JSON) -> None:
        status = pod.setdefault("status", {})
        status["phase"] = phase
        status.setdefault("startTime", now())
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}
        _with_condition(scheduled)(pod)
        _with_condition({"type": "Ready", "status": str(ready), "lastTransitionTime": now()})(pod)
        container = pod["spec"]["containers"][0]
        status["containerStatuses"] = [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": "running" in state,
                "state": state,
            }
        ]

    return change


def _job_started(pods: int) -> Callable[[JSON], None]:
    def change(job: JSON) -> None:
        job["status"].update(startTime=now(), active=pods)

    return change
