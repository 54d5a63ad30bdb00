"""The advisor's answer for a spec it has already planned on the same cluster, without planning
again: a sweep submits many jobs that differ only in name, arguments or environment.

The key is every part of the spec the advisor reads (model, training, resources, ZeRO pins,
checkpoint and escalation settings), the whole cluster profile and the cluster's calibration;
nothing else of the spec reaches ``advise``. Refusals (``NoPlanFits``, ``ValueError``) are not
kept: they are raised again by planning again.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from service.core.advisor import Advice, advise
from service.core.advisor.calibration import ClusterCalibration
from service.core.clusters import ClusterProfile
from service.core.spec import JobSpec

_PLANNED_FROM = {"model", "training", "resources", "zero", "checkpoint", "escalation"}
_KEPT = 512  # distinct (spec, cluster) pairs; an Advice with its candidates is a few tens of KB

_memo: OrderedDict[str, Advice] = OrderedDict()
_lock = threading.Lock()


def advise_once(
    spec: JobSpec, profile: ClusterProfile, calibration: ClusterCalibration | None = None
) -> Advice:
    """``advise(spec, profile, calibration=calibration)``, planned once per distinct input."""
    planned_with = calibration.signature if calibration is not None else None
    key = json.dumps(
        [
            spec.model_dump(mode="json", include=_PLANNED_FROM),
            profile.model_dump(mode="json"),
            planned_with,
        ],
        sort_keys=True,
    )
    with _lock:
        if (known := _memo.get(key)) is not None:
            _memo.move_to_end(key)
            return known
    advice = advise(spec, profile, calibration=calibration)
    with _lock:
        _memo[key] = advice
        while len(_memo) > _KEPT:
            _memo.popitem(last=False)
    return advice
