"""Roles inside a team over HTTP: viewers read, team admins add their own team's users."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.integration.helpers import auth, tiny_spec


def make_user(
    client: TestClient, caller: str, name: str, team: str, role: str, is_admin: Any = False
) -> tuple[int, Any]:
    body = {"name": name, "team": team, "role": role, "is_admin": is_admin}
    response = client.post("/v1/users", json=body, headers=auth(caller))
    return response.status_code, response.json()


def test_a_viewer_reads_its_teams_jobs_but_cannot_submit_or_cancel(
    client: TestClient, tokens: dict[str, str]
) -> None:
    status, viewer = make_user(client, tokens["root"], "vera", "vision", "viewer")
    assert status == 201 and viewer["role"] == "viewer"
    job = client.post("/v1/jobs", json=tiny_spec(), headers=auth(tokens["alice"])).json()

    me = client.get("/v1/me", headers=auth(viewer["token"])).json()
    assert (me["team"], me["role"], me["is_admin"]) == ("vision", "viewer", False)
    listed = client.get("/v1/jobs", headers=auth(viewer["token"])).json()
    assert [j["id"] for j in listed["data"]] == [job["id"]]
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth(viewer["token"])).status_code == 200

    submit = client.post("/v1/jobs", json=tiny_spec(), headers=auth(viewer["token"]))
    assert submit.status_code == 403
    assert "viewer" in submit.json()["detail"]
    cancel = client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(viewer["token"]))
    assert cancel.status_code == 403
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth(viewer["token"])).json()[
        "status"
    ] not in ("CANCELLED",)
    # Nothing was stored for the refused submit: the team still has the one job.
    assert len(client.get("/v1/jobs", headers=auth(tokens["alice"])).json()["data"]) == 1


def test_a_team_admin_adds_users_to_its_own_team_only(
    client: TestClient, tokens: dict[str, str]
) -> None:
    _, lead = make_user(client, tokens["root"], "tess", "vision", "team-admin")

    status, member = make_user(client, lead["token"], "mia", "vision", "member")
    assert status == 201 and (member["team"], member["role"]) == ("vision", "member")
    submitted = client.post("/v1/jobs", json=tiny_spec(), headers=auth(member["token"]))
    assert submitted.status_code == 201

    status, refused = make_user(client, lead["token"], "sam", "speech", "member")
    assert status == 403 and "vision" in refused["detail"]
    status, refused = make_user(client, lead["token"], "ada", "vision", "member", is_admin=True)
    assert status == 403 and "service admin" in refused["detail"]
    # A team admin is a member too, and still cannot change quotas (the operators' call).
    assert client.post("/v1/jobs", json=tiny_spec(), headers=auth(lead["token"])).status_code == 201
    quota = client.patch("/v1/teams/vision", json={"gpu_quota": 64}, headers=auth(lead["token"]))
    assert quota.status_code == 403


def test_members_and_viewers_cannot_create_users(
    client: TestClient, tokens: dict[str, str]
) -> None:
    status, refused = make_user(client, tokens["alice"], "eve", "vision", "team-admin")
    assert status == 403 and "team admin" in refused["detail"]
    _, viewer = make_user(client, tokens["root"], "vic", "vision", "viewer")
    status, _ = make_user(client, viewer["token"], "eve", "vision", "member")
    assert status == 403


def test_an_unknown_role_is_refused_naming_the_field(
    client: TestClient, tokens: dict[str, str]
) -> None:
    status, refused = make_user(client, tokens["root"], "olga", "vision", "owner")
    assert status == 422
    assert "role" in str(refused["detail"])


def test_is_admin_must_be_a_json_boolean_and_a_refusal_names_the_field(
    client: TestClient, tokens: dict[str, str]
) -> None:
    for value in (0, 1, "true", "false"):  # each was coerced before, 0 to a member, 1 to admin
        status, refused = make_user(client, tokens["root"], "olga", "vision", "member", value)
        assert status == 422, (value, refused)
        (error,) = refused["detail"]
        assert error["loc"] == ["body", "is_admin"]
        assert error["msg"] == "Input should be a valid boolean"

    status, made = make_user(client, tokens["root"], "olga", "vision", "member", False)
    assert status == 201 and made["is_admin"] is False  # the refusals stored no user
