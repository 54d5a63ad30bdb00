"""Reading the limits clusters set on zeropilot's GPUs (a Kubernetes namespace's GPU quota) into
the database, where admission bounds each cluster's cap by them (``service.db.cluster_bounds``).

Each reconcile pass reads the clusters whose last read is older than
``workers.cluster_bound_interval_s``, one request per namespace. A cluster that cannot be read
now keeps what was read before; a worker refused the quotas (its Role lacks the right) records
no bound, and the profile's ``max_gpus`` is the only cap there.
"""

from __future__ import annotations

import importlib
import logging
import time
from types import ModuleType

from service.db.cluster_bounds import BOUNDED_KINDS, record_bound
from service.db.session import session_scope
from service.settings import Settings
from workers.backends.base import PermanentError, TemporaryError

log = logging.getLogger(__name__)

_LAST_READ: dict[str, float] = {}  # cluster -> monotonic time of this process's last read
_REFUSED: set[str] = set()  # clusters whose refusal was logged already


def read_cluster_bounds(settings: Settings, force: bool = False) -> None:
    """Record each bounded cluster's limit, those due only (every one with ``force``)."""
    now = time.monotonic()
    for profile in settings.cluster_profiles().values():
        last = _LAST_READ.get(profile.name)
        due = last is None or now - last >= settings.workers.cluster_bound_interval_s
        if profile.kind not in BOUNDED_KINDS or not (due or force):
            continue
        try:
            bound = _backend(profile.kind).gpu_bound(profile)
        except TemporaryError as exc:
            log.warning("the GPU limits of cluster %s are unread for now: %s", profile.name, exc)
            continue
        except PermanentError as exc:
            if profile.name not in _REFUSED:
                log.warning("cluster %s: not bounded by its quotas (%s)", profile.name, exc)
                _REFUSED.add(profile.name)
            bound = None
        _LAST_READ[profile.name] = now
        with session_scope(settings.database_url) as session:
            record_bound(session, profile.name, bound)


def _backend(kind: str) -> ModuleType:
    """The module reading the kind's limits, imported only where such a cluster is set up."""
    assert kind in BOUNDED_KINDS
    return importlib.import_module("workers.backends.kubernetes")
