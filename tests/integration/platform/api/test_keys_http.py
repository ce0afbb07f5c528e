"""API keys over real HTTP on two API processes sharing one database (SQLite file and
PostgreSQL): revocation is seen by both at the next request, keys are listed without
secrets, expiry is enforced, grants and revocations are audited, and concurrent
creates of one name give one 201 and 409s."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ablab_testing import ApiServer, concurrent_requests

pytestmark = pytest.mark.integration


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _new_key(server: ApiServer, scope: str, **extra) -> dict:
    with server.client("admin") as admin:
        r = admin.post("/v1/keys", json={"name": f"k-{uuid.uuid4().hex[:8]}", "scope": scope, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_revoked_admin_token_fails_on_its_next_request_on_both_processes(two_apis) -> None:
    a, b = two_apis
    victim = _new_key(a, "admin")
    token = victim["token"]
    # Warm both processes' token caches with the key, as a busy client would.
    for server in (a, b):
        for _ in range(3):
            r = httpx.get(f"{server.base_url}/v1/keys", headers=_bearer(token), timeout=30)
            assert r.status_code == 200, r.text

    with a.client("admin") as admin:
        revoked = admin.delete(f"/v1/keys/{victim['id']}")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["status"] == "revoked" and revoked.json()["revoked_at"]

    for server in (b, a):  # the other process first: nothing told it but the database
        r = httpx.get(f"{server.base_url}/v1/keys", headers=_bearer(token), timeout=30)
        assert r.status_code == 401, (server.base_url, r.text)
        assert r.json()["field"] == "Authorization"
        # A revoked admin cannot mint a replacement for itself.
        minted = httpx.post(f"{server.base_url}/v1/keys", headers=_bearer(token), json={"name": "escape", "scope": "admin"}, timeout=30)
        assert minted.status_code == 401, minted.text


def test_a_revoked_sdk_token_stops_assigning_at_once(two_apis) -> None:
    a, b = two_apis
    sdk = _new_key(b, "sdk")
    assert httpx.post(f"{a.base_url}/v1/assign", headers=_bearer(sdk["token"]), json={"unit_id": "u1"}, timeout=30).status_code == 200
    with b.client("admin") as admin:
        assert admin.delete(f"/v1/keys/{sdk['id']}").status_code == 200
    r = httpx.post(f"{a.base_url}/v1/assign", headers=_bearer(sdk["token"]), json={"unit_id": "u1"}, timeout=30)
    assert r.status_code == 401, r.text


def test_list_keys_shows_no_secret_and_audits_create_and_revoke(two_apis) -> None:
    a, b = two_apis
    created = _new_key(a, "viewer")
    with b.client("admin") as admin:
        listed = admin.get("/v1/keys").json()
        mine = [k for k in listed["items"] if k["id"] == created["id"]]
        assert mine and mine[0]["status"] == "active" and mine[0]["prefix"] == created["prefix"]
        for item in listed["items"]:
            assert set(item) == {"id", "name", "prefix", "scope", "status", "created_at", "expires_at", "revoked_at"}
        text = admin.get("/v1/keys", params={"include_revoked": True}).text
        assert created["token"] not in text and created["token"][len(created["prefix"]):] not in text

        assert admin.delete(f"/v1/keys/{created['id']}").status_code == 200
        assert created["id"] not in {k["id"] for k in admin.get("/v1/keys").json()["items"]}
        revoked = [k for k in admin.get("/v1/keys", params={"include_revoked": True}).json()["items"] if k["id"] == created["id"]]
        assert revoked[0]["status"] == "revoked"
        # Revoking twice changes nothing and is not audited twice.
        assert admin.delete(f"/v1/keys/{created['id']}").json()["status"] == "revoked"

        audit = admin.get("/v1/audit", params={"entity_type": "api_key", "key": created["prefix"]}).json()
    assert [e["action"] for e in audit] == ["revoke", "create"]
    assert {e["actor"] for e in audit} == {"test-admin", "test-admin-" + b.home.name}
    assert audit[0]["after"]["status"] == "revoked" and audit[0]["before"]["status"] == "active"
    assert created["token"] not in str(audit)


def test_keys_routes_are_admin_only_and_ids_are_bounded(two_apis) -> None:
    a, _ = two_apis
    for scope in ("editor", "viewer", "sdk"):
        with a.client(scope) as c:
            assert c.get("/v1/keys").status_code == 403
            assert c.delete("/v1/keys/1").status_code == 403
            assert c.get("/v1/audit").status_code == 403
    with a.client("admin") as admin:
        assert admin.delete("/v1/keys/987654321").status_code == 404
        for bad in (2**63, 10**30):
            r = admin.delete(f"/v1/keys/{bad}")
            assert r.status_code == 422 and r.json()["field"] == "key_id", r.text
        for route in ("/v1/keys", "/v1/experiments"):
            r = admin.get(route, params={"offset": 2**63})
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["field"] == "offset"


def test_an_expired_key_is_refused_with_a_reason(two_apis) -> None:
    a, b = two_apis
    with a.client("admin") as admin:
        past = admin.post("/v1/keys", json={"name": "late", "scope": "viewer", "expires_at": "2020-01-01T00:00:00Z"})
        assert past.status_code == 422 and past.json()["field"] == "expires_at", past.text
        naive = admin.post("/v1/keys", json={"name": "late", "scope": "viewer", "expires_at": "2999-01-01T00:00:00"})
        assert naive.status_code == 422 and naive.json()["field"] == "expires_at", naive.text
    soon = datetime.now(UTC) + timedelta(seconds=10)
    key = _new_key(a, "viewer", expires_at=soon.isoformat())
    assert key["expires_at"]
    # Cached on b while valid ...
    assert httpx.get(f"{b.base_url}/v1/experiments", headers=_bearer(key["token"]), timeout=30).status_code == 200
    # ... and refused there once the moment passes (waiting on the API's answer, bounded).
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(f"{b.base_url}/v1/experiments", headers=_bearer(key["token"]), timeout=30)
        if r.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.25)  # poll interval
    assert r.status_code == 401, r.text
    assert "expired" in r.json()["detail"]
    assert datetime.now(UTC) >= soon


def test_concurrent_creates_of_one_name_give_one_key_and_409s(two_apis) -> None:
    a, b = two_apis
    name = f"race-{uuid.uuid4().hex[:8]}"
    writers = 8
    responses = concurrent_requests((a, b), "admin", writers,
                                    lambda c, i: c.post("/v1/keys", json={"name": name, "scope": "sdk"}))
    statuses, bodies = [r.status_code for r in responses], [r.json() for r in responses]
    assert sorted(statuses) == [201] + [409] * (writers - 1), bodies
    assert all(b["field"] == "name" and "revoke it first" in b["detail"] for b in bodies if "field" in b)
    with a.client("admin") as admin:
        assert [k["name"] for k in admin.get("/v1/keys").json()["items"]].count(name) == 1


def test_concurrent_creates_of_one_experiment_key_give_409_not_500(two_apis) -> None:
    a, b = two_apis
    key = f"dup-{uuid.uuid4().hex[:8]}"
    body = {"key": key, "name": key, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}
    writers = 8
    statuses = [r.status_code for r in concurrent_requests((a, b), "editor", writers,
                                                           lambda c, i: c.post("/v1/experiments", json=body))]
    assert sorted(statuses) == [201] + [409] * (writers - 1), statuses
