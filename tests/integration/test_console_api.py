"""What the console's pages read (/console/api/*) and what /metrics counts, through the real
application on a real database: visibility per team, the queue's admission order, counters
that move only for committed work, and the spec reader's refusals (aliases, depth, size, values
JSON cannot carry), with Hypothesis over every console route's inputs."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from service.settings import Settings
from tests.integration.helpers import auth, three_users, tiny_spec


@pytest.fixture
def tokens(settings: Settings, client: TestClient) -> dict[str, str]:
    made = three_users(settings.database_url)
    for team in ("vision", "speech"):  # each may hold one 2-GPU job at a time
        response = client.patch(
            f"/v1/teams/{team}", json={"gpu_quota": 2}, headers=auth(made["root"])
        )
        assert response.status_code == 200, response.text
    return made


def submit(client: TestClient, token: str, name: str, **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=tiny_spec(name, **changes), headers=auth(token))
    assert response.status_code == 201, response.text
    return dict(response.json())


def test_queue_lists_waiting_jobs_in_admission_order_each_member_numbering_its_team_alone(
    client: TestClient, tokens: dict[str, str]
) -> None:
    submit(client, tokens["alice"], "v-running")
    waiting_vision = submit(client, tokens["alice"], "v-waits")
    submit(client, tokens["bob"], "s-running")
    waiting_speech = submit(client, tokens["bob"], "s-waits")
    urgent = submit(client, tokens["bob"], "s-urgent", priority=90)
    later = submit(client, tokens["alice"], "v-later")

    every = client.get("/console/api/queue", headers=auth(tokens["root"])).json()
    # Priority first; then, both teams holding 2 GPUs of equal shares, the oldest; then the
    # team holding fewer once s-urgent and v-waits would be admitted (a tie: the oldest).
    assert [(q["position"], q["name"]) for q in every] == [
        (1, "s-urgent"), (2, "v-waits"), (3, "s-waits"), (4, "v-later"),
    ]  # fmt: skip
    assert [q["id"] for q in every] == [
        urgent["id"], waiting_vision["id"], waiting_speech["id"], later["id"],
    ]  # fmt: skip
    assert every[1]["why"] == "team vision holds 2 of its 2-GPU quota; this job needs 2"
    # A member sees its team's jobs numbered among themselves: nothing says how many of
    # another team's jobs go first.
    vision = client.get("/console/api/queue", headers=auth(tokens["alice"])).json()
    assert [(q["position"], q["name"]) for q in vision] == [(1, "v-waits"), (2, "v-later")]
    speech = client.get("/console/api/queue", headers=auth(tokens["bob"])).json()
    assert [(q["position"], q["name"]) for q in speech] == [(1, "s-urgent"), (2, "s-waits")]


def test_jobs_rows_carry_the_plan_summary_and_respect_teams(
    client: TestClient, tokens: dict[str, str]
) -> None:
    submit(client, tokens["alice"], "v-one")
    submit(client, tokens["bob"], "s-one")

    own = client.get("/console/api/jobs", headers=auth(tokens["alice"])).json()
    assert [(row["name"], row["team"]) for row in own["data"]] == [("v-one", "vision")]
    row = own["data"][0]
    assert (row["nodes"], row["gpus_per_node"], row["attempts"]) == (1, 2, 1)
    assert row["plan"]["zero_stage"] in (0, 1, 2, 3) and "ds_config" not in row["plan"]
    admin = auth(tokens["root"])
    every = client.get("/console/api/jobs", headers=admin).json()
    assert {r["team"] for r in every["data"]} == {"vision", "speech"}
    speech = client.get("/console/api/jobs", params={"team": "speech"}, headers=admin).json()
    assert [r["name"] for r in speech["data"]] == ["s-one"]
    asked = client.get(
        "/console/api/jobs", params={"team": "speech"}, headers=auth(tokens["alice"])
    )
    assert [r["team"] for r in asked.json()["data"]] == ["vision"]  # a member sees only theirs


def test_spec_parsing_needs_a_token_and_a_mapping(
    client: TestClient, tokens: dict[str, str]
) -> None:
    text = "name: tiny\nresources: {nodes: 1, gpus_per_node: 2}\n"
    headers = {**auth(tokens["alice"]), "Content-Type": "text/plain"}
    assert client.post("/console/api/spec", content=text, headers=headers).json() == {
        "name": "tiny", "resources": {"nodes": 1, "gpus_per_node": 2},
    }  # fmt: skip
    assert client.post("/console/api/spec", content="- a list", headers=headers).status_code == 422
    bare = {"Content-Type": "text/plain"}
    assert client.post("/console/api/spec", content=text, headers=bare).status_code == 401


# 342 bytes: nine levels of nine aliases each, 9^9 (387 million) strings once expanded.
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + level)}: &{chr(98 + level)} [{','.join(['*' + chr(97 + level)] * 9)}]\n"
    for level in range(8)
)


def parse(client: TestClient, token: str, text: str) -> Any:
    """POST the text as the page does, at CPython's default recursion limit, as in production
    (Hypothesis raises the limit while it runs, which would hide a recursion too deep)."""
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        headers = {**auth(token), "Content-Type": "text/plain"}
        return client.post(
            "/console/api/spec", content=text.encode("utf-8", "surrogatepass"), headers=headers
        )
    finally:
        sys.setrecursionlimit(raised)


@pytest.mark.parametrize(
    ("text", "status", "rule"),
    [
        (BILLION_LAUGHS, 422, "holds a YAML anchor or alias (line 1, column 4)"),
        ("base: &b {x: 1}\njob: {<<: *b}\n", 422, "anchors and aliases (&name, *name, <<: *name)"),
        ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 1000)), 422, "more than 64 levels"),
        ("[" * 1000 + "]" * 1000, 422, "nested too deeply to read: more than 64 levels"),
        ("{a: " * 100_000, 422, "more than 64 levels"),
        (f"name: {'x' * (1 << 20)}\n", 413, "over the limit of 1048576 bytes"),
        ("lr: .nan\n", 422, "holds .nan (line 1, column 5), which JSON cannot carry"),
        ("blob: !!binary aGk=\n", 422, "holds a YAML binary (line 1, column 7)"),
        ("x: [", 422, "is not valid YAML/JSON"),
    ],
    ids=["billion-laughs", "merge-key", "deep-block", "deep-flow", "deep-unclosed", "size", "nan",
         "binary", "syntax"],
)  # fmt: skip
def test_spec_parsing_refuses_what_the_cli_refuses_naming_the_rule(
    client: TestClient, tokens: dict[str, str], text: str, status: int, rule: str
) -> None:
    response = parse(client, tokens["alice"], text)
    assert response.status_code == status, response.text[:500]
    assert rule in response.json()["detail"]


def test_spec_parsing_keeps_dates_as_written_and_nesting_within_the_limit(
    client: TestClient, tokens: dict[str, str]
) -> None:
    deep: Any = "leaf"
    for _ in range(63):  # with the top mapping, 64 levels: the limit itself
        deep = {"d": deep}
    text = f"name: 2026-12-02\nzero: {yaml.safe_dump(deep, default_flow_style=True)}"
    response = parse(client, tokens["alice"], text)
    assert response.status_code == 200, response.text[:500]
    assert response.json() == {"name": "2026-12-02", "zero": deep}


FUZZ = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)
HOSTILE_PIECES = st.sampled_from(
    ["&a ", "*a", "<<: *a\n", "!!binary ", "!!set ", "!!python/object:os.system ", ".nan",
     "-.inf", "2026-12-02", "? [a]\n", "\x00", "\ud800", "\t", "{", "[", "- ", ": ", "'", '"',
     "%YAML 1.1\n", "---\n", "\ufeff", "[" * 70, "{a: " * 3000, "- " * 500]
)  # fmt: skip


@st.composite
def spec_texts(draw: st.DrawFn) -> str:
    """YAML of a random document, a random text, or either with hostile pieces cut in."""
    text = draw(
        st.one_of(
            JSON_VALUES.map(lambda value: yaml.safe_dump(value, allow_unicode=True)),
            JSON_VALUES.map(lambda value: yaml.safe_dump(value, default_flow_style=True)),
            st.text(max_size=200),
        )
    )
    for piece in draw(st.lists(HOSTILE_PIECES, max_size=4)):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + piece + text[at:]
    return text


@FUZZ
@given(text=spec_texts())
def test_spec_parsing_never_fails_on_the_server_and_never_expands(
    shared_client: TestClient, shared_tokens: dict[str, str], text: str
) -> None:
    response = parse(shared_client, shared_tokens["alice"], text)
    assert response.status_code in (200, 413, 422), response.text[:2000]
    if response.status_code == 200:
        assert isinstance(response.json(), dict)
        # Without aliases, JSON is at most a few times the YAML ("\0" is "\u0000").
        assert len(response.content) <= 8 * len(text.encode("utf-8", "surrogatepass")) + 64
    else:
        assert response.json()["detail"], response.text[:2000]


QUERY_TEXT = st.text(max_size=30) | st.sampled_from(["%00", "-1", "0", "501", "1e9", "QUEUED"])


CONSOLE_READS = ["jobs", "queue", "clusters", "timeline", "calibration"]


@FUZZ
@given(
    route=st.sampled_from([f"/console/api/{name}" for name in CONSOLE_READS]),
    query=st.dictionaries(st.sampled_from(["status", "team", "limit", "x"]), QUERY_TEXT),
    who=st.sampled_from(["alice", "root", None]),
)
def test_the_console_reads_never_fail_on_the_server(
    shared_client: TestClient,
    shared_tokens: dict[str, str],
    route: str,
    query: dict[str, str],
    who: str | None,
) -> None:
    headers = auth(shared_tokens[who]) if who else {}
    response = shared_client.get(route, params=query, headers=headers)
    assert response.status_code in (200, 400, 401, 404, 422), response.text[:2000]
    assert response.json() if response.status_code != 200 else True


def test_the_page_is_served_with_its_policy_and_the_root_leads_to_it(client: TestClient) -> None:
    page = client.get("/console")
    assert page.status_code == 200 and "/console/static/app.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/console/static/app.js").status_code == 200
    assert client.get("/", follow_redirects=False).headers["location"] == "/console"


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_submissions_count_once_and_refusals_not_at_all(
    client: TestClient, tokens: dict[str, str]
) -> None:
    labels = {"cluster": "local", "team": "vision"}
    before = counted("zeropilot_jobs_submitted_total", **labels)
    admitted = counted("zeropilot_jobs_admitted_total", **labels)
    headers = {**auth(tokens["alice"]), "Idempotency-Key": "once"}
    for _ in range(2):  # a retried POST returns the same job
        assert client.post("/v1/jobs", json=tiny_spec("v-once"), headers=headers).status_code in (
            201,
            200,
        )
    refused = client.post(
        "/v1/jobs", json=tiny_spec("v-bad", args=[1]), headers=auth(tokens["alice"])
    )
    assert refused.status_code == 422

    assert counted("zeropilot_jobs_submitted_total", **labels) == before + 1
    assert counted("zeropilot_jobs_admitted_total", **labels) == admitted + 1
    scraped = client.get("/metrics").text
    assert 'zeropilot_queue_depth{team="vision"} 0.0' in scraped
    assert 'zeropilot_team_gpu_quota{team="vision"} 2.0' in scraped
    assert 'zeropilot_jobs{cluster="local",status="QUEUED"} 1.0' in scraped
