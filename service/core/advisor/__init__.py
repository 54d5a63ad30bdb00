"""The memory advisor: predict per-GPU memory for every DeepSpeed configuration of a job, pick one.

Pure: no I/O beyond reading the packaged ds_templates, only stdlib and pydantic. The API, the CLI,
the workers and the escalation ladder all call ``advise`` and read ``Candidate``.
"""

from service.core.advisor.advise import advise
from service.core.advisor.models import (
    Advice,
    BadOverrides,
    Candidate,
    ClusterTooSmall,
    NoPlanFits,
    PerGpuBytes,
)

__all__ = [
    "Advice",
    "BadOverrides",
    "Candidate",
    "ClusterTooSmall",
    "NoPlanFits",
    "PerGpuBytes",
    "advise",
]
