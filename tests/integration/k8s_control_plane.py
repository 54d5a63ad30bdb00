"""A real Kubernetes control plane on loopback for tests: etcd, API server, controllers, scheduler.

``kube_control_plane`` (session scope) starts etcd, ``kube-apiserver``,
``kube-controller-manager`` (the Job controller, garbage collector, pod GC, namespace, service
account, resource quota, taint eviction and volume binder controllers) and ``kube-scheduler``
from the binaries named by ``KUBEBUILDER_ASSETS`` (as envtest finds them) and
``ZEROPILOT_KUBE_ASSETS`` (our variable for the controller manager and scheduler; default: the
same folder); etcd may also come from PATH. ``scripts/kube-binaries.sh`` unpacks them and
prints that folder. Every listener is on 127.0.0.1 at a free port, so several runs on one
machine do not meet. Two Node
objects advertise ``nvidia.com/gpu: 8``; no kubelet runs: ``k8s_kubelet.FakeKubelet`` plays its
part through the API. The processes end with the session (and die with the test run: they get
SIGKILL when it does).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.stack import free_port
from tests.integration.k8s_kubelet import FakeKubelet

ADMIN_TOKEN = "zeropilot-test-admin"
NODES = ("gpu-node-1", "gpu-node-2")
GPUS_PER_NODE = 8
CONTROLLERS = (
    "job-controller",
    "persistentvolume-binder-controller",  # binds the shared volume's claim (logs on it)
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "namespace-controller",
    "taint-eviction-controller",
    "node-lifecycle-controller",  # registers the pod index by node that taint eviction reads
    "resourcequota-controller",
    "endpointslice-controller",
    "root-ca-certificate-publisher-controller",
)
ADMISSION = (
    "NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,ResourceQuota,"
    "OwnerReferencesPermissionEnforcement,Priority,NodeRestriction"
)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    apiserver: Path
    controller_manager: Path
    scheduler: Path


def find_binaries() -> Binaries:
    """envtest's KUBEBUILDER_ASSETS for etcd and the API server, ZEROPILOT_KUBE_ASSETS (default:
    the same folder) for the controller manager and the scheduler."""
    envtest = os.environ.get("KUBEBUILDER_ASSETS")
    ours = os.environ.get("ZEROPILOT_KUBE_ASSETS") or envtest
    if not envtest or not ours:
        pytest.fail(
            "no Kubernetes binaries: run KUBEBUILDER_ASSETS=$(scripts/kube-binaries.sh) and export "
            "it (ZEROPILOT_KUBE_ASSETS defaults to it)"
        )
    etcd = Path(envtest) / "etcd"
    if not etcd.exists() and (found := shutil.which("etcd")):
        etcd = Path(found)
    binaries = Binaries(
        etcd,
        Path(envtest) / "kube-apiserver",
        Path(ours) / "kube-controller-manager",
        Path(ours) / "kube-scheduler",
    )
    missing = [str(path) for path in vars(binaries).values() if not os.access(path, os.X_OK)]
    if missing:
        pytest.fail(f"Kubernetes binaries missing or not executable: {', '.join(missing)}")
    return binaries


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """A CA, the API server's serving certificate (also the fake kubelet's), a client
    certificate for the API server's calls to kubelets, and the service-account key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *key, "-keyout", f"{folder}/ca.key", "-out", f"{folder}/ca.crt",
             "-days", "2", "-subj", "/CN=zeropilot-test-ca")  # fmt: skip
    for name, subject, extension in (
        ("serving", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", ""),
    ):
        _openssl("req", *key, "-keyout", f"{folder}/{name}.key", "-out", f"{folder}/{name}.csr",
                 "-subj", subject)  # fmt: skip
        extra = ["-extfile", f"{folder}/{name}.ext"] if extension else []
        if extension:
            (folder / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", f"{folder}/{name}.csr", "-CA", f"{folder}/ca.crt",
                 "-CAkey", f"{folder}/ca.key", "-CAcreateserial", "-days", "2",
                 "-out", f"{folder}/{name}.crt", *extra)  # fmt: skip
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{folder}/sa.key")
    _openssl("ec", "-in", f"{folder}/sa.key", "-pubout", "-out", f"{folder}/sa.pub")


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "test", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _die_with_the_test_run() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ControlPlane:
    """The processes, their folder, an admin client, and the fake kubelet of the two nodes."""

    def __init__(self, binaries: Binaries, folder: Path) -> None:
        self.binaries = binaries
        self.folder = folder
        self.certs = folder / "pki"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.kubeconfig = folder / "kubeconfig"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.api: httpx.Client | None = None
        self.kubelet: FakeKubelet | None = None
        self.startup_s = 0.0

    def start(self) -> None:
        began = time.monotonic()
        make_certificates(self.certs)
        write_kubeconfig(self.kubeconfig, self.url, self.certs / "ca.crt", ADMIN_TOKEN)
        (self.folder / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        etcd_url = self._start_etcd()
        self._spawn(
            "kube-apiserver", [str(self.binaries.apiserver), *self._apiserver_flags(etcd_url)]
        )
        self.api = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            verify=ssl.create_default_context(cafile=str(self.certs / "ca.crt")),
            timeout=30,
        )
        self._wait("kube-apiserver", lambda: self.api is not None and self._ok("/readyz"))
        self._spawn("kube-controller-manager", [str(self.binaries.controller_manager),
            f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--secure-port=0",
            f"--service-account-private-key-file={self.certs}/sa.key",
            f"--root-ca-file={self.certs}/ca.crt", f"--controllers={','.join(CONTROLLERS)}",
            "--concurrent-job-syncs=5",
            # No kubelet renews the Nodes' leases: they must not turn NotReady mid-session.
            "--node-monitor-grace-period=24h", "--node-startup-grace-period=24h",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [str(self.binaries.scheduler),
            f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--secure-port=0",
        ])  # fmt: skip
        self.kubelet = FakeKubelet(self.api, self.certs, NODES, GPUS_PER_NODE)
        self.kubelet.start()
        # The controllers are up once the default namespace's ServiceAccount exists.
        self._wait(
            "kube-controller-manager",
            lambda: self._ok("/api/v1/namespaces/default/serviceaccounts/default"),
        )
        self.startup_s = time.monotonic() - began

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()
        for process in reversed(list(self.processes.values())):  # etcd last
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.api is not None:
            self.api.close()

    def _start_etcd(self) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [str(self.binaries.etcd), f"--data-dir={self.folder}/etcd",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}", "--log-level=warn",
        ])  # fmt: skip
        return url

    def _apiserver_flags(self, etcd_url: str) -> list[str]:
        pki = self.certs
        return [
            f"--etcd-servers={etcd_url}", "--bind-address=127.0.0.1",
            f"--secure-port={self.port}", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={pki}/serving.crt", f"--tls-private-key-file={pki}/serving.key",
            f"--client-ca-file={pki}/ca.crt", f"--token-auth-file={self.folder}/tokens.csv",
            "--authorization-mode=Node,RBAC", f"--enable-admission-plugins={ADMISSION}",
            f"--service-account-key-file={pki}/sa.pub",
            f"--service-account-signing-key-file={pki}/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/12",
            f"--kubelet-client-certificate={pki}/kubelet-client.crt",
            f"--kubelet-client-key={pki}/kubelet-client.key",
            "--kubelet-preferred-address-types=InternalIP",
            f"--cert-dir={self.folder}/apiserver-certs",
        ]  # fmt: skip

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.folder / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_the_test_run
        )
        log.close()

    def _ok(self, path: str) -> bool:
        assert self.api is not None
        try:
            return self.api.get(path).status_code == 200
        except httpx.TransportError:
            return False

    def _wait(self, name: str, ready: Any, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process_name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{process_name} exited {process.returncode}:\n{self.log(process_name)}"
                    )
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready within {timeout_s} s:\n{self.log(name)}")

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-4000:]


@pytest.fixture(scope="session")
def kube_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(find_binaries(), tmp_path_factory.mktemp("kube-control-plane"))
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
