"""DeepSpeed config templates, one JSON fragment per ZeRO stage, offload mode and precision.

The advisor composes a config from these fragments and then fills in the numbers it computed
(batch sizes, bucket sizes, optimizer). Keeping the fragments as plain JSON lets a reviewer read
exactly what zeropilot will hand to DeepSpeed, field by field, as in the ZeRO article's templates.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any, Literal

Precision = Literal["bf16", "fp16", "fp32"]
STAGES = (0, 1, 2, 3)


@cache
def _read_template(name: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def load_template(name: str) -> dict[str, Any]:
    """A fresh copy of one fragment, e.g. ``zero3`` or ``offload_optimizer_cpu``."""
    return copy.deepcopy(_read_template(name))


def copy_tree(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a JSON-like tree of dicts; much cheaper than deepcopy for the advisor's loop."""
    return {k: copy_tree(v) if isinstance(v, dict) else _copy_leaf(v) for k, v in config.items()}


def _copy_leaf(value: Any) -> Any:
    return copy.deepcopy(value) if isinstance(value, list) else value


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``extra`` merged into ``base``; nested dicts merge, anything else replaces."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def compose(
    stage: int, offload_optimizer: bool, offload_param: bool, precision: Precision
) -> dict[str, Any]:
    """The template for one stage/offload/precision combination, before numbers are filled in."""
    return copy_tree(_composed(stage, offload_optimizer, offload_param, precision))


@cache
def _composed(
    stage: int, offload_optimizer: bool, offload_param: bool, precision: Precision
) -> dict[str, Any]:
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, not {stage}")
    if offload_optimizer and stage == 0:
        raise ValueError("optimizer offload needs ZeRO stage 1, 2 or 3")
    if offload_param and stage != 3:
        raise ValueError("parameter offload needs ZeRO stage 3")
    config = deep_merge(_read_template("common"), _read_template(f"zero{stage}"))
    config = deep_merge(config, _read_template(f"precision_{precision}"))
    if offload_optimizer:
        config = deep_merge(config, _read_template("offload_optimizer_cpu"))
    if offload_param:
        config = deep_merge(config, _read_template("offload_param_cpu"))
    return config
