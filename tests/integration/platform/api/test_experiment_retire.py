"""Finished experiments over real HTTP (SQLite and PostgreSQL): a stopped experiment's
variants cannot be paused or resumed, experiments are archived (out of the SDK config
and the default list) or deleted when they never ran, all audited; non-finite bounds
are refused with the field named instead of being stored as null."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.integration


def _body(key: str, **extra) -> dict:
    return {"key": key, "name": key, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}], **extra}


def _key() -> str:
    return f"ret-{uuid.uuid4().hex[:8]}"


def test_a_stopped_experiment_refuses_pause_and_resume(api_server) -> None:
    key = _key()
    with api_server.client("editor") as c:
        assert c.post("/v1/experiments", json=_body(key)).status_code == 201
        assert c.post(f"/v1/experiments/{key}/start").status_code == 200
        assert c.post(f"/v1/experiments/{key}/variants/b/pause").status_code == 200
        assert c.post(f"/v1/experiments/{key}/stop").status_code == 200
        version = c.get(f"/v1/experiments/{key}").json()["version"]
        for path in ("variants/b/resume", "variants/b/pause", "pause", "start"):
            r = c.post(f"/v1/experiments/{key}/{path}")
            assert r.status_code == 409, (path, r.text)
            assert r.json()["field"] == "status"
            assert "stopped" in r.json()["detail"] and "create a new experiment" in r.json()["detail"]
        after = c.get(f"/v1/experiments/{key}").json()
    assert after["version"] == version and [v["paused"] for v in after["variants"]] == [False, True]


def test_archive_hides_from_sdk_and_list_and_is_audited(api_server) -> None:
    key = _key()
    with api_server.client("editor") as c:
        assert c.post("/v1/experiments", json=_body(key, forced={"qa-unit": "b"})).status_code == 201
        assert c.post(f"/v1/experiments/{key}/start").status_code == 200
        r = c.post(f"/v1/experiments/{key}/archive")
        assert r.status_code == 409 and "stop it first" in r.json()["detail"], r.text
        assert c.post(f"/v1/experiments/{key}/stop").status_code == 200
        archived = c.post(f"/v1/experiments/{key}/archive")
        assert archived.status_code == 200 and archived.json()["archived_at"], archived.text
        assert c.post(f"/v1/experiments/{key}/archive").json()["archived_at"] == archived.json()["archived_at"]

        assert key not in {e["key"] for e in c.get("/v1/experiments", params={"limit": 500}).json()["items"]}
        assert key in {e["key"] for e in c.get("/v1/experiments", params={"archived": "include", "limit": 500}).json()["items"]}
        only = c.get("/v1/experiments", params={"archived": "only", "limit": 500}).json()["items"]
        assert key in {e["key"] for e in only} and all(e["archived_at"] for e in only)
        assert c.get(f"/v1/experiments/{key}").json()["archived_at"]  # still readable by key

        r = c.patch(f"/v1/experiments/{key}", json={"name": "renamed"}, headers={"If-Match": f'"{archived.json()["version"]}"'})
        assert r.status_code == 409 and r.json()["field"] == "archived" and "unarchive" in r.json()["detail"], r.text
        r = c.delete(f"/v1/experiments/{key}")
        assert r.status_code == 409 and "archive" in r.json()["detail"], r.text

        assert c.post(f"/v1/experiments/{key}/unarchive").json()["archived_at"] is None
        assert key in {e["key"] for e in c.get("/v1/experiments", params={"limit": 500}).json()["items"]}
        assert c.post(f"/v1/experiments/{key}/archive").status_code == 200
        audit = c.get(f"/v1/experiments/{key}/audit").json()
    assert [e["action"] for e in audit][:3] == ["archive", "unarchive", "archive"]
    assert all(e["actor"] == "test-editor" for e in audit)


def test_an_archived_draft_leaves_the_sdk_config(api_server) -> None:
    key = _key()
    with api_server.client("editor") as c:
        assert c.post("/v1/experiments", json=_body(key, forced={"qa-unit": "b"})).status_code == 201
    with api_server.client("sdk") as sdk:
        # A draft is in the config: its forced test units are assigned.
        assert key in {e["key"] for e in sdk.get("/v1/sdk/config").json()["experiments"]}
        assert sdk.post("/v1/assign", json={"unit_id": "qa-unit", "experiments": [key]}).json()["assignments"]
        with api_server.client("editor") as c:
            assert c.post(f"/v1/experiments/{key}/archive").status_code == 200
        assert key not in {e["key"] for e in sdk.get("/v1/sdk/config").json()["experiments"]}
        assert sdk.post("/v1/assign", json={"unit_id": "qa-unit", "experiments": [key]}).json()["assignments"] == []
        with api_server.client("editor") as c:
            r = c.post(f"/v1/experiments/{key}/start")
            assert r.status_code == 409 and r.json()["field"] == "archived", r.text


def test_delete_only_an_experiment_that_never_ran(api_server) -> None:
    draft, ran = _key(), _key()
    with api_server.client("editor") as c:
        assert c.post("/v1/experiments", json=_body(draft)).status_code == 201
        assert c.post("/v1/experiments", json=_body(ran)).status_code == 201
        assert c.post(f"/v1/experiments/{ran}/start").status_code == 200
        r = c.delete(f"/v1/experiments/{ran}")
        assert r.status_code == 409 and "ran" in r.json()["detail"] and "archive" in r.json()["detail"], r.text
        assert c.delete(f"/v1/experiments/{draft}", headers={"If-Match": '"7"'}).status_code == 412
        assert c.delete(f"/v1/experiments/{draft}").status_code == 204
        assert c.get(f"/v1/experiments/{draft}").status_code == 404
        assert c.delete(f"/v1/experiments/{draft}").status_code == 404
        audit = c.get(f"/v1/experiments/{draft}/audit").json()  # the history outlives the experiment
        assert [e["action"] for e in audit] == ["delete", "create"]
        assert audit[0]["before"]["key"] == draft and audit[0]["after"] is None
        # The key is free again.
        assert c.post("/v1/experiments", json=_body(draft)).status_code == 201
    with api_server.client("viewer") as v:
        assert v.delete(f"/v1/experiments/{draft}").status_code == 403
        assert v.post(f"/v1/experiments/{draft}/archive").status_code == 403


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ('"guardrails": [{"metric": "ttft_ms_p95", "max": "NaN"}]', "guardrails.0.max"),
        ('"guardrails": [{"metric": "accuracy", "min": NaN}]', "guardrails.0.min"),
        ('"guardrails": [{"metric": "accuracy", "margin": "Infinity"}]', "guardrails.0.margin"),
        ('"metrics": {"slos": {"ttft_ms": "NaN"}}', "metrics.slos.ttft_ms"),
        ('"metrics": {"slos": {"ttft_ms": Infinity}}', "metrics.slos.ttft_ms"),
        ('"traffic": NaN', "traffic"),
        ('"targeting": [{"attribute": "n", "op": "gt", "value": "NaN"}]', "targeting.0.value"),
    ],
)
def test_non_finite_bounds_are_refused_naming_the_field(api_server, raw: str, field: str) -> None:
    key = _key()
    body = f'{{"key": "{key}", "name": "n", "control": "a", "variants": [{{"key": "a", "weight": 1}}, {{"key": "b", "weight": 1}}], '
    body += (raw if raw.startswith('"traffic"') else '"traffic": 1.0, ' + raw) + "}"
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["field"] == field
        assert c.get(f"/v1/experiments/{key}").status_code == 404
