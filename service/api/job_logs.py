"""An attempt's log as ``GET /v1/jobs/{id}/logs`` serves it: its tail, or what was appended
since a follower's offset, read only inside the attempts folder; and why a launched attempt has
no log the API can read."""

from __future__ import annotations

from pathlib import Path

from fastapi import HTTPException, status

from service.api.schemas import LogsPublic
from service.contained_files import NotContained
from service.core.clusters import BackendKind
from service.db.models import Attempt
from service.logtail import log_size, read_from, tail_lines
from service.settings import Settings


def attempt_log(
    settings: Settings, cluster: str, attempt: Attempt, tail: int, offset: int | None
) -> tuple[LogsPublic, int | None]:
    """The log's tail (or, from ``offset``, what follows it) and where a follower continues
    from (None: the attempt has no log file)."""
    number = attempt.number
    if not attempt.log_path:
        launched = attempt.backend_ref is not None
        return LogsPublic(
            attempt=number, text=why_no_log(settings, cluster) if launched else ""
        ), None
    root, path = settings.attempts_dir, Path(attempt.log_path)
    try:
        if offset is None:  # the tail, and where a follower should continue from
            size = log_size(root, path)
            return LogsPublic(attempt=number, text=tail_lines(root, path, tail)), size
        text, next_offset = read_from(root, path, offset)
    except NotContained as exc:  # the job swapped its log for a link: never read through it
        raise HTTPException(
            status.HTTP_409_CONFLICT, detail=f"attempt {number}'s log is not readable: {exc}"
        ) from exc
    return LogsPublic(attempt=number, text=text), next_offset


def why_no_log(settings: Settings, cluster: str) -> str:
    """Why a launched attempt has no log file the API can read (none on Kubernetes without
    the shared volume; the others always have one)."""
    profile = settings.cluster_profiles().get(cluster)
    if profile is None or profile.kind != BackendKind.KUBERNETES:
        return ""
    if profile.shared_volume_claim is None:
        return (
            f"(no log here: the pods of cluster {cluster} mount no shared volume (its profile's "
            "shared_volume_claim), so their output stays with the pods: read it with kubectl "
            "logs)"
        )
    return (
        f"(no log here: the attempt folders are not under {profile.shared_volume_path}, where "
        f"the pods of cluster {cluster} mount the shared volume, so they could not write it)"
    )
