"""Spec text (YAML or JSON) into Python values, refusing the documents that hurt whoever reads
them: YAML anchors and aliases (a few hundred bytes of nested aliases expand into gigabytes),
nesting deeper than any spec needs (the parser recurses once per level, so a thousand levels
exhaust Python's stack), documents over 1 MiB, and values JSON cannot carry (a spec is sent as
JSON): NaN and infinities, and the YAML types ``!!binary``, ``!!set``, ``!!omap`` and
``!!pairs``. A YAML date or time is read as the text written.

The CLI (``zeropilot/cli_common.py``) and the API (``POST /console/api/spec``) both read through
``load_document``, so they refuse the same documents for the same reasons, in the same words.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, NoReturn

import yaml

from service.core.limits import MAX_JSON_DEPTH

MAX_DOCUMENT_BYTES = 1 << 20  # a spec is kilobytes; a megabyte is a mistake or an attack
# A spec's free-form parts nest MAX_JSON_DEPTH deep under a few levels of the spec itself.
MAX_DOCUMENT_DEPTH = 2 * MAX_JSON_DEPTH

Rule = Literal["size", "alias", "depth", "syntax", "type"]


class DocumentRefused(ValueError):
    """A document refused unread or half read; ``rule`` says which rule it broke."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule = rule


def load_document(text: str, kind: Literal["yaml", "json"] = "yaml") -> Any:
    """The document's value; JSON for ``kind="json"``, else YAML (which reads most JSON too)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_DOCUMENT_BYTES:
        raise DocumentRefused("size", f"is over 1 MiB ({MAX_DOCUMENT_BYTES:,} bytes)")
    if kind == "json":
        return _load_json(text)
    try:
        return yaml.load(text, Loader=_PlainSafeLoader)  # noqa: S506 (it is a SafeLoader)
    except yaml.YAMLError as exc:
        raise DocumentRefused("syntax", f"is not valid YAML/JSON: {exc}") from exc


def _load_json(text: str) -> Any:
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except DocumentRefused:
        raise
    except RecursionError as exc:  # beyond what json's reader takes, far beyond our limit
        raise _too_deep(None) from exc
    except ValueError as exc:
        raise DocumentRefused("syntax", f"is not valid JSON: {exc}") from exc
    if _depth(value) > MAX_DOCUMENT_DEPTH:
        raise _too_deep(None)
    return value


def _refuse_constant(name: str) -> Any:
    raise DocumentRefused("type", f"holds {name}, which JSON cannot carry: numbers are finite")


def _depth(value: Any) -> int:
    """How deep lists and mappings nest in ``value``, without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _where(mark: yaml.Mark | None) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""


def _too_deep(mark: yaml.Mark | None) -> DocumentRefused:
    return DocumentRefused(
        "depth",
        f"is nested too deeply to read: more than {MAX_DOCUMENT_DEPTH} levels of lists and "
        f"mappings{_where(mark)}",
    )


class _PlainSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses anchors, aliases and deep nesting while composing,
    before any node is built from them."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise DocumentRefused(
                "alias",
                f"holds a YAML anchor or alias{_where(event.start_mark)}: anchors and aliases "
                "(&name, *name, <<: *name) are not accepted; write the values out",
            )
        nests = isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent)
        if nests and self.depth >= MAX_DOCUMENT_DEPTH:
            raise _too_deep(event.start_mark)
        self.depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= nests


def _finite_float(loader: _PlainSafeLoader, node: yaml.Node) -> float:
    value = float(loader.construct_yaml_float(node))  # type: ignore[arg-type]
    if not math.isfinite(value):
        raise DocumentRefused(
            "type",
            f"holds {node.value}{_where(node.start_mark)}, which JSON cannot carry: "
            "numbers are finite",
        )
    return value


def _text_as_written(loader: _PlainSafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


def _refuse_type(_loader: _PlainSafeLoader, node: yaml.Node) -> NoReturn:
    raise DocumentRefused(
        "type",
        f"holds a YAML {node.tag.rsplit(':', 1)[-1]}{_where(node.start_mark)}, which JSON "
        "cannot carry: write it as text, a list or a mapping",
    )


_PlainSafeLoader.add_constructor("tag:yaml.org,2002:float", _finite_float)
# A date is text in a spec (a job name, a tag): kept as written, as JSON would carry it.
_PlainSafeLoader.add_constructor("tag:yaml.org,2002:timestamp", _text_as_written)
for _tag in ("binary", "set", "omap", "pairs"):
    _PlainSafeLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_type)
