"""Inputs past what a column, a recursion or a loop can take get a 422 naming the field, on
SQLite and PostgreSQL, and nothing is stored; a lost database answers 503 with Retry-After.

Each case below gave a 500 (or never returned) before its limit existed (issue 11).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.security import attempt_token
from service.settings import AuthSettings, DatabaseSettings, Settings
from tests.e2e.stack import free_port
from tests.integration.helpers import REPO, auth, tiny_spec
from zeropilot.up import SHUTDOWN_GRACE_S

INF, NAN = float("inf"), float("nan")  # sent as the Infinity and NaN that Python's json writes


def post(client: TestClient, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """POST a body that may hold NaN or Infinity (httpx's json= refuses them; clients do not)."""
    typed = {**headers, "Content-Type": "application/json"}
    return client.post(url, content=json.dumps(body), headers=typed)


def nested(depth: int) -> dict[str, Any]:
    document: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        document = {"deeper": document}
    return document


def training(**changes: Any) -> dict[str, Any]:
    return {"training": {"sequence_length": 32, "global_batch_size": 8, **changes}}


def model(**changes: Any) -> dict[str, Any]:
    shape = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 128}
    return {"model": {**shape, **changes}}


DEEP_LLAMA = {"model_type": "llama", "num_hidden_layers": 10**7}
SPEC_CASES = [
    (training(learning_rate=INF), "training.learning_rate"),
    (training(gradient_clipping=NAN), "training.gradient_clipping"),
    (training(global_batch_size=10**30), "training.global_batch_size"),
    (training(global_batch_size=4 * 10**7), "training.global_batch_size"),
    (model(num_layers=10**7), "model.num_layers"),
    ({"model": {"parameters": 10**30}}, "model.parameters"),
    (
        {"model": {"hf_config": {"model_type": "llama", "num_hidden_layers": 10**7}}},
        "model.hf_config",
    ),
    ({"zero": {"overrides": nested(800)}}, "zero.overrides"),
    ({"zero": {"overrides": {"reduce_bucket_size": NAN}}}, "zero.overrides"),
    ({"entrypoint": "train\x00.py"}, "entrypoint"),
    ({"env": {"BIG": "x" * 1_000_000}}, "env.BIG"),
    ({"working_dir": "/data/\x00"}, "working_dir"),
]


@pytest.mark.parametrize(("change", "field"), SPEC_CASES)
def test_a_spec_past_the_limits_is_refused_naming_the_field(
    client: TestClient, tokens: dict[str, str], change: dict[str, Any], field: str
) -> None:
    response = post(client, "/v1/jobs", tiny_spec(**change), auth(tokens["alice"]))

    assert response.status_code == 422, response.text
    assert len(response.content) < 20_000  # the refused input is not echoed whole
    fields = {".".join(str(p) for p in e["loc"][1:]) for e in response.json()["detail"]}
    assert any(f.startswith(field) for f in fields), fields
    listing = client.get("/v1/jobs", headers=auth(tokens["alice"])).json()
    assert listing["count"] == 0  # nothing stored


REPORT_CASES = [
    ("metrics", {"step": 2**31}, "step"),
    ("metrics", {"step": 1, "memory_peak_bytes": 2**63}, "memory_peak_bytes"),
    ("metrics", {"step": 1, "loss": NAN}, "loss"),
    ("metrics", {"step": 1, "extra": {"grad_norm": INF}}, "extra"),
    ("checkpoints", {"step": 2**31, "path": "/ckpt/a"}, "step"),
    ("checkpoints", {"step": 1, "path": "/ckpt/\x00"}, "path"),
    ("failure", {"failure_class": "OOM_GPU", "message": "out of\x00memory"}, "message"),
    ("failure", {"failure_class": "OOM_GPU", "evidence": {"tried": 2**64}}, "evidence"),
    ("device", {"rank": 0, "device_free_bytes": 2**63, "device_total_bytes": 1}, "device_free"),
]


@pytest.mark.parametrize(("kind", "report", "field"), REPORT_CASES)
def test_a_runtime_report_past_the_limits_is_refused_naming_the_field(
    client: TestClient,
    tokens: dict[str, str],
    settings: Settings,
    kind: str,
    report: dict[str, Any],
    field: str,
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    token = auth(attempt_token(settings.secret_key(), attempt_id))

    response = post(client, f"/v1/runtime/attempts/{attempt_id}/{kind}", report, token)

    assert response.status_code == 422, response.text
    assert any(field in str(e["loc"]) for e in response.json()["detail"]), response.text
    detail = client.get(f"/v1/jobs/{job['id']}", headers=auth(tokens["alice"])).json()
    assert detail["metrics"] == [] and detail["checkpoints"] == []


@pytest.mark.parametrize(
    "url",
    ["/v1/jobs?offset=2147483648", "/v1/jobs?limit=501", "/v1/jobs/x/metrics?after_id=2147483648"],
)
def test_query_numbers_past_the_columns_are_refused(
    client: TestClient, tokens: dict[str, str], url: str
) -> None:
    assert client.get(url, headers=auth(tokens["alice"])).status_code == 422


def test_a_quota_past_the_column_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.patch(
        "/v1/teams/vision", json={"gpu_quota": 2**31}, headers=auth(tokens["root"])
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-1] == "gpu_quota"


def test_a_lost_database_answers_503_with_retry_after(tmp_path: Path) -> None:
    # Nothing listens on port 1: every connection is refused, as when PostgreSQL is down.
    settings = Settings(
        data_dir=tmp_path,
        db=DatabaseSettings(url="postgresql+psycopg://postgres@127.0.0.1:1/zeropilot"),
        auth=AuthSettings(secret_key="test-secret-key"),
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        response = client.get("/v1/jobs", headers=auth("zp_anything"))

    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "5"
    assert "database is unavailable" in response.json()["detail"]


def test_a_lone_surrogate_is_refused_naming_the_field_and_a_pair_is_kept(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """Python's json writes (and reads) a lone surrogate as an escape; it is not Unicode, and
    each one gave a 500 (in the error echo, in PostgreSQL). An escaped emoji is a valid pair."""
    headers = {**auth(tokens["alice"]), "Content-Type": "application/json"}
    cases = [(tiny_spec("\ud800"), ["name"]), (tiny_spec(env={"K": "x\udfff"}), ["env", "K"])]
    for spec, field in cases:
        body = json.dumps(spec).encode()
        cut = body.index(b"\\u") + 3  # an escape split across two chunks, as a network may
        for content in (body, iter([body[:cut], body[cut:]])):
            response = client.post("/v1/jobs", content=content, headers=headers)
            assert response.status_code == 422, response.text
            assert response.json()["detail"][0]["loc"] == ["body", *field]
            assert "lone UTF-16 surrogate" in response.json()["detail"][0]["msg"]
    assert client.get("/v1/jobs", headers=headers).json()["count"] == 0

    kept = client.post("/v1/jobs", json=tiny_spec(env={"K": "\U0001f600 \\ud800"}), headers=headers)
    assert kept.status_code == 201, kept.text
    assert kept.json()["spec"]["env"]["K"] == "\U0001f600 \\ud800"


@pytest.mark.parametrize(
    "method,url,where",
    [
        ("GET", "/v1/jobs/%00", "path"),
        ("GET", "/v1/jobs?team=%00", "query"),
        ("PATCH", "/v1/teams/%00", "path"),
        ("GET", "/v1/jobs/a%00b/logs", "path"),
    ],
)
def test_a_nul_in_the_url_is_refused_naming_it(
    client: TestClient, tokens: dict[str, str], method: str, url: str, where: str
) -> None:
    """PostgreSQL text cannot hold a NUL: each of these gave a 500 from the lookup."""
    body = {"gpu_quota": 1} if method == "PATCH" else None
    response = client.request(method, url, json=body, headers=auth(tokens["root"]))
    assert response.status_code == 400, response.text
    assert response.json()["detail"] == f"the URL's {where} holds a NUL character (%00)"


def test_an_idempotency_key_must_be_printable_ascii(
    client: TestClient, tokens: dict[str, str]
) -> None:
    headers = {**auth(tokens["alice"]), "Idempotency-Key": "key\x00one"}
    response = client.post("/v1/jobs", json=tiny_spec(), headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    assert client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["count"] == 0


def big_spec() -> bytes:
    """A spec whose args make the body 1.5 MiB, over the default limit of 1 MiB."""
    return json.dumps(tiny_spec(args=["x" * 4000] * 400)).encode()


def test_a_body_over_the_limit_is_refused_with_413_naming_it(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.post("/v1/jobs", content=big_spec(), headers=auth(tokens["alice"]))

    assert response.status_code == 413
    assert response.json()["detail"] == (
        "the request body is over the limit of 1048576 bytes (1.00 MiB, "
        "setting api.max_request_bytes)"
    )
    assert client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["count"] == 0


def test_a_chunked_body_over_the_limit_is_cut_off_with_413(
    client: TestClient, tokens: dict[str, str]
) -> None:
    body = big_spec()
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))  # no Content-Length

    response = client.post("/v1/jobs", content=chunks, headers=auth(tokens["alice"]))

    assert response.status_code == 413
    assert "api.max_request_bytes" in response.json()["detail"]
    assert client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["count"] == 0


def test_a_request_past_the_deadline_gets_504_naming_it(settings: Settings) -> None:
    settings.api.request_deadline_s = 0.2
    app = create_app(settings)

    async def stuck() -> None:  # stands in for any handler that does not return in time
        await asyncio.sleep(30)

    app.add_api_route("/stuck", stuck)
    with TestClient(app) as client:
        response = client.get("/stuck")

    assert response.status_code == 504
    assert response.json()["detail"] == (
        "the request ran past its deadline of 0.2 s (setting api.request_deadline_s)"
    )


def test_metrics_come_in_pages(
    client: TestClient, tokens: dict[str, str], settings: Settings
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    token = auth(attempt_token(settings.secret_key(), attempt_id))
    for step in (1, 2, 3):
        client.post(
            f"/v1/runtime/attempts/{attempt_id}/metrics", json={"step": step}, headers=token
        )
    url, user = f"/v1/jobs/{job['id']}/metrics", auth(tokens["alice"])

    first = client.get(url, params={"limit": 2}, headers=user).json()
    rest = client.get(url, params={"after_id": first[-1]["id"]}, headers=user).json()

    assert [p["step"] for p in first] == [1, 2] and [p["step"] for p in rest] == [3]
    assert client.get(url, params={"limit": 10_001}, headers=user).status_code == 422


def test_checkpoints_come_in_pages(
    client: TestClient, tokens: dict[str, str], settings: Settings
) -> None:
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()
    attempt_id = job["attempts"][0]["id"]
    token = auth(attempt_token(settings.secret_key(), attempt_id))
    folder = settings.data_dir / "jobs" / job["id"] / "checkpoints"
    for step in (10, 20, 30):
        report = {"step": step, "path": f"{folder}/global_step{step}"}
        client.post(f"/v1/runtime/attempts/{attempt_id}/checkpoints", json=report, headers=token)
    url, user = f"/v1/jobs/{job['id']}/checkpoints", auth(tokens["alice"])

    first = client.get(url, params={"limit": 2}, headers=user).json()
    rest = client.get(url, params={"after_id": first[-1]["id"]}, headers=user).json()

    assert [c["step"] for c in first] == [10, 20] and [c["step"] for c in rest] == [30]
    assert client.get(url, params={"limit": 10_001}, headers=user).status_code == 422


STUCK_SERVER = """
import signal, sys, time
from fastapi import FastAPI
from zeropilot.up import _raise_interrupt, abandon_stuck_requests, serve_api

app = FastAPI()

@app.get("/stuck")
def stuck() -> None:
    time.sleep(3600)  # a handler thread that never returns

signal.signal(signal.SIGTERM, _raise_interrupt)  # as zeropilot up does
try:
    serve_api(app, "127.0.0.1", int(sys.argv[1]))
finally:
    abandon_stuck_requests(143)
"""


def test_the_api_stops_on_sigterm_while_a_request_is_stuck() -> None:
    server, port = _serving(STUCK_SERVER)
    url = f"http://127.0.0.1:{port}"
    try:
        threading.Thread(target=_ask_and_ignore, args=(f"{url}/stuck",), daemon=True).start()
        time.sleep(1)  # the request reaches its handler
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 143  # it stops: uvicorn's grace, then abandoned
    finally:
        server.kill()


HOLDING_SERVER = """
import signal, sys
from fastapi import FastAPI
from service.api.job_progress import ProgressHub, Seen
from service.core.states import JobStatus
from service.db.jobs import Progress
from zeropilot.up import _raise_interrupt, abandon_stuck_requests, serve_api

hub = ProgressHub(lambda ids: {i: Progress(JobStatus.RUNNING, 1, 0) for i in ids})
app = FastAPI()

@app.get("/wait")
async def wait() -> dict[str, bool]:
    changed, _ = await hub.wait("j1", Seen(JobStatus.RUNNING, 1, 0), timeout_s=60)
    return {"changed": changed}

signal.signal(signal.SIGTERM, _raise_interrupt)  # as zeropilot up does
try:
    serve_api(app, "127.0.0.1", int(sys.argv[1]))
finally:
    abandon_stuck_requests(143)
"""


def test_a_held_long_poll_is_answered_when_the_api_stops() -> None:
    """uvicorn would give it the whole graceful timeout (5 s under zeropilot up): the
    shutdown answers it at once, unchanged, and the process exits without abandoning it."""
    server, port = _serving(HOLDING_SERVER)
    answers: list[httpx.Response] = []
    try:
        asking = threading.Thread(
            target=lambda: answers.append(httpx.get(f"http://127.0.0.1:{port}/wait", timeout=90))
        )
        asking.start()
        time.sleep(1)  # held by the hub: nothing moves for 60 s
        server.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        code = server.wait(timeout=60)
        stopped_in = time.monotonic() - stopping
        asking.join(timeout=60)
    finally:
        server.kill()
    assert [(a.status_code, a.json()) for a in answers] == [(200, {"changed": False})]
    assert code == 0, "nothing was left running to abandon"
    assert stopped_in < SHUTDOWN_GRACE_S, f"stopped in {stopped_in:.1f} s, not at the grace"


def _serving(script: str) -> tuple[subprocess.Popen[bytes], int]:
    """``script`` run with a free port as its argument, once something listens there."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", script, str(port)], cwd=REPO)
    try:
        _wait_until_listening(port)
    except AssertionError:
        server.kill()
        raise
    return server, port


def _wait_until_listening(port: int) -> None:
    for _ in range(600):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


def _ask_and_ignore(url: str) -> None:
    with contextlib.suppress(httpx.HTTPError):
        httpx.get(url, timeout=300)
