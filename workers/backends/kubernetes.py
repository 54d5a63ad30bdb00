"""The Kubernetes backend: per attempt an Indexed Job, a headless Service, a ConfigMap and a
Secret (the runtime token).

The reference is ``"<namespace>/<name>"``. ``submit`` creates the Job first, then the Secret,
the ConfigMap and the Service with the Job as their owner, so the garbage collector removes them
with it (the Job's pods wait for the volume they project to mount). A retried submit meets 409
AlreadyExists for what an earlier try created, adopts it when it carries this attempt's label,
and creates the rest.

``poll`` reads the Job's conditions and its pods: why a pod waits (queue, scheduler, image), how
each node's container ended (exit code, OOMKilled), whether a pod was disrupted (preemption,
eviction, node loss), and the failing pod's log tail for the classifier. A pod whose image can
never be pulled would be retried by the kubelet for ever while holding its node, so ``poll``
deletes that Job when it reports the launch error. ``poll_many`` reads the same from one LIST
of Jobs and one of Pods per namespace, by zeropilot's label, or (the profile's ``watch``, on by
default) from the worker's watched copies of them (``kubernetes_watch``), with no request at all
for the Jobs that go on as they were. ``cancel`` is the graceful stop: the running pods
deleted with the stop's grace, the Job kept until they have ended (``kubernetes_stop``).
Responses are read as plain JSON (the field names of the Kubernetes API reference), not as the
client's models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from service.core.clusters import ClusterProfile
from service.core.stopping import DEFAULT_GRACE_S
from workers.backends import kubernetes_watch
from workers.backends.base import (
    BackendState,
    BackendStatus,
    LaunchRequest,
    PermanentError,
    TemporaryError,
)
from workers.backends.calls import count_call
from workers.backends.kubernetes_events import failed_create
from workers.backends.kubernetes_gang import (
    Hold,
    held_while_refused,
    held_while_waiting,
    resumption,
    retry_at,
    retry_time,
    suspended_status,
    suspending_status,
    suspension,
)
from workers.backends.kubernetes_logs import node_log_on_volume
from workers.backends.kubernetes_quota import gpu_bound as quota_bound
from workers.backends.kubernetes_render import (
    ATTEMPT_LABEL,
    CONTAINER,
    JOB_NAME_LABEL,
    MANAGED_BY,
    checked_name,
    gpu_resource,
    namespace_of,
    render_config_map,
    render_job,
    render_secret,
    render_service,
)
from workers.backends.kubernetes_status import (
    Json,
    active_status,
    completions,
    deleted_before_ending,
    failed_status,
    launch_error,
    newest_by_index,
    node_exit_codes,
    pods_missing,
    still_tracked,
    terminated_state,
    true_conditions,
)
from workers.backends.kubernetes_stop import (
    needs_stopping,
    pod_ended,
    pod_running,
    stop_annotation,
    stop_is_overdue,
    stop_requested,
    stopped_status,
    stopping_status,
)

API_TIMEOUT_S = (5.0, 30.0)  # connect, read
POLL_TAIL_LINES = 80
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_RAW: dict[str, Any] = {"_preload_content": False, "_request_timeout": API_TIMEOUT_S}
_SUCCEEDED_CONDITIONS = frozenset({"Complete", "SuccessCriteriaMet"})
_ENDED_CONDITIONS = _SUCCEEDED_CONDITIONS | {"Failed", "FailureTarget"}
_MANAGED_SELECTOR = ",".join(f"{key}={value}" for key, value in MANAGED_BY.items())
_TEMPORARY_STATUS = frozenset({409, 429})  # a Conflict other than AlreadyExists: try again


class NotFoundError(PermanentError):
    """The API server does not know the object (404)."""


class AlreadyExistsError(PermanentError):
    """The object exists already (409 AlreadyExists): an earlier submit got this far."""


def submit(request: LaunchRequest) -> str:
    if request.profile.namespace is None and (own := _own_namespace()) is not None:
        # A worker inside a cluster launches next to itself, where its Role grants the rights.
        profile = request.profile.model_copy(update={"namespace": own})
        request = dataclasses.replace(request, profile=profile)
    namespace, name = namespace_of(request.profile), checked_name(request)
    job = render_job(request)  # before any call: a request that cannot run creates nothing
    try:
        ds_config = request.ds_config_path.read_text()
    except OSError as exc:
        raise PermanentError(f"cannot read the attempt's ds_config: {exc}") from exc
    batch, core = _apis(request.profile)
    created = _create_or_adopt(
        request,
        f"Job {namespace}/{name}",
        lambda: batch.create_namespaced_job(namespace, job, **_RAW),
        lambda: batch.read_namespaced_job(name, namespace, **_RAW),
    )
    uid = created["metadata"]["uid"]
    config_map = render_config_map(request, ds_config, uid)
    secret = render_secret(request, uid)
    service = render_service(request, uid)
    try:
        _create_or_adopt(
            request,
            f"Secret {namespace}/{name}",
            lambda: core.create_namespaced_secret(namespace, secret, **_RAW),
            lambda: core.read_namespaced_secret(name, namespace, **_RAW),
            owner_uid=uid,
        )
        _create_or_adopt(
            request,
            f"ConfigMap {namespace}/{name}",
            lambda: core.create_namespaced_config_map(namespace, config_map, **_RAW),
            lambda: core.read_namespaced_config_map(name, namespace, **_RAW),
            owner_uid=uid,
        )
        _create_or_adopt(
            request,
            f"Service {namespace}/{name}",
            lambda: core.create_namespaced_service(namespace, service, **_RAW),
            lambda: core.read_namespaced_service(name, namespace, **_RAW),
            owner_uid=uid,
        )
    except PermanentError:
        # A refused launch leaves nothing running: the Job goes, and with it what it owns.
        _delete(
            f"Job {namespace}/{name}", batch.delete_namespaced_job, name, namespace, "Foreground"
        )
        raise
    return encode_ref(namespace, name)


def poll(profile: ClusterProfile, ref: str) -> BackendStatus:
    namespace, name = decode_ref(ref)
    batch, core = _apis(profile)
    try:
        job = _json(
            _call(f"read Job {ref}", lambda: batch.read_namespaced_job(name, namespace, **_RAW))
        )
    except NotFoundError:
        return _deleted_outside(ref)
    return _job_status(batch, core, profile, job, _job_pods(core, namespace, name))


def poll_many(profile: ClusterProfile, refs: Sequence[str]) -> dict[str, BackendStatus]:
    """Every ref's status from one LIST of Jobs and one of Pods per namespace (by zeropilot's
    label); events, log tails and patches only for the Jobs that need them, as ``poll``."""
    batch, core = _apis(profile)
    by_namespace: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for ref in refs:
        with contextlib.suppress(PermanentError):  # not a Kubernetes ref: polled alone, refused
            by_namespace[decode_ref(ref)[0]].append((ref, decode_ref(ref)[1]))
    statuses: dict[str, BackendStatus] = {}
    for namespace, wanted in by_namespace.items():
        watched = _watched(profile, batch, core, namespace) if profile.watch else None
        listed_jobs, listed_pods = watched or (
            _managed(core, batch, namespace, "Jobs"),
            _managed(core, batch, namespace, "Pods"),
        )
        jobs = {j["metadata"]["name"]: j for j in listed_jobs}
        pods: dict[str, list[Json]] = defaultdict(list)
        for pod in listed_pods:
            pods[(pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")].append(pod)
        for ref, name in wanted:
            with contextlib.suppress(PermanentError, TemporaryError):  # left out: polled alone
                if watched is not None and _read_directly(jobs.get(name)):
                    statuses[ref] = poll(profile, ref)
                else:
                    statuses[ref] = _listed_status(batch, core, profile, ref, jobs.get(name), pods)
    return statuses


def _read_directly(copied: Json | None) -> bool:
    """A Job the watched copy lacks was created a moment ago or deleted: a GET tells which;
    one that ended is read with its pods as they are now (its pods' last events may trail)."""
    return copied is None or bool(true_conditions(copied).keys() & _ENDED_CONDITIONS)


def _watched(
    profile: ClusterProfile, batch: Any, core: Any, namespace: str
) -> tuple[list[Json], list[Json]] | None:
    """The namespace's Jobs and Pods from this process's watched copies; None while either
    watch is not connected."""
    where = (profile.kubeconfig, profile.kube_context, namespace)

    def feed(kind: str) -> kubernetes_watch.Feed:
        return kubernetes_watch.Feed(
            what=f"{kind} in {namespace}",
            list_all=lambda: _list_managed(core, batch, namespace, kind),
            open_watch=lambda version: _open_watch(core, batch, namespace, kind, version),
            kept=_read_of_job if kind == "Jobs" else _read_of_pod,
        )

    jobs = kubernetes_watch.watched_items((*where, "Jobs"), lambda: feed("Jobs"))
    pods = kubernetes_watch.watched_items((*where, "Pods"), lambda: feed("Pods"))
    return None if jobs is None or pods is None else (jobs, pods)


def _read_of_job(job: Json) -> Json:
    """What a pass reads of a Job that has not ended: not its pod template nor field managers,
    which it never reads."""
    spec = {k: v for k, v in (job.get("spec") or {}).items() if k != "template"}
    return {**job, "metadata": _without_managers(job), "spec": spec}


def _read_of_pod(pod: Json) -> Json:
    """What a pass reads of a pod: its metadata, its node and its status."""
    node = (pod.get("spec") or {}).get("nodeName")
    spec = {"nodeName": node} if node else {}
    return {**pod, "metadata": _without_managers(pod), "spec": spec}


def _without_managers(obj: Json) -> Json:
    return {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}


def _open_watch(core: Any, batch: Any, namespace: str, kind: str, version: str) -> Any:
    """A WATCH of zeropilot's Jobs or Pods from ``version``, its events as they come."""
    try:
        return _lister(core, batch, kind)(
            namespace,
            label_selector=_MANAGED_SELECTOR,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=kubernetes_watch.WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(API_TIMEOUT_S[0], kubernetes_watch.READ_TIMEOUT_S),
        )
    except ApiException as exc:
        if exc.status == 410:
            raise kubernetes_watch.Gone(str(exc.reason)) from exc
        raise


def _listed_status(
    batch: Any,
    core: Any,
    profile: ClusterProfile,
    ref: str,
    job: Json | None,
    pods: dict[str, list[Json]],
) -> BackendStatus:
    if job is None:
        return _deleted_outside(ref)
    return _job_status(batch, core, profile, job, pods.get(job["metadata"]["name"], []))


def _managed(core: Any, batch: Any, namespace: str, kind: str) -> list[Json]:
    """Every Job or Pod of zeropilot's in the namespace, in one request."""
    return list(_list_managed(core, batch, namespace, kind).get("items") or [])


def _list_managed(core: Any, batch: Any, namespace: str, kind: str) -> Json:
    """The LIST of zeropilot's Jobs or Pods: its items and the version it is current to."""
    lister = _lister(core, batch, kind)
    return _json(
        _call(
            f"list {kind} in {namespace}",
            lambda: lister(namespace, label_selector=_MANAGED_SELECTOR, **_RAW),
        )
    )


def _lister(core: Any, batch: Any, kind: str) -> Any:
    """The API call that lists, or with ``watch=True`` watches, Jobs or Pods."""
    return batch.list_namespaced_job if kind == "Jobs" else core.list_namespaced_pod


def _deleted_outside(ref: str) -> BackendStatus:
    reason = f"the Job {ref} no longer exists (deleted outside zeropilot)"
    return BackendStatus(BackendState.LOST, native_state="NotFound", reason=reason)


def _being_deleted() -> BackendStatus:
    """What the Job controller adds while the Job is deleted is the deletion's doing."""
    reason = "the Job is being deleted (cancelled, by zeropilot or on the cluster)"
    return BackendStatus(BackendState.CANCELLED, native_state="CANCELLED", reason=reason)


def _job_status(
    batch: Any, core: Any, profile: ClusterProfile, job: Json, every_pod: list[Json]
) -> BackendStatus:
    stop = stop_requested(job)
    if stop is None and deleted_before_ending(job):
        return _being_deleted()
    ended = _ended(core, job, every_pod)
    if stop is None:
        return ended or _not_ended(batch, core, profile, job, still_tracked(every_pod))
    deleting = bool(job["metadata"].get("deletionTimestamp"))
    if ended is None:
        return _being_deleted() if deleting else stopping_status(stop)
    if not deleting:  # zeropilot's stop has run its course: the objects go
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        _delete_attempt(batch, core, namespace, name)
    return stopped_status(ended, stop)


def _ended(core: Any, job: Json, every_pod: list[Json]) -> BackendStatus | None:
    """SUCCEEDED or FAILED, with each node's exit code and the telling pod's log tail."""
    pods = newest_by_index(every_pod)
    conditions = true_conditions(job)
    exit_codes = node_exit_codes(pods)
    namespace = job["metadata"]["namespace"]
    if conditions.keys() & _SUCCEEDED_CONDITIONS:
        tail = _log_tail(core, namespace, pods.get(0))
        return BackendStatus(
            BackendState.SUCCEEDED, 0, "Complete", log_tail=tail, node_exit_codes=exit_codes
        )
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    if failed is None:
        return None
    status, culprit = failed_status(failed, pods, exit_codes, job)
    status.log_tail = _log_tail(core, namespace, culprit)
    return status


def _not_ended(
    batch: Any, core: Any, profile: ClusterProfile, job: Json, every_pod: list[Json]
) -> BackendStatus:
    """Why the Job waits, or that it runs; a launch that can never start is ended here."""
    pods = newest_by_index(every_pod)
    cannot_start = launch_error(pods)
    events: list[Json] = []
    if cannot_start is None and pods_missing(job, pods):
        events = _job_events(core, job)
        cannot_start = failed_create(events, completions(job))
    if cannot_start is not None and cannot_start.state == BackendState.FAILED:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        _delete_attempt(batch, core, namespace, name)  # else its pods hold their nodes for ever
        return cannot_start
    return (
        _gang_step(batch, profile, job, pods, events)
        or cannot_start
        or active_status(profile, job, pods, every_pod)
    )


def _gang_step(
    batch: Any, profile: ClusterProfile, job: Json, pods: dict[int, Json], events: list[Json]
) -> BackendStatus | None:
    """Suspend a Job whose pods hold GPUs while another cannot be placed, or is refused by the
    quota; resume it when due."""
    timeout_s = profile.gang_timeout_s
    if profile.queue is not None or timeout_s is None:
        return None  # Kueue admits whole Jobs; or the profile lets the scheduler wait
    now = datetime.now(UTC)
    nodes = completions(job)
    due = retry_at(job)
    if due is not None and now < due:
        return suspended_status(job, now, due, timeout_s)
    if due is not None:
        _patch_job(batch, job, resumption())
        reason = f"trying again to place all {nodes} pods (after a gang timeout)"
        return BackendStatus(BackendState.PENDING, native_state="GangRetry", reason=reason)
    hold = held_while_refused(pods, events, nodes) or held_while_waiting(pods, nodes)
    if hold is None or (now - hold.since).total_seconds() < timeout_s:
        return None
    return _suspend(batch, job, hold, now, retry_time(now, timeout_s))


def _suspend(batch: Any, job: Json, hold: Hold, now: datetime, retry: datetime) -> BackendStatus:
    """Suspend the Job, its GPUs freed, until ``retry``."""
    try:
        _patch_job(batch, job, suspension(hold, now, retry))
    except PermanentError as exc:  # e.g. a Role without "patch" on jobs: say so, keep waiting
        reason = f"{hold.words(now)}; zeropilot could not suspend the Job: {exc}"
        return BackendStatus(BackendState.PENDING, native_state=hold.cause, reason=reason)
    return suspending_status(hold, now, retry)


def _patch_job(batch: Any, job: Json, patch: Json) -> None:
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    _call(
        f"patch Job {namespace}/{name}",
        lambda: batch.patch_namespaced_job(name, namespace, patch, **_RAW),
    )


def logs(profile: ClusterProfile, ref: str, tail_lines: int = 200) -> str:
    """Each node's log tail; with several nodes each under a ``==> pod <==`` header."""
    namespace, name = decode_ref(ref)
    _batch, core = _apis(profile)
    pods = newest_by_index(_job_pods(core, namespace, name))
    parts = []
    for index in sorted(pods):
        text, unavailable = _pod_log(core, namespace, pods[index], tail_lines)
        if unavailable:  # one node's kubelet down must not hide the others' logs
            text = f"(log unavailable: {unavailable})"
        header = [f"==> {pods[index]['metadata']['name']} <=="] if len(pods) > 1 else []
        parts.append("\n".join([*header, text.rstrip("\n")]))
    return "\n".join(parts)


def log_path(ref: str, request: LaunchRequest | None = None) -> str | None:
    """Node 0's log on the shared volume, where rank 0 prints; None when the pods cannot write
    there (their logs then live with the pods only: ``logs`` reads them through the API)."""
    node_log = node_log_on_volume(request) if request is not None else None
    return str(node_log).replace("{index}", "0") if node_log is not None else None


def dump_stacks(profile: ClusterProfile, ref: str) -> str:
    """Not yet: the ranks' stacks are collected on the local backend only."""
    return "no stacks asked for: not collected on Kubernetes yet"


def cancel(profile: ClusterProfile, ref: str, grace_s: float = DEFAULT_GRACE_S) -> None:
    """The graceful stop. Pods still running are deleted with ``grace_s`` as their grace
    (their kubelet sends SIGTERM now and SIGKILL once it has passed) and the Job is marked, so
    that ``poll`` says it is stopping, then reads how the pods ended and deletes the Job. A
    Job with nothing running, or whose stop outlasted its grace, is deleted at once
    (Foreground: its pods first, with their own grace; the collector takes what it owns).
    Sent again on every pass until the attempt has ended: a repeat changes nothing."""
    namespace, name = decode_ref(ref)
    batch, core = _apis(profile)
    try:
        job = _json(
            _call(f"read Job {ref}", lambda: batch.read_namespaced_job(name, namespace, **_RAW))
        )
    except NotFoundError:
        job = None
    live = [p for p in _job_pods(core, namespace, name) if not pod_ended(p)]
    stop = stop_requested(job) if job is not None else None
    nothing_to_save = stop is None and not any(pod_running(p) for p in live)
    if (
        job is None
        or job["metadata"].get("deletionTimestamp")
        or nothing_to_save
        or (stop is not None and (not live or stop_is_overdue(stop)))
    ):
        _delete_attempt(batch, core, namespace, name)
        return
    try:
        if stop is None:  # the first pass: the grace holds from here
            _patch_job(batch, job, {"metadata": {"annotations": stop_annotation(grace_s)}})
        for pod in live:
            if needs_stopping(pod, grace_s):
                _stop_pod(core, pod, grace_s)
    except PermanentError:  # a Role without "patch" on jobs or "delete" on pods: at once
        _delete_attempt(batch, core, namespace, name)


def _stop_pod(core: Any, pod: Json, grace_s: float) -> None:
    """Delete the pod with the stop's grace (the Job controller replaces no pod before it has
    failed, and it fails the Job at the first: ``backoffLimit: 0``)."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    with contextlib.suppress(NotFoundError):
        _call(
            f"delete pod {namespace}/{name}",
            lambda: core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=math.ceil(grace_s), **_RAW
            ),
        )


def gpu_bound(profile: ClusterProfile) -> tuple[int, str] | None:
    """The GPUs the namespace's quota lets zeropilot's pods ask for, and that quota in words;
    None when no quota limits them. Raises ``PermanentError`` where the worker may not read
    quotas (its Role lacks ``list`` on resourcequotas): then the profile's ``max_gpus`` says."""
    namespace = profile.namespace or _own_namespace() or namespace_of(profile)
    _batch, core = _apis(profile)
    listed = _json(
        _call(
            f"list ResourceQuotas of namespace {namespace}",
            lambda: core.list_namespaced_resource_quota(namespace, **_RAW),
        )
    )
    return quota_bound(listed.get("items") or [], gpu_resource(profile))


def _own_namespace() -> str | None:
    """The namespace of the pod this worker runs in, when it runs in one."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def encode_ref(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def decode_ref(ref: str) -> tuple[str, str]:
    namespace, sep, name = ref.partition("/")
    if not (sep and namespace and name) or "/" in name:
        raise PermanentError(f"not a Kubernetes backend reference: {ref!r}")
    return namespace, name


@functools.lru_cache(maxsize=16)
def api_client(kubeconfig: str | None, context: str | None) -> Any:
    """One ApiClient per way of reaching a cluster (several profiles may share one)."""
    loader: Any = kube_config  # its functions are untyped in some client versions
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            loader.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        path = os.path.expanduser(kubeconfig) if kubeconfig else None
        return loader.new_client_from_config(
            config_file=path, context=context, persist_config=False
        )
    except kube_config.ConfigException as exc:
        raise PermanentError(f"no usable Kubernetes client configuration: {exc}") from exc


def _apis(profile: ClusterProfile) -> tuple[Any, Any]:
    api = api_client(profile.kubeconfig, profile.kube_context)
    return client.BatchV1Api(api), client.CoreV1Api(api)


def _call(what: str, request: Callable[[], Any]) -> Any:
    """One API request, its errors translated: rejected → Permanent, unreachable → Temporary."""
    count_call("kubernetes")
    try:
        return request()
    except ApiException as exc:
        raise _translated(what, exc) from exc
    except urllib3.exceptions.HTTPError as exc:
        if isinstance(exc, urllib3.exceptions.SSLError) or isinstance(
            getattr(exc, "reason", None), urllib3.exceptions.SSLError
        ):  # a wrong CA or certificate: asking again gets the same answer
            raise PermanentError(f"{what}: TLS with the Kubernetes API failed ({exc})") from exc
        raise TemporaryError(f"{what}: the Kubernetes API did not answer ({exc})") from exc


def _translated(what: str, exc: ApiException) -> PermanentError | TemporaryError:
    status, reason, message = _status_of(exc)
    text = f"{what}: {message}"
    if status == 404:
        return NotFoundError(text)
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExistsError(text)
    if status in _TEMPORARY_STATUS or status >= 500 or status == 0:
        return TemporaryError(text, delay_s=_retry_after(exc))
    return PermanentError(text)  # 400, 401, 403, 422: asking again gets the same answer


def _status_of(exc: ApiException) -> tuple[int, str, str]:
    """Code, reason and message of the ``Status`` object the API server answers errors with."""
    status = int(exc.status or 0)
    try:
        body = json.loads(exc.body or "")
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return status, str(body.get("reason", "")), str(body.get("message") or exc.reason)
    return status, str(exc.reason or ""), f"HTTP {status} {exc.reason or ''}".strip()


def _retry_after(exc: ApiException) -> float:
    try:
        return max(1.0, float((exc.headers or {}).get("Retry-After", 10)))
    except (TypeError, ValueError):
        return 10.0


def _body(response: Any) -> bytes:
    """The raw response's body; its connection goes back to the pool."""
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def _json(response: Any) -> Json:
    body = _body(response)
    try:
        loaded = json.loads(body)
    except ValueError as exc:  # e.g. a proxy's HTML error page in front of the API server
        raise TemporaryError(f"the Kubernetes API answered {body[:200]!r}, not JSON") from exc
    if not isinstance(loaded, dict):
        raise TemporaryError(f"the Kubernetes API answered {str(loaded)[:200]!r}, not an object")
    return loaded


def _create_or_adopt(
    request: LaunchRequest,
    what: str,
    create: Callable[[], Any],
    read: Callable[[], Any],
    owner_uid: str | None = None,
) -> Json:
    try:
        return _json(_call(f"create {what}", create))
    except AlreadyExistsError:
        pass  # an earlier submit of this attempt (a worker killed mid-launch) got this far
    try:
        existing = _json(_call(f"read {what}", read))
    except NotFoundError as exc:
        raise TemporaryError(f"{what} existed and then vanished; submit again") from exc
    if (existing["metadata"].get("labels") or {}).get(ATTEMPT_LABEL) != request.name:
        raise PermanentError(f"{what} exists and was not created for attempt {request.name}")
    if existing["metadata"].get("deletionTimestamp") or stop_requested(existing):
        # Cancelled a moment ago: adopting it would follow a Job that is about to vanish.
        raise TemporaryError(f"{what} is being deleted; submit again once it is gone")
    owners = {ref.get("uid") for ref in existing["metadata"].get("ownerReferences") or []}
    if owner_uid is not None and owner_uid not in owners:
        # Left over from a Job of this name deleted since: the garbage collector removes it.
        raise TemporaryError(f"{what} belongs to an earlier Job of that name; submit again")
    return existing


def _delete_attempt(batch: Any, core: Any, namespace: str, name: str) -> None:
    """Delete the Job (its pods first: Foreground) and the objects it owns; gone is fine."""
    _delete(f"Job {namespace}/{name}", batch.delete_namespaced_job, name, namespace, "Foreground")
    for kind, delete in (
        ("Service", core.delete_namespaced_service),
        ("ConfigMap", core.delete_namespaced_config_map),
        ("Secret", core.delete_namespaced_secret),
    ):
        _delete(f"{kind} {namespace}/{name}", delete, name, namespace, "Background")


def _delete(what: str, delete: Any, name: str, namespace: str, propagation: str) -> None:
    with contextlib.suppress(NotFoundError):  # already gone: collected, or deleted before
        _call(
            f"delete {what}",
            lambda: delete(name, namespace, propagation_policy=propagation, **_RAW),
        )


def _job_pods(core: Any, namespace: str, name: str) -> list[Json]:
    """Every pod of the Job, replaced ones included."""
    listed = _json(
        _call(
            f"list pods of Job {namespace}/{name}",
            lambda: core.list_namespaced_pod(
                namespace, label_selector=f"{JOB_NAME_LABEL}={name}", **_RAW
            ),
        )
    )
    return list(listed.get("items") or [])


def _job_events(core: Any, job: Json) -> list[Json]:
    """The events about this Job (not a namesake before it): the Job controller's FailedCreate
    is the only place that says why it could not create a pod."""
    metadata = job["metadata"]
    selector = f"involvedObject.kind=Job,involvedObject.name={metadata['name']}"
    listed = _json(
        _call(
            f"list events of Job {metadata['namespace']}/{metadata['name']}",
            lambda: core.list_namespaced_event(
                metadata["namespace"], field_selector=selector, **_RAW
            ),
        )
    )
    items = listed.get("items") or []
    return [e for e in items if (e.get("involvedObject") or {}).get("uid") == metadata["uid"]]


def _log_tail(core: Any, namespace: str, pod: Json | None) -> str:
    """A pod's last lines: its log while the kubelet has it and answers, else its termination
    message (the status must never wait for a node's kubelet)."""
    if pod is None:
        return ""
    text, _unavailable = _pod_log(core, namespace, pod, POLL_TAIL_LINES)
    return text or str((terminated_state(pod) or {}).get("message") or "")


def _pod_log(core: Any, namespace: str, pod: Json, tail_lines: int) -> tuple[str, str]:
    """The log tail, and why it could not be read when the node's kubelet did not answer."""
    name = pod["metadata"]["name"]
    try:
        response = _call(
            f"read the log of pod {namespace}/{name}",
            lambda: core.read_namespaced_pod_log(
                name, namespace, container=CONTAINER, tail_lines=tail_lines, **_RAW
            ),
        )
    except PermanentError:  # the pod is gone, or its container has not started
        return "", ""
    except TemporaryError as exc:  # the API server answers 500 when the kubelet does not
        return "", str(exc)
    return _body(response).decode(errors="replace"), ""
