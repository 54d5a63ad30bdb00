"""Hypothesis over what users and training processes send: a valid job spec (or runtime report)
with one value replaced by something hostile (integers past 32 and 64 bits, -1, NaN and
infinities, NUL bytes, deep nesting, long strings, a wrong type), or a hostile key added to a
mapping. The API must never answer 5xx, and a 422 must name the field it refused: its location,
or (for a rule across fields, such as the batch identity) the field's name in the message.

On the shared PostgreSQL database, with bounded, derandomized examples.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.security import attempt_token
from service.settings import Settings
from tests.integration.helpers import auth, tiny_spec

Path = tuple[str, ...]
PRODUCTION_RECURSION_LIMIT = 1000  # CPython's default, which uvicorn keeps
FUZZ = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def nested(depth: int) -> Any:
    document: Any = 1
    for _ in range(depth):
        document = {"d": document}
    return document


# Four kinds, drawn alike often: a number past a column or not finite, text a file, process
# or PostgreSQL cannot take, the wrong type, nesting past the limit or near recursion's.
NUMBERS = [2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -1, -(2**63) - 1, 0]
NUMBERS += [float("nan"), float("inf"), float("-inf"), 1e308, -0.0]
TEXTS = ["\x00", "a\x00b", "x" * 100_000, "\u202e\ud7ff", "", "1e999", "\ud800", "x\udfff"]
TYPES = [True, None, [], {}, [1] * 10_000]
DEEP = [nested(40), nested(700)]
HOSTILE = st.one_of(*(st.sampled_from(kind) for kind in (NUMBERS, TEXTS, TYPES, DEEP)))
HOSTILE_KEYS = st.sampled_from(["\x00", "k\x00", "x" * 5000, "", "NaN", "__proto__", "\udc00"])


def leaf_paths(document: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every place a value sits in ``document``, containers included."""
    if prefix:
        yield prefix
    if isinstance(document, dict):
        for key, value in document.items():
            yield from leaf_paths(value, (*prefix, key))


def with_value(document: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target = changed
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return changed


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any], mappings: list[Path]) -> tuple[Any, Path]:
    """``base`` with one value replaced, or a key added to one of its free-form mappings."""
    if mappings and draw(st.booleans()):
        mapping = draw(st.sampled_from(mappings))
        key, value = draw(HOSTILE_KEYS), draw(HOSTILE | st.just(1))
        return with_value(base, (*mapping, key), value), mapping
    path = draw(st.sampled_from(sorted(leaf_paths(base))))
    return with_value(base, path, draw(HOSTILE)), path


def send(client: TestClient, url: str, body: Any, headers: dict[str, str]) -> Any:
    """As Python's json writes it (NaN, Infinity, lone surrogates escaped): what clients send.
    The server thread gets Python's default recursion limit, as in production: Hypothesis
    raises the limit while a test runs, which would hide a recursion too deep for a server."""
    typed = {**headers, "Content-Type": "application/json"}
    content = json.dumps(body)
    raised = sys.getrecursionlimit()
    sys.setrecursionlimit(PRODUCTION_RECURSION_LIMIT)
    try:
        return client.post(url, content=content, headers=typed)
    finally:
        sys.setrecursionlimit(raised)


def assert_refusal_names(response: Any, path: Path) -> None:
    """No 5xx; a 422 names ``path`` (or a field around it) in a location or a message."""
    assert response.status_code < 500, response.text[:2000]
    if response.status_code != 422:
        return
    errors = response.json()["detail"]
    assert isinstance(errors, list) and errors, response.text[:2000]
    field = [str(p) for p in path]
    if any("over_by_bytes" in error for error in errors):
        return  # a valid job too large for the cluster: the answer is about the whole plan
    for error in errors:
        loc = [str(p) for p in error["loc"][1:]]  # after "body"
        common = min(len(loc), len(field))
        if loc[:common] == field[:common] or field[-1] in error["msg"]:
            return
    pytest.fail(f"no error names {'.'.join(field)}: {response.text[:2000]}")


SPEC = tiny_spec(
    env={"MY_FLAG": "1"},
    checkpoint={"interval_steps": 10, "resume": True},
    zero={"stage": "auto", "offload": "auto", "overrides": {"reduce_bucket_size": 5e8}},
    escalation={"enabled": True, "max_attempts": 4},
    priority=50,
)
SPEC_MAPPINGS: list[Path] = [("env",), ("zero", "overrides"), ("model",), ("training",), ()]
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "tie_word_embeddings": False,
}
HF_SPEC = tiny_spec(model={"hf_config": TINY_LLAMA})
ADVICE = {key: SPEC[key] for key in ("model", "training", "resources", "zero")}


@given(case=mutated(SPEC, SPEC_MAPPINGS))
@FUZZ
def test_a_hostile_job_spec_is_refused_naming_the_field(
    shared_client: TestClient, shared_tokens: dict[str, str], case: tuple[Any, Path]
) -> None:
    body, path = case
    response = send(shared_client, "/v1/jobs", body, auth(shared_tokens["alice"]))
    assert_refusal_names(response, path)


@given(case=mutated(HF_SPEC, [("model", "hf_config")]))
@FUZZ
def test_a_hostile_hf_config_is_refused_naming_the_field(
    shared_client: TestClient, shared_tokens: dict[str, str], case: tuple[Any, Path]
) -> None:
    body, path = case
    response = send(shared_client, "/v1/advice", body, auth(shared_tokens["alice"]))
    assert_refusal_names(response, path)


@given(case=mutated(ADVICE, [("zero", "overrides"), ("model",), ()]))
@FUZZ
def test_a_hostile_advice_request_is_refused_naming_the_field(
    shared_client: TestClient, shared_tokens: dict[str, str], case: tuple[Any, Path]
) -> None:
    body, path = case
    response = send(shared_client, "/v1/advice", body, auth(shared_tokens["alice"]))
    assert_refusal_names(response, path)


DS_CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
}
LINT = {"ds_config": DS_CONFIG}  # its job part is a spec, fuzzed above
LINT_MAPPINGS: list[Path] = [("ds_config",), ("ds_config", "zero_optimization")]


@given(case=mutated(LINT, LINT_MAPPINGS))
@FUZZ
def test_a_hostile_ds_config_to_lint_is_refused_naming_the_field(
    shared_client: TestClient, shared_tokens: dict[str, str], case: tuple[Any, Path]
) -> None:
    body, path = case
    response = send(shared_client, "/v1/advice/lint", body, auth(shared_tokens["alice"]))
    assert_refusal_names(response, path)


@pytest.fixture(scope="module")
def reporting(
    shared_client: TestClient, shared_settings: Settings, shared_job: dict[str, Any]
) -> tuple[str, dict[str, str], str]:
    """A stored attempt's report URL prefix, its token header, and its checkpoint folder."""
    attempt_id = shared_job["attempts"][0]["id"]
    token = auth(attempt_token(shared_settings.secret_key(), attempt_id))
    folder = shared_settings.data_dir / "jobs" / str(shared_job["id"]) / "checkpoints"
    return f"/v1/runtime/attempts/{attempt_id}", token, str(folder)


REPORTS: dict[str, tuple[dict[str, Any], list[Path]]] = {
    "metrics": (
        {
            "step": 3,
            "loss": 1.5,
            "tokens_per_s": 900.0,
            "memory_peak_bytes": 2**30,
            "extra": {"grad_norm": 0.5},
        },
        [("extra",), ()],
    ),
    "checkpoints": ({"step": 10, "path": "{folder}/global_step10", "tag": "global_step10"}, [()]),
    "device": (
        {
            "rank": 0,
            "device_free_bytes": 2**34,
            "device_total_bytes": 2**35,
            "numbers": {"held_by_others": 0},
        },
        [("numbers",), ()],
    ),
    "failure": (
        {
            "failure_class": "OOM_GPU",
            "message": "CUDA out of memory",
            "evidence": {"tried_bytes": 2**20},
        },
        [("evidence",), ()],
    ),
}


@pytest.mark.parametrize("kind", sorted(REPORTS))
def test_a_hostile_runtime_report_is_refused_naming_the_field(
    shared_client: TestClient, reporting: tuple[str, dict[str, str], str], kind: str
) -> None:
    prefix, token, folder = reporting
    base, mappings = REPORTS[kind]
    if "path" in base:
        base = {**base, "path": base["path"].format(folder=folder)}

    @given(case=mutated(base, mappings))
    @settings(FUZZ, max_examples=40)
    def report(case: tuple[Any, Path]) -> None:
        body, path = case
        assert_refusal_names(send(shared_client, f"{prefix}/{kind}", body, token), path)

    report()
