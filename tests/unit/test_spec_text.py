"""The spec reader the CLI and the console route share: each rule at its boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.core.spec_text import (
    MAX_DOCUMENT_BYTES,
    MAX_DOCUMENT_DEPTH,
    DocumentRefused,
    load_document,
)


def nested(depth: int) -> Any:
    document: Any = "leaf"
    for _ in range(depth):
        document = [document]
    return document


def refusal(text: str, kind: str = "yaml") -> DocumentRefused:
    with pytest.raises(DocumentRefused) as caught:
        load_document(text, kind)  # type: ignore[arg-type]
    return caught.value


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_nesting_is_read_to_the_limit_and_refused_past_it(kind: str) -> None:
    assert load_document(json.dumps(nested(MAX_DOCUMENT_DEPTH)), kind) == nested(64)  # type: ignore[arg-type]
    refused = refusal(json.dumps(nested(MAX_DOCUMENT_DEPTH + 1)), kind)
    assert refused.rule == "depth"
    assert "more than 64 levels" in str(refused)


def test_size_is_read_to_the_limit_and_refused_past_it() -> None:
    text = "a: " + "x" * (MAX_DOCUMENT_BYTES - 3)
    assert len(load_document(text)["a"]) == MAX_DOCUMENT_BYTES - 3
    assert refusal(text + "x").rule == "size"
    assert refusal("a: " + "é" * (MAX_DOCUMENT_BYTES // 2)).rule == "size"  # bytes, not characters


@pytest.mark.parametrize(
    ("text", "rule", "words"),
    [
        ("a: &x 1\nb: *x\n", "alias", "holds a YAML anchor or alias (line 1, column 4)"),
        ("a: !!set {x, y}\n", "type", "holds a YAML set (line 1, column 4)"),
        ("a: !!omap [{x: 1}]\n", "type", "holds a YAML omap"),
        ("a: -.inf\n", "type", "holds -.inf (line 1, column 4), which JSON cannot carry"),
        ("a: !!python/name:os.system\n", "syntax", "is not valid YAML/JSON"),
    ],
)
def test_yaml_json_cannot_carry_is_refused_naming_it(text: str, rule: str, words: str) -> None:
    refused = refusal(text)
    assert (refused.rule, words in str(refused)) == (rule, True), str(refused)


def test_json_refuses_nan_and_dates_stay_the_text_written() -> None:
    assert refusal('{"lr": NaN}', "json").rule == "type"
    assert load_document("when: 2026-12-02 07:00:00\n") == {"when": "2026-12-02 07:00:00"}
