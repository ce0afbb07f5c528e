"""The API over real HTTP (uvicorn subprocess) against SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import httpx
import pytest

pytestmark = pytest.mark.integration


def body(key: str, **overrides) -> dict:
    data = {
        "key": key,
        "name": f"Experiment {key}",
        "unit": "user",
        "traffic": 1.0,
        "control": "control",
        "variants": [
            {"key": "control", "weight": 1, "strategy": {}},
            {"key": "sparse", "weight": 1, "strategy": {"sparse_ffn_k": 32, "precision": "int8"}},
        ],
        "guardrails": [{"metric": "ttft_ms_p95", "max": 800}],
    }
    data.update(overrides)
    return data


def new_key() -> str:
    return f"exp-{uuid.uuid4().hex[:8]}"


def test_health_needs_no_token(api_server) -> None:
    with api_server.client(scope=None) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        ready = c.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert "ablab_http_requests_total" in c.get("/metrics").text


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/experiments", {"admin", "editor", "viewer"}),
        ("POST", "/v1/experiments", {"admin", "editor"}),
        ("POST", "/v1/assign", {"admin", "sdk"}),
        ("GET", "/v1/sdk/config", {"admin", "sdk"}),
        ("POST", "/v1/keys", {"admin"}),
    ],
)
def test_scopes(api_server, method: str, path: str, allowed: set[str]) -> None:
    payloads = {
        "/v1/experiments": body(new_key()),
        "/v1/assign": {"unit_id": "u1"},
        "/v1/keys": {"name": "k", "scope": "viewer"},
    }
    with api_server.client(scope=None) as anonymous:
        r = anonymous.request(method, path, json=payloads.get(path) if method == "POST" else None)
        assert r.status_code == 401
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.headers["www-authenticate"] == "Bearer"
        assert anonymous.get("/v1/experiments", headers={"Authorization": "Bearer abl_forged"}).status_code == 401
    for scope in ("admin", "editor", "viewer", "sdk"):
        with api_server.client(scope) as c:
            payload = payloads.get(path)
            if path == "/v1/experiments" and method == "POST":
                payload = body(new_key())
            r = c.request(method, path, json=payload if method == "POST" else None)
            if scope in allowed:
                assert r.status_code in (200, 201), (scope, r.text)
            else:
                assert r.status_code == 403, (scope, r.text)
                assert r.json()["field"] == "Authorization"


def test_create_get_etag_and_stale_if_match(api_server) -> None:
    key = new_key()
    with api_server.client("editor") as c:
        created = c.post("/v1/experiments", json=body(key))
        assert created.status_code == 201, created.text
        assert created.json()["version"] == 1 and created.headers["etag"] == '"1"'
        got = c.get(f"/v1/experiments/{key}")
        assert got.headers["etag"] == '"1"'
        assert got.json()["variants"][1]["strategy"]["sparse_ffn_k"] == 32
        first = c.patch(f"/v1/experiments/{key}", json={"traffic": 0.5}, headers={"If-Match": '"1"'})
        assert first.status_code == 200 and first.json()["version"] == 2
        stale = c.patch(f"/v1/experiments/{key}", json={"traffic": 0.7}, headers={"If-Match": '"1"'})
        assert stale.status_code == 412
        assert stale.json()["field"] == "If-Match"
        missing = c.patch(f"/v1/experiments/{key}", json={"traffic": 0.7})
        assert missing.status_code == 428
        assert c.get(f"/v1/experiments/{key}").json()["traffic"] == 0.5


@pytest.mark.parametrize(
    ("strategy", "field"),
    [
        ({"sparse_k": 32}, "variants.1.strategy.sparse_k"),
        ({"precision": "fp16"}, "variants.1.strategy.precision"),
        ({"kv_shards": 0}, "variants.1.strategy.kv_shards"),
        ({"compression": {"method": "entropy", "tau": 3}}, "variants.1.strategy.compression.tau"),
    ],
)
def test_bad_strategy_is_422_naming_the_field(api_server, strategy: dict, field: str) -> None:
    data = body(new_key())
    data["variants"][1]["strategy"] = strategy
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=data)
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["field"] == field
    assert field in r.json()["detail"]


def test_lifecycle_and_audit(api_server) -> None:
    key = new_key()
    with api_server.client("editor") as c:
        c.post("/v1/experiments", json=body(key)).raise_for_status()
        assert c.post(f"/v1/experiments/{key}/pause").status_code == 409  # draft cannot pause
        started = c.post(f"/v1/experiments/{key}/start")
        assert started.status_code == 200, started.text
        assert started.json()["status"] == "running"
        assert c.post(f"/v1/experiments/{key}/pause").json()["status"] == "paused"
        assert c.post(f"/v1/experiments/{key}/start").json()["status"] == "running"
        assert c.post(f"/v1/experiments/{key}/stop").json()["status"] == "stopped"
        assert c.post(f"/v1/experiments/{key}/start").status_code == 409  # stopped is final
        audit = c.get(f"/v1/experiments/{key}/audit").json()
    actions = [a["action"] for a in reversed(audit)]
    assert actions == ["create", "start", "pause", "start", "stop"]
    assert all(a["actor"] == "test-editor" for a in audit)
    assert audit[0]["before"]["status"] == "running" and audit[0]["after"]["status"] == "stopped"


def test_weight_change_needs_new_phase(api_server) -> None:
    key = new_key()
    with api_server.client("editor") as c:
        c.post("/v1/experiments", json=body(key)).raise_for_status()
        variants = body(key)["variants"]
        variants[1]["weight"] = 3
        r = c.patch(f"/v1/experiments/{key}", json={"variants": variants}, headers={"If-Match": "1"})
        assert r.status_code == 409 and r.json()["field"] == "variants", r.text
        r = c.patch(f"/v1/experiments/{key}", json={"variants": variants, "new_phase": True}, headers={"If-Match": "1"})
        assert r.status_code == 200 and r.json()["phase"] == 2


def test_assign_matches_sdk_and_config_etag(api_server) -> None:
    from ablab.platform.sdk import AblabClient, ListSink

    key = new_key()
    with api_server.client("editor") as c:
        c.post("/v1/experiments", json=body(key, traffic=0.5)).raise_for_status()
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
    units = [f"user-{i}" for i in range(300)]
    with api_server.client("sdk") as c:
        over_http = {u: c.post("/v1/assign", json={"unit_id": u, "experiments": [key]}).json()["assignments"] for u in units}
        batch = c.post("/v1/assign/batch", json={"units": [{"unit_id": u} for u in units], "experiments": [key]}).json()
        config = c.get("/v1/sdk/config")
        etag = config.headers["etag"]
        assert c.get("/v1/sdk/config", headers={"If-None-Match": etag}).status_code == 304
    assert [over_http[u] for u in units] == batch["results"]
    in_experiment = [u for u in units if over_http[u]]
    assert 0.35 < len(in_experiment) / len(units) < 0.65
    sink = ListSink()
    with AblabClient(api_server.base_url, api_server.tokens["sdk"], sink=sink, refresh_s=60) as sdk:
        for u in units:
            local = [(a.experiment, a.variant) for a in sdk.assign(u, experiments=[key])]
            assert local == [(a["experiment"], a["variant"]) for a in over_http[u]]
    assert len(sink.events) == len(in_experiment)
    assert {e["type"] for e in sink.events} == {"exposure"}


def test_layers_are_exclusive_over_http(api_server) -> None:
    layer = f"layer-{uuid.uuid4().hex[:6]}"
    with api_server.client("editor") as c:
        assert c.post("/v1/layers", json={"key": layer}).status_code == 201
        a, b = new_key(), new_key()
        created = c.post("/v1/experiments", json=body(a, layer=layer, layer_share=0.5))
        assert created.status_code == 201, created.text
        c.post("/v1/experiments", json=body(b, layer=layer, layer_share=0.5)).raise_for_status()
        full = c.post("/v1/experiments", json=body(new_key(), layer=layer, layer_share=0.1))
        assert full.status_code == 409 and full.json()["field"] == "layer"
        for k in (a, b):
            c.post(f"/v1/experiments/{k}/start").raise_for_status()
    with api_server.client("sdk") as c:
        units = [{"unit_id": f"u{i}"} for i in range(2000)]
        results = c.post("/v1/assign/batch", json={"units": units, "experiments": [a, b]}).json()["results"]
    assert all(len(r) == 1 for r in results)  # layer fully allocated: exactly one each
    share_a = sum(r[0]["experiment"] == a for r in results) / len(results)
    assert 0.45 < share_a < 0.55


def test_validation_errors_are_problem_json(api_server) -> None:
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=body(new_key(), traffic=1.5))
        assert r.status_code == 422 and r.json()["field"] == "traffic"
        r = c.post("/v1/experiments", json=body(new_key(), control="nope"))
        assert r.status_code == 422 and "control" in r.json()["detail"]
        assert c.get("/v1/experiments/does-not-exist").status_code == 404
        r = c.post("/v1/experiments", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 422


def test_secrets_never_reach_logs(api_server) -> None:
    with api_server.client("admin") as c:
        created = c.post("/v1/keys", json={"name": "ci", "scope": "sdk"}).json()
        audit_tokens = httpx.get(f"{api_server.base_url}/metrics").text
    log = (api_server.home / "api.log").read_text()
    for token in [*api_server.tokens.values(), created["token"]]:
        assert token not in log
        assert token not in audit_tokens


def test_a_paused_variant_stays_paused_through_a_new_phase_until_resumed(api_server) -> None:
    key = new_key()
    with api_server.client("editor") as c:
        c.post("/v1/experiments", json=body(key)).raise_for_status()
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
        assert c.post(f"/v1/experiments/{key}/variants/control/pause").status_code == 409  # control cannot pause
        assert c.post(f"/v1/experiments/{key}/variants/nope/pause").status_code == 404
        stale = c.post(f"/v1/experiments/{key}/variants/sparse/pause", headers={"If-Match": "1"})
        assert stale.status_code == 412, stale.text
        paused = c.post(f"/v1/experiments/{key}/variants/sparse/pause", params={"reason": "p95 TTFT over SLA"})
        assert paused.status_code == 200, paused.text
        sparse = next(v for v in paused.json()["variants"] if v["key"] == "sparse")
        assert sparse["paused"] and sparse["paused_reason"] == "p95 TTFT over SLA"

        variants = body(key)["variants"]
        variants[1]["weight"] = 3
        version = paused.headers["etag"].strip('"')
        r = c.patch(f"/v1/experiments/{key}", json={"variants": variants, "new_phase": True}, headers={"If-Match": version})
        assert r.status_code == 200, r.text
        sparse = next(v for v in r.json()["variants"] if v["key"] == "sparse")
        assert sparse["weight"] == 3 and sparse["paused"], "a weight change must not put a paused variant back into traffic"

        resumed = c.post(f"/v1/experiments/{key}/variants/sparse/resume")
        assert resumed.status_code == 200, resumed.text
        assert not next(v for v in resumed.json()["variants"] if v["key"] == "sparse")["paused"]
        actions = [a["action"] for a in reversed(c.get(f"/v1/experiments/{key}/audit").json())]
    assert actions == ["create", "start", "pause_variant", "update+new_phase", "resume_variant"]
    with api_server.client("viewer") as v:
        assert v.post(f"/v1/experiments/{key}/variants/sparse/pause").status_code == 403
