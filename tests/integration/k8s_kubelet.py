"""A simulated kubelet for the test control plane: what a node would write, played through the API.

No container runtime runs here. ``FakeKubelet`` registers Node objects that advertise GPUs
(Ready, untainted, their kubelet endpoint on a loopback port), serves container logs over HTTPS
on that port the way a kubelet does (the API server proxies ``pods/log`` there), and lets tests
move pods through Running to an exit code, as a kubelet would report them in ``pods/status``.

A pod's container can also run for real, as a process on this machine (``run_container`` in the
foreground, ``start_container`` in the background): the argv and environment the kubelet would
give it (``kubelet_view``), on top of this process's environment (the image's stand-in), with
what the test gives in the launcher's place (a trainer, or the launcher with this interpreter),
its output as the pod's log and its exit code (128 + the signal that ended it) as the
container's terminated state; when its main process ends, the rest of its group is killed.
What is simulated: the mounts (the projected ConfigMap and Secret are written to a folder of the
kubelet's, and their mount path is replaced by that folder in argv and environment; a claim's
hostPath volume is used where it lies), the container's isolation (a process group; no
namespaces, cgroups or image, no cluster DNS), and the runtime's stop (SIGTERM to the
container's main process, as a runtime signals PID 1; SIGKILL to its whole group once the pod's
``deletionGracePeriodSeconds`` have passed, exit 137; PID 1's immunity to signals it has no
handler for is not modelled).

In the background it finishes graceful deletions of pods on its nodes as a kubelet does: a pod
whose container runs for real is stopped as above, the others are reported stopped at once
(exit 143 after SIGTERM by default, ignoring the grace period); the stopped container and the
pod's terminal phase are reported first, and the pod deleted for good only after
``hold_stopped_s`` (a real kubelet tears down volumes and the sandbox in between, seconds on a
busy node; 0 by default).
Everything else (validation, quotas, the Job controller, scheduling, garbage collection) is the
real control plane's.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

Json = dict[str, Any]
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
CONTAINER = "trainer"
TERMINATION_MESSAGE_BYTES = 2048  # the kubelet's cap for FallbackToLogsOnError
SIGTERM_EXIT = 143
SIGKILL_EXIT = 137


@dataclass
class Container:
    """A pod's container running as a real process, and how the kubelet has stopped it."""

    namespace: str
    pod: str
    process: subprocess.Popen[bytes]
    term_sent_at: float | None = None  # monotonic: when the runtime sent SIGTERM
    killed_at: float | None = None  # when the grace had passed and it sent SIGKILL
    exit_code: int | None = None
    reported: threading.Event = field(default_factory=threading.Event)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def checked(response: httpx.Response) -> Json:
    if response.status_code >= 400:
        raise AssertionError(f"{response.request.method} {response.request.url}: {response.text}")
    result: Json = response.json()
    return result


class FakeKubelet:
    """Nodes, their log endpoint, and the status a kubelet would report for their pods."""

    def __init__(self, api: httpx.Client, certs: Path, nodes: tuple[str, ...], gpus: int) -> None:
        self.api = api
        self.nodes = nodes
        self.gpus = gpus
        self.logs: dict[tuple[str, str], str] = {}
        self.finish_deletions = True
        self.stop_exit_code = SIGTERM_EXIT  # how a stopped trainer ends (DeepSpeed's launch: 1)
        self.hold_stopped_s = 0.0  # how long a stopped pod stays Failed before its final delete
        self._stopped_at: dict[str, float] = {}  # pod uid → when its container was stopped
        self.containers: dict[str, Container] = {}  # pod uid → its container run for real
        self._volumes = Path(tempfile.mkdtemp(prefix="fake-kubelet-"))
        self._stopping = threading.Event()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certs / "serving.crt", certs / "serving.key")
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _log_handler(self))
        self._http.daemon_threads = True
        self._http.socket = context.wrap_socket(self._http.socket, server_side=True)
        self.port = int(self._http.server_address[1])
        self._threads = [
            threading.Thread(target=self._http.serve_forever, daemon=True),
            threading.Thread(target=self._finish_deletions_loop, daemon=True),
        ]

    def start(self) -> None:
        for node in self.nodes:
            self.register(node)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for container in self.containers.values():
            if container.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container.process.pid, signal.SIGKILL)
        shutil.rmtree(self._volumes, ignore_errors=True)
        self._http.shutdown()
        self._http.server_close()

    def register(self, node: str, port: int | None = None) -> None:
        """A Ready node with GPUs, reachable for logs at ``port`` (default: this kubelet's)."""
        existing = self.api.get(f"/api/v1/nodes/{node}")
        if existing.status_code == 404:
            checked(self.api.post("/api/v1/nodes", json={"metadata": {"name": node}}))
        # The not-ready taint is cleared by the node lifecycle controller, which has no kubelet
        # to hear from here.
        checked(self.api.patch(f"/api/v1/nodes/{node}", json={"spec": {"taints": None}},
                               headers=MERGE))  # fmt: skip
        capacity = {
            "cpu": "96",
            "memory": "1536Gi",
            "pods": "110",
            "nvidia.com/gpu": str(self.gpus),
        }
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": node}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port or self.port}},
        }  # fmt: skip
        checked(self.api.patch(f"/api/v1/nodes/{node}/status", json={"status": status},
                               headers=STRATEGIC))  # fmt: skip

    @contextlib.contextmanager
    def unreachable(self, node: str) -> Iterator[None]:
        """The node's kubelet stops answering (its endpoint moves to a closed port)."""
        with socket_closed_port() as port:
            self.register(node, port)
            try:
                yield
            finally:
                self.register(node)

    # ---- pods ----

    def pods(self, namespace: str, job: str) -> list[Json]:
        listed = checked(
            self.api.get(f"/api/v1/namespaces/{namespace}/pods",
                         params={"labelSelector": f"job-name={job}"})
        )  # fmt: skip
        items: list[Json] = listed["items"]
        return sorted(items, key=lambda p: int(p["metadata"]["labels"].get(INDEX_LABEL, 0)))

    def wait_for_pods(
        self, namespace: str, job: str, count: int, scheduled: int | None = None,
        timeout_s: float = 30,
    ) -> list[str]:  # fmt: skip
        """Names of the Job's live pods in index order, once ``count`` exist and ``scheduled``
        (default: all) of them are bound to a node by the scheduler."""
        want = count if scheduled is None else scheduled
        deadline = time.monotonic() + timeout_s
        while True:
            pods = [
                p for p in self.pods(namespace, job) if not p["metadata"].get("deletionTimestamp")
            ]
            bound = [p for p in pods if p["spec"].get("nodeName")]
            if len(pods) >= count and len(bound) >= want:
                return [p["metadata"]["name"] for p in pods]
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(pods)} pods of Job {job}, {len(bound)} bound: {pods}")
            time.sleep(0.1)

    def pod(self, namespace: str, name: str) -> Json:
        return checked(self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}"))

    def run(self, namespace: str, *names: str) -> None:
        """Containers started: phase Running, ready."""
        for name in names:
            pod = self.pod(namespace, name)
            state = {"running": {"startedAt": now()}}
            self._patch_status(namespace, pod, "Running", state, ready=True)

    def exit(
        self, namespace: str, name: str, code: int, reason: str | None = None, message: str = ""
    ) -> None:
        """The trainer container ended with ``code``; the pod is Succeeded or Failed."""
        pod = self.pod(namespace, name)
        if code != 0 and not message:  # terminationMessagePolicy: FallbackToLogsOnError
            tail = "\n".join(self.logs.get((namespace, name), "").splitlines()[-80:])
            message = tail[-TERMINATION_MESSAGE_BYTES:]
        terminated = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": now(),
            "finishedAt": now(),
            **({"message": message} if message else {}),
        }
        phase = "Succeeded" if code == 0 else "Failed"
        self._patch_status(namespace, pod, phase, {"terminated": terminated}, ready=False)

    def run_container(self, namespace: str, name: str, trainer: list[str]) -> int:
        """Run what the pod's container would, with ``trainer`` in place of the launcher: the
        wrapper zeropilot puts in front of the launcher (its argv up to the launcher's
        ``python3 -m``) runs for real, with this interpreter as the image's ``python3``. Its
        output becomes the pod's log and its exit code the container's; returns the code."""
        argv, _env = kubelet_view(self.pod(namespace, name))
        done = subprocess.run([*_wrapper(argv), *trainer], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        self.set_log(namespace, name, done.stdout)
        self.exit(namespace, name, done.returncode)
        return done.returncode

    def start_container(
        self, namespace: str, name: str, trainer: list[str], env: Mapping[str, str] | None = None
    ) -> Container:
        """As ``run_container``, in the background and with the pod's environment and mounts
        (``env``: more variables, e.g. a rank's when ``trainer`` is one); the pod turns Running,
        its log grows as the process prints, and its exit is reported when it comes. A
        graceful deletion of the pod stops it (SIGTERM, the grace, SIGKILL)."""
        pod = self.pod(namespace, name)
        argv, pod_env = kubelet_view(pod)
        mounts = self._mounts(pod)
        command = [_remapped(word, mounts) for word in [*_wrapper(argv), *trainer]]
        environment = {
            **os.environ,
            **{key: _remapped(value, mounts) for key, value in pod_env.items()},
            **(env or {}),
        }
        working_dir = pod["spec"]["containers"][0].get("workingDir")
        process = subprocess.Popen(
            command,
            cwd=working_dir if working_dir and Path(working_dir).is_dir() else None,
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the container: one group the runtime can kill whole
        )
        container = Container(namespace, name, process)
        self.containers[pod["metadata"]["uid"]] = container
        self.run(namespace, name)
        threading.Thread(target=self._follow, args=(container,), daemon=True).start()
        return container

    def _follow(self, container: Container) -> None:
        """The container's output into its log, then its exit code into the pod's status."""
        key = (container.namespace, container.pod)
        assert container.process.stdout is not None
        self.logs.setdefault(key, "")
        for line in iter(container.process.stdout.readline, b""):
            self.logs[key] += line.decode(errors="replace")
        code = container.process.wait()
        container.exit_code = 128 - code if code < 0 else code
        with contextlib.suppress(ProcessLookupError):  # its main process gone, the rest go too
            os.killpg(container.process.pid, signal.SIGKILL)
        with contextlib.suppress(httpx.HTTPError, AssertionError):  # the pod may be gone
            self.exit(container.namespace, container.pod, container.exit_code)
        container.reported.set()

    def _mounts(self, pod: Json) -> dict[str, str]:
        """Mount path → where its files lie here: projected ConfigMaps and Secrets written to a
        folder of the kubelet's, a claim's hostPath volume where it is."""
        namespace, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        mounts: dict[str, str] = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if mount["name"].startswith("kube-api-access-"):
                continue  # the service account's token volume: not modelled
            if "projected" in volume:
                folder = self._volumes / uid / mount["name"]
                folder.mkdir(parents=True, exist_ok=True)
                for source in volume["projected"]["sources"]:
                    for key, data in self._source_files(namespace, source).items():
                        (folder / key).write_bytes(data)
                mounts[mount["mountPath"]] = str(folder)
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                bound = checked(self.api.get(
                    f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}"
                ))["spec"]["volumeName"]  # fmt: skip
                host = checked(self.api.get(f"/api/v1/persistentvolumes/{bound}"))
                mounts[mount["mountPath"]] = host["spec"]["hostPath"]["path"]
        return {path: here for path, here in mounts.items() if path != here}

    def _source_files(self, namespace: str, source: Json) -> dict[str, bytes]:
        """A projected ConfigMap's or Secret's files."""
        kind = next((k for k in ("configMap", "secret") if k in source), None)
        if kind is None:
            return {}  # a service account token, the downward API: not modelled
        resource = "configmaps" if kind == "configMap" else "secrets"
        path = f"/api/v1/namespaces/{namespace}/{resource}/{source[kind]['name']}"
        data = checked(self.api.get(path)).get("data") or {}
        if kind == "secret":
            return {key: base64.b64decode(value) for key, value in data.items()}
        return {key: value.encode() for key, value in data.items()}

    def wait_for_image(self, namespace: str, name: str, reason: str, message: str) -> None:
        """The container cannot start: waiting with ``reason`` (e.g. ImagePullBackOff)."""
        pod = self.pod(namespace, name)
        waiting = {"waiting": {"reason": reason, "message": message}}
        self._patch_status(namespace, pod, "Pending", waiting, ready=False)

    def set_log(self, namespace: str, name: str, text: str) -> None:
        self.logs[(namespace, name)] = text

    def _patch_status(
        self, namespace: str, pod: Json, phase: str, state: Json, ready: bool
    ) -> None:
        container = pod["spec"]["containers"][0]
        flag = "True" if ready else "False"
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "10.244.0.10",
            "startTime": pod["status"].get("startTime") or now(),
            "conditions": [
                {"type": kind, "status": flag, "lastTransitionTime": now()}
                for kind in ("Ready", "ContainersReady")
            ],
            "containerStatuses": [{
                "name": container["name"], "image": container["image"], "imageID": "",
                "ready": ready, "restartCount": 0, "started": "running" in state,
                "state": state,
            }],
        }  # fmt: skip
        name = pod["metadata"]["name"]
        checked(self.api.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                               json={"status": status}, headers=STRATEGIC))  # fmt: skip

    def _finish_deletions_loop(self) -> None:
        while not self._stopping.wait(0.2):
            if self.finish_deletions:
                with contextlib.suppress(httpx.HTTPError, AssertionError):
                    self._finish_deletions()

    def _finish_deletions(self) -> None:
        for pod in checked(self.api.get("/api/v1/pods"))["items"]:
            metadata = pod["metadata"]
            if (
                not metadata.get("deletionTimestamp")
                or pod["spec"].get("nodeName") not in self.nodes
            ):
                continue
            namespace, name = metadata["namespace"], metadata["name"]
            container = self.containers.get(metadata["uid"])
            if container is not None and not container.reported.is_set():
                self._stop(container, float(metadata.get("deletionGracePeriodSeconds") or 0))
                continue  # its exit is reported when the process has ended
            if container is None and pod["status"].get("phase") not in ("Succeeded", "Failed"):
                self.exit(namespace, name, self.stop_exit_code, message="stopped by the kubelet")
            stopped_at = self._stopped_at.setdefault(metadata["uid"], time.monotonic())
            if time.monotonic() - stopped_at < self.hold_stopped_s:
                continue  # the terminal status is out; volumes and sandbox still going
            self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}",
                            params={"gracePeriodSeconds": 0})  # fmt: skip
            self._stopped_at.pop(metadata["uid"], None)

    def _stop(self, container: Container, grace_s: float) -> None:
        """The runtime's stop: SIGTERM to the main process, SIGKILL to all once the grace (as
        the pod's deletion says it now, a later delete may shorten it) has passed."""
        now = time.monotonic()
        if container.term_sent_at is None:
            container.term_sent_at = now
            with contextlib.suppress(ProcessLookupError):
                container.process.send_signal(signal.SIGTERM)
        if container.killed_at is None and now - container.term_sent_at >= grace_s:
            container.killed_at = now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(container.process.pid, signal.SIGKILL)


def _wrapper(argv: list[str]) -> list[str]:
    """What zeropilot runs in front of the launcher (its argv up to ``python3 -m``), with this
    interpreter as the image's ``python3``; empty when the launcher is the command."""
    launcher_at = argv.index("-m") - 1  # "python3 -m deepspeed.launcher.launch ..."
    return [sys.executable, *argv[1:launcher_at]] if launcher_at > 0 else []


def _remapped(word: str, mounts: Mapping[str, str]) -> str:
    for path, here in mounts.items():
        if word == path or word.startswith(path + "/"):
            return here + word[len(path) :]
    return word


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening, for as long as needed)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield int(holder.getsockname()[1])


def _log_handler(kubelet: FakeKubelet) -> type[BaseHTTPRequestHandler]:
    class LogHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404)
                return
            text = kubelet.logs.get((parts[1], parts[2]), "")
            tail = parse_qs(url.query).get("tailLines")
            if tail:
                text = "".join(text.splitlines(keepends=True)[-int(tail[0]) :])
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return LogHandler


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` in command, args and env values, rule by rule as in
    k8s.io/kubernetes third_party/forked/golang/expansion: ``$$`` is a literal ``$``;
    ``$(NAME)`` is NAME's value, or stays as written when NAME is not defined; an unclosed
    ``$(`` and a ``$`` before any other character stay as written."""
    out, cursor = [], 0
    while cursor < len(text):
        if text[cursor] != "$" or cursor + 1 == len(text):
            out.append(text[cursor])
            cursor += 1
            continue
        following = text[cursor + 1]
        close = text.find(")", cursor + 2) if following == "(" else -1
        if following == "$":
            out.append("$")
        elif close != -1:
            name = text[cursor + 2 : close]
            out.append(env.get(name, f"$({name})"))
            cursor = close + 1
            continue
        else:
            out.append("$" + following)
        cursor += 2
    return "".join(out)


def kubelet_view(pod: Json) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the kubelet would start the pod's first container with: env
    entries in order (a later entry of a name replaces an earlier one), each expanded against
    the ones before it, then the command against all; fieldRefs read the pod's metadata."""
    container = pod["spec"]["containers"][0]
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path)
            assert key is not None, f"only annotation and label fieldRefs are modelled, not {path}"
            env[entry["name"]] = pod["metadata"][key[1]][key[2]]
        else:
            env[entry["name"]] = expand_references(entry.get("value", ""), env)
    argv = [expand_references(word, env) for word in container["command"]]
    return argv + [expand_references(word, env) for word in container.get("args", [])], env
