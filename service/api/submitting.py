"""``POST /v1/jobs`` over HTTP, for both routes that serve it (``routes.jobs.create_job`` and the
fast path, ``plain_submit``): the submit use case (``service.submit``), its answer as JSON and
its refusals as the status codes and bodies the API documents."""

from __future__ import annotations

from fastapi import HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import Response

from service import submit as use_case
from service.api.deps import unauthorized
from service.api.schemas import JobDetail
from service.core.spec import JobSpec
from service.settings import Settings
from service.submit import Forbidden, IdempotencyConflict, Refused, Unauthorised

IDEMPOTENCY_KEY_MAX = 255
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]+$"  # printable ASCII: PostgreSQL text cannot hold a NUL


def submit(
    spec: JobSpec,
    credentials: HTTPAuthorizationCredentials | None,
    settings: Settings,
    idempotency_key: str | None,
) -> Response:
    """201 with the job stored, 200 with the job a replayed Idempotency-Key stored; else the
    refusal as an HTTPException."""
    token = credentials.credentials if credentials is not None else None
    try:
        done = use_case.submit(spec, token, settings, idempotency_key)
    except (Refused, IdempotencyConflict, Unauthorised, Forbidden) as exc:
        raise as_http(exc) from exc
    answer = JobDetail.model_validate(done.record)
    code = status.HTTP_201_CREATED if done.created else status.HTTP_200_OK
    # Serialized once, here: returned as a model, FastAPI would dump, validate and serialize
    # it again, in a thread-pool hop of its own (on the submit's hot path).
    return Response(answer.model_dump_json(), code, media_type="application/json")


def as_http(exc: Refused | IdempotencyConflict | Unauthorised | Forbidden) -> HTTPException:
    """The HTTP answer to one of the submit's refusals."""
    if isinstance(exc, Refused):
        return unprocessable(exc.field, exc.message)
    if isinstance(exc, IdempotencyConflict):
        return HTTPException(status.HTTP_409_CONFLICT, detail=str(exc))
    if isinstance(exc, Unauthorised):
        return unauthorized(str(exc))
    return HTTPException(status.HTTP_403_FORBIDDEN, detail=str(exc))


def unprocessable(field: str, message: str) -> HTTPException:
    """A 422 naming one field of the body (dotted), as pydantic's own refusals do."""
    detail = [{"loc": ["body", *field.split(".")], "msg": message, "type": "value_error"}]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)
