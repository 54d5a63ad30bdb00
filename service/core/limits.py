"""How big a number or a document a request may carry: past these the API answers 422 naming
the field, before anything is stored or computed (a column's range, a recursion, a loop over a
user-sized number would otherwise end in a 500 or a stuck worker).
"""

from __future__ import annotations

import math
from typing import Any

INT32_MAX = 2**31 - 1  # an INTEGER column (steps, ids, quotas)
INT64_MAX = 2**63 - 1  # a BIGINT column (bytes)
MAX_JSON_DEPTH = 32  # free-form documents (zero.overrides, a config.json) nest no deeper
MAX_TEXT = 4096  # a path, an argument, an environment value

# Shape and batch magnitudes far above any real model (a 10^15-parameter model, a million
# hidden units) and still small enough that every product the advisor forms is exact.
MAX_PARAMETERS = 10**15
MAX_DIMENSION = 2**20
MAX_LAYERS = 100_000
MAX_TOKENS = 2**24  # sequence length, batch sizes


def no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("must not contain NUL bytes")
    return text


def plain_document(value: Any, path: str = "", depth: int = 0) -> Any:
    """Check a free-form JSON document: nesting, finite numbers, no NUL bytes; the path of
    the first offender is in the error."""
    where = path or "the document"
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} is {value}: numbers must be finite")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise ValueError(f"{where} is beyond a 64-bit integer")
    if isinstance(value, str):
        no_nul(value)
    if isinstance(value, dict):
        for key, item in value.items():
            plain_document(key, where, depth + 1)
            plain_document(item, f"{path}.{key}" if path else str(key), depth + 1)
    if isinstance(value, list):
        for index, item in enumerate(value):
            plain_document(item, f"{where}[{index}]", depth + 1)
    return value
