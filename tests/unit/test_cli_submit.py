"""``zeropilot submit`` through outages: one Idempotency-Key for every try, 503's Retry-After
honoured, a bounded number of tries with a line on stderr for each, and spec files refused
before anything is sent. The server is a scripted HTTP server on loopback; the real one, its
database outage and a lost answer are in tests/e2e/test_cli.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tests.unit.scripted_api import Answer, ScriptedApi, serve
from zeropilot.cli import app
from zeropilot.client import RETRY_AFTER_MAX_S, retry_delay

JOB = {"id": "j1", "name": "tiny", "status": "QUEUED", "plan": {}, "advice_reason": ""}
OUTAGE: Answer = (503, {"Retry-After": "0"}, {"detail": "the database is unavailable; retry"})
STORED: Answer = (201, {}, JOB)


def spec(tmp_path: Path, text: str = "name: tiny\nentrypoint: train.py\n") -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def submit(url: str, *argv: str) -> Result:
    env = {"ZEROPILOT_URL": url, "ZEROPILOT_TOKEN": "t", "XDG_CONFIG_HOME": "/nonexistent"}
    return CliRunner().invoke(app, ["submit", *argv], env=env)


def test_outage_is_retried_with_one_key_until_the_job_is_stored(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    api = serve(scripted, OUTAGE, OUTAGE, STORED)
    result = submit(api.url, str(spec(tmp_path)))
    assert result.exit_code == 0, result.output
    assert len(api.keys) == 3 and len(set(api.keys)) == 1 and api.keys[0]
    assert result.stderr.splitlines() == [
        "database unavailable, retrying in 0 s (2/5)",
        "database unavailable, retrying in 0 s (3/5)",
    ]
    assert "job j1 (tiny) QUEUED" in result.stdout


def event(number: int, status: str, at: str) -> dict[str, Any]:
    return {
        "id": number,
        "subject": "job",
        "to_status": status,
        "reason": status.lower(),
        "created_at": at,
    }


def step(number: int, at: str) -> dict[str, Any]:
    return {"id": number, "step": number, "loss": 0.5, "tokens_per_s": 100.0, "created_at": at}


def test_wait_prints_the_last_steps_before_the_event_that_ended_the_job(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    """The last poll reads the job, already SUCCEEDED, then the steps reported before that:
    they are printed in the order they happened, not in the order they were read."""

    day = "2026-12-01T12:00"
    ended = {
        **JOB,
        "status": "SUCCEEDED",
        "events": [event(1, "RUNNING", f"{day}:01Z"), event(2, "SUCCEEDED", f"{day}:09Z")],
    }
    steps = [step(11, f"{day}:07.5Z"), step(12, f"{day}:08Z")]
    api = serve(scripted, STORED, (200, {}, ended), (200, {}, steps))
    result = submit(api.url, str(spec(tmp_path)), "--wait")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("RUNNING") < out.index("step    11") < out.index("step    12")
    assert out.index("step    12") < out.index("SUCCEEDED")


def test_wait_holds_a_long_poll_and_reads_only_what_moved(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    """Between looks the CLI sends what it has seen and the server holds the request; new
    metrics alone are read without the job, a new event reads the job (and ends the wait)."""
    day = "2026-12-01T12:00"
    running = {**JOB, "status": "RUNNING", "events": [event(1, "RUNNING", f"{day}:01Z")]}
    ended = {
        **running,
        "status": "SUCCEEDED",
        "events": [*running["events"], event(2, "SUCCEEDED", f"{day}:09Z")],
    }
    moved = {"changed": True, "status": "RUNNING", "last_event_id": 1, "last_metric_id": 2}
    api = serve(
        scripted,
        STORED,
        (200, {}, running),
        (200, {}, []),  # no metrics yet
        (200, {}, moved),
        (200, {}, [step(1, f"{day}:02Z"), step(2, f"{day}:03Z")]),
        (200, {}, {**moved, "status": "SUCCEEDED", "last_event_id": 2}),
        (200, {}, ended),
    )
    result = submit(api.url, str(spec(tmp_path)), "--wait")
    assert result.exit_code == 0, result.output
    sent = [line.split()[1] for line, _headers in api.requests]
    assert sent == [
        "/v1/jobs",
        "/v1/jobs/j1",
        "/v1/jobs/j1/metrics?after_id=0",
        "/v1/jobs/j1/wait?events_after=1&metrics_after=0&timeout_s=20.0&status=RUNNING",
        "/v1/jobs/j1/metrics?after_id=0",
        "/v1/jobs/j1/wait?events_after=1&metrics_after=2&timeout_s=20.0&status=RUNNING",
        "/v1/jobs/j1",
    ]
    out = result.stdout
    assert out.index("RUNNING") < out.index("step     2") < out.index("SUCCEEDED")


def test_a_given_key_is_sent_on_every_try(scripted: list[ScriptedApi], tmp_path: Path) -> None:
    api = serve(scripted, OUTAGE, STORED)
    result = submit(api.url, str(spec(tmp_path)), "--idempotency-key", "nightly-42")
    assert result.exit_code == 0, result.output
    assert api.keys == ["nightly-42", "nightly-42"]


def test_gives_up_after_five_tries_and_names_the_key_to_retry_with(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    api = serve(scripted, OUTAGE)
    path = spec(tmp_path)
    result = submit(api.url, str(path))
    assert result.exit_code == 1
    assert len(api.keys) == 5 and len(set(api.keys)) == 1
    last = result.stderr.splitlines()[-1]
    assert last.startswith("error: database unavailable; gave up after 5 tries.")
    assert f"`zeropilot submit {path} --idempotency-key {api.keys[0]}` returns it" in last


@pytest.mark.parametrize(
    ("answer", "exit_code"),
    [
        ((422, {}, {"detail": [{"loc": ["body", "name"], "msg": "bad name"}]}), 2),
        ((409, {}, {"detail": "Idempotency-Key was already used for job j0"}), 1),
        ((500, {}, {"detail": "Internal Server Error"}), 1),
    ],
)
def test_an_answer_other_than_503_is_not_retried(
    scripted: list[ScriptedApi],
    tmp_path: Path,
    answer: Answer,
    exit_code: int,
) -> None:
    api = serve(scripted, answer)
    result = submit(api.url, str(spec(tmp_path)))
    assert (result.exit_code, len(api.keys)) == (exit_code, 1)
    assert "retrying" not in result.stderr


def test_no_server_backs_off_and_says_nothing_was_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr("zeropilot.client.time.sleep", waits.append)
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    result = submit(url, str(spec(tmp_path)))
    assert result.exit_code == 1
    assert waits == [1, 2, 4, 8]
    assert result.stderr.splitlines()[0] == f"cannot connect to {url}, retrying in 1 s (2/5)"
    assert "gave up after 5 tries; nothing was sent" in result.stderr


def test_a_url_this_side_got_wrong_is_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr("zeropilot.client.time.sleep", waits.append)
    result = submit("htp://127.0.0.1:8321", str(spec(tmp_path)))
    assert (result.exit_code, waits) == (2, [])
    assert "must be http:// or https://" in result.stderr
    assert "htp://127.0.0.1:8321" in result.stderr


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("5", 5.0),
        ("0", 0.0),
        ("-3", 0.0),
        ("86400", RETRY_AFTER_MAX_S),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: now
        ("Fri, 01 Jan 9999 00:00:00 GMT", RETRY_AFTER_MAX_S),
        ("soon", 2.0),  # unreadable: the backoff of the second try
        ("nan", 2.0),
    ],
)
def test_retry_after_in_seconds_or_as_a_date(header: str, seconds: float) -> None:
    from zeropilot.client import ApiError

    assert retry_delay(ApiError(503, "away", header), 2) == seconds


BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
name: tiny
"""


def test_yaml_aliases_are_refused_and_nothing_is_sent(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    api = serve(scripted, STORED)
    result = submit(api.url, str(spec(tmp_path, BILLION_LAUGHS)))
    assert result.exit_code == 2
    assert "holds a YAML anchor or alias (line 1, column 4)" in result.stderr
    assert "anchors and aliases (&name, *name, <<: *name) are not accepted" in result.stderr
    assert api.keys == []


def test_a_spec_over_one_mib_is_refused_and_nothing_is_sent(
    scripted: list[ScriptedApi], tmp_path: Path
) -> None:
    api = serve(scripted, STORED)
    path = spec(tmp_path, "name: tiny\nargs: [" + '"x", ' * 300_000 + "]\n")
    result = submit(api.url, str(path))
    assert result.exit_code == 2
    assert f"{path} is over 1 MiB (1,048,576 bytes), the limit for a job spec" in result.stderr
    assert api.keys == []
