"""Review a user's own ds_config against DeepSpeed's rules and the ZeRO article's ten pitfalls.

``lint_ds_config`` runs the static rules (keys, batch numbers, precision, optimizer, offload,
clipping, saving) always, and the memory rules (buckets against headroom, ZeRO-3 where a lower
stage fits, checkpointing under ZeRO-3 where ZeRO-2 fits) when a job spec and a cluster profile
say what the config will run. Findings come errors first.
"""

from __future__ import annotations

from typing import Any

from service.core.advisor.findings import SEVERITY_ORDER, Finding
from service.core.advisor.lint_memory import memory_findings
from service.core.advisor.lint_rules import static_findings
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

__all__ = ["Finding", "has_errors", "lint_ds_config"]


def lint_ds_config(
    config: dict[str, Any], spec: JobSpec | None = None, profile: ClusterProfile | None = None
) -> list[Finding]:
    """Every finding for ``config``; the memory rules need both ``spec`` and ``profile``."""
    if not isinstance(config, dict):
        return [
            Finding(
                severity="error",
                key="",
                reason="a ds_config must be a JSON object",
                fix='write the config as {"key": value, ...}',
            )
        ]
    findings = static_findings(config, spec, profile)
    if spec is not None and profile is not None:
        findings.extend(memory_findings(config, spec, profile))
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.key))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)
