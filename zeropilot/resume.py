"""How an attempt loads the checkpoint it resumes from: the service chooses, the runtime obeys.

The client package owns the names because its runtime helper may import nothing of the
service's; the service imports them from here (``ZEROPILOT_RESUME_METHOD`` carries one).
"""

from __future__ import annotations

from enum import StrEnum


class ResumeMethod(StrEnum):
    NATIVE = "native"  # the same ZeRO partitioning: the engine loads the checkpoint as saved
    UNIVERSAL = "universal"  # ZeRO-1 and 2 between them: a universal checkpoint, optimizer kept
    WEIGHTS = "weights"  # to ZeRO-3 or from ZeRO-0: the consolidated weights, a fresh optimizer
