"""schemathesis over the API's own OpenAPI document, in-process on PostgreSQL: every operation
with generated valid and invalid inputs, and stateful runs that follow the document's links
(submit or list, then read, cancel and report on the job). No answer may be a 5xx, a status the
document does not list, or a body off its schema; no invalid input may be accepted.

Examples are bounded and derandomized, so a CI run repeats the last one exactly.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck
from schemathesis import Case, checks
from schemathesis.core.transport import Response

from service.api.app import create_app
from service.security import attempt_token
from service.settings import AuthSettings, Settings
from tests.integration.helpers import auth, tiny_spec

# Not positive_data_acceptance: schema-valid data may still break a rule across fields (the
# batch identity, your own team), so a 422 to it is no failure.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
]
STATEFUL_CHECKS = [*CHECKS, checks.ensure_resource_availability]
ADMIN_ONLY = {("POST", "/v1/users"), ("PATCH", "/v1/teams/{name}")}
WAIT = "/v1/jobs/{job_id}/wait"

SCHEMA = schemathesis.openapi.from_dict(
    create_app(Settings(auth=AuthSettings(secret_key="unused"))).openapi()
)
# The coverage phase alone sends hundreds of requests per operation; examples and fuzzing,
# bounded below, keep the file near a minute on a loaded 2-core machine.
SCHEMA.config.phases.update(phases=["examples", "fuzzing", "stateful"])
# Unknown query parameters are ignored, as HTTP servers do; the token is ours, not generated.
SCHEMA.config.generation.update(allow_extra_parameters=False, with_security_parameters=False)

BOUNDED = hypothesis.settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class Caller:
    """Who sends a case: alice, root for admin routes, the attempt's token for its reports."""

    def __init__(self, settings: Settings, tokens: dict[str, str]) -> None:
        self.settings = settings
        self.tokens = tokens

    def headers(self, case: Case) -> dict[str, str]:
        attempt_id = case.path_parameters.get("attempt_id")
        if attempt_id is not None:
            return auth(attempt_token(self.settings.secret_key(), str(attempt_id)))
        admin = (case.method.upper(), case.operation.path) in ADMIN_ONLY
        return auth(self.tokens["root" if admin else "alice"])


def held_briefly(case: Case) -> None:
    """A long poll on a job that does not move holds until its timeout (25 s by default): one
    second shows its answer as well. An invalid timeout is left as generated, to be refused."""
    if case.operation.path != WAIT:
        return
    query = case.query if isinstance(case.query, dict) else {}
    timeout = query.get("timeout_s", 1)
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and 1 <= timeout <= 25:
        case.query = {**query, "timeout_s": 1}


@pytest.fixture(scope="module")
def caller(shared_settings: Settings, shared_tokens: dict[str, str]) -> Caller:
    return Caller(shared_settings, shared_tokens)


@pytest.fixture(scope="module")
def job_to_cancel(shared_client: TestClient, shared_tokens: dict[str, str]) -> str:
    """Cancelling ends the attempt's token, so the reports go to another job."""
    spec = tiny_spec(name="cancel-me")
    response = shared_client.post("/v1/jobs", json=spec, headers=auth(shared_tokens["alice"]))
    job_id: str = response.json()["id"]
    return job_id


@SCHEMA.parametrize()
@BOUNDED
def test_no_operation_answers_a_server_error_or_off_its_schema(
    case: Case,
    shared_app: FastAPI,
    caller: Caller,
    shared_job: dict[str, Any],
    job_to_cancel: str,
) -> None:
    # Real ids, so the generated inputs reach the handlers, not only the 404.
    if "job_id" in case.path_parameters:
        cancelling = case.operation.path.endswith("/cancel")
        case.path_parameters["job_id"] = job_to_cancel if cancelling else shared_job["id"]
    if "attempt_id" in case.path_parameters:
        case.path_parameters["attempt_id"] = shared_job["attempts"][0]["id"]
    if "name" in case.path_parameters:
        case.path_parameters["name"] = "vision"
    held_briefly(case)
    case.call_and_validate(app=shared_app, headers=caller.headers(case), checks=CHECKS)


def test_linked_operations_in_sequence_answer_no_server_error(
    shared_app: FastAPI, caller: Caller, shared_job: dict[str, Any]
) -> None:
    base = SCHEMA.as_state_machine()

    class Workflow(base):  # type: ignore[misc,valid-type]
        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            held_briefly(case)
            return {"app": shared_app, "headers": caller.headers(case)}

        def validate_response(
            self, response: Response, case: Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(
                response,
                checks=STATEFUL_CHECKS,
                transport_kwargs=kwargs,
                recorder=self.recorder,
            )

    stateful = hypothesis.settings(BOUNDED, max_examples=15, stateful_step_count=6)
    try:
        Workflow.run(settings=stateful)
    except hypothesis.errors.FlakyStrategyDefinition:
        # The harness's, not the API's: links fill bundles from live answers, and a replay on
        # the shared database (other modules' jobs) can offer other rules. Once more, fresh.
        Workflow.run(settings=stateful)
