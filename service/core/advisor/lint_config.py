"""Readers for the parts of a ds_config the lint rules look at, tolerant of malformed input."""

from __future__ import annotations

from typing import Any


def zero_block(config: dict[str, Any]) -> dict[str, Any]:
    zero = config.get("zero_optimization")
    return zero if isinstance(zero, dict) else {}


def stage_of(config: dict[str, Any]) -> int:
    stage = zero_block(config).get("stage", 0)
    return stage if isinstance(stage, int) else 0


def enabled(config: dict[str, Any], block: str) -> bool:
    value = config.get(block)
    return isinstance(value, dict) and value.get("enabled") is True


def offload_device(config: dict[str, Any], key: str) -> str:
    block = zero_block(config).get(key)
    return str(block.get("device", "none")) if isinstance(block, dict) else "none"
