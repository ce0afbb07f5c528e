"""What cannot be undone, over HTTP: deleting declared factors, layers and holdouts that no
experiment uses (409 naming the ones that do), and factor declarations no strategy could
ever honour refused with the field named. Real API process, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid

import pytest

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def _experiment(key: str, treatment: dict | None = None, **placement: object) -> dict:
    return {"key": key, "name": key, "traffic": 1.0, "control": "a", **placement,
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": treatment or {}}]}


def _problem(r, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    return r.json()


def test_an_unused_factor_is_deleted_audited_gone_from_the_list_and_declarable_again(api_server) -> None:
    name = _name("engine")
    declaration = {"name": name, "type": "enum", "values": ["vllm", "sglang"], "default": "vllm"}
    with api_server.client("editor") as c:
        assert c.post("/v1/factors", json=declaration).status_code == 201
    with api_server.client("viewer") as c:
        assert _problem(c.delete(f"/v1/factors/{name}"), 403)["field"] == "Authorization"  # editor scope, like POST
    with api_server.client("editor") as c:
        deleted = c.delete(f"/v1/factors/{name}")
        assert deleted.status_code == 204 and deleted.content == b""
        assert name not in {f["name"] for f in c.get("/v1/factors").json()["items"]}
        assert _problem(c.get(f"/v1/factors/{name}"), 404)["field"] == "name"
        again = _problem(c.delete(f"/v1/factors/{name}"), 404)
        assert name in again["detail"]
        # an experiment may no longer set it
        refused = _problem(c.post("/v1/experiments", json=_experiment(_name("e").replace("_", "-"), {name: "vllm"})), 422)
        assert refused["field"] == f"variants.1.strategy.{name}" and "is not declared" in refused["detail"]
        redeclared = c.post("/v1/factors", json={"name": name, "type": "integer", "min": 1})  # a new meaning: not a 409
        assert redeclared.status_code == 201 and redeclared.json()["type"] == "integer"
    with api_server.client("admin") as c:
        entries = c.get("/v1/audit", params={"entity_type": "factor", "key": name}).json()
    assert [e["action"] for e in entries] == ["declare", "delete", "declare"]  # newest first
    deletion = entries[1]
    assert deletion["actor"] == "test-editor" and deletion["after"] is None
    assert deletion["before"] == entries[2]["after"] and deletion["before"]["values"] == ["vllm", "sglang"]


def test_a_factor_an_experiment_sets_is_kept_with_a_409_naming_it_even_once_archived(api_server) -> None:
    name = _name("tier")
    params_name = f"params.{_name('knob')}"
    key, other = _name("uses").replace("_", "-"), _name("also").replace("_", "-")
    with api_server.client("editor") as c:
        c.post("/v1/factors", json={"name": name, "type": "string"}).raise_for_status()
        c.post("/v1/factors", json={"name": params_name, "type": "number", "min": 0}).raise_for_status()
        c.post("/v1/experiments", json=_experiment(key, {name: "gold", "params": {params_name[7:]: 1}})).raise_for_status()
        c.post("/v1/experiments", json=_experiment(other, {name: "silver"})).raise_for_status()
        for step in ("start", "stop", "archive"):
            problem = _problem(c.delete(f"/v1/factors/{name}"), 409)
            assert problem["field"] == "name" and f"experiments {other}, {key};" in problem["detail"]  # sorted by key
            assert key in _problem(c.delete(f"/v1/factors/{params_name}"), 409)["detail"]
            c.post(f"/v1/experiments/{key}/{step}").raise_for_status()
        assert c.get(f"/v1/factors/{name}").status_code == 200  # still declared
        assert _problem(c.delete(f"/v1/factors/{params_name}"), 409)["detail"].count(key) == 1
        c.delete(f"/v1/experiments/{other}").raise_for_status()  # a draft: deletable, so it lets go
        problem = _problem(c.delete(f"/v1/factors/{name}"), 409)
        assert key in problem["detail"] and other not in problem["detail"]


@pytest.mark.parametrize(("name", "origin"), [("precision", "builtin"), ("compression.tau", "builtin"),
                                              ("backend", "gateway"), ("params", "gateway")])
def test_built_in_and_gateway_factors_cannot_be_deleted(api_server, name: str, origin: str) -> None:
    with api_server.client("editor") as c:
        problem = _problem(c.delete(f"/v1/factors/{name}"), 409)
        assert problem["field"] == "name" and f"is a {origin} factor" in problem["detail"]
        assert c.get(f"/v1/factors/{name}").json()["origin"] == origin


@pytest.mark.parametrize(("body", "field", "says"), [
    ({"name": "params.stream", "type": "boolean"}, "name", "the caller decides whether to stream"),
    ({"name": "params.messages", "type": "string"}, "name", "messages are not a factor"),
    ({"name": "params.prompt", "type": "string"}, "name", "prompt is not a factor"),
    ({"name": "budget", "type": "number", "min": True}, "min", "expected a number, got boolean true"),
    ({"name": "budget", "type": "number", "max": False}, "max", "expected a number, got boolean false"),
    ({"name": "budget", "type": "number", "default": True}, "default", "budget=true is not allowed"),
    ({"name": "budget", "type": "integer", "max": 2**53}, "max", "9007199254740991"),
    ({"name": "budget", "type": "integer", "default": 2**53 + 1}, "default", "9007199254740991"),
    ({"name": "budget", "type": "enum", "values": ["a", 2**60]}, "values.1", "9007199254740991"),
    ({"name": "budget", "type": "number", "default": float("nan")}, "default", "not a level"),
    ({"name": "budget", "type": "number", "max": float("inf")}, "max", "not a finite number"),
])
def test_declarations_no_strategy_could_honour_are_refused_naming_the_field(api_server, body, field, says) -> None:
    with api_server.client("editor") as c:
        # Python's json writes (and the API's reads) NaN and Infinity; httpx's json= refuses them
        raw = json.dumps(body).encode()
        problem = _problem(c.post("/v1/factors", content=raw, headers={"content-type": "application/json"}), 422)
        assert c.get(f"/v1/factors/{body['name']}").status_code == 404  # nothing was declared
    assert problem["field"] == field and says in problem["detail"], problem


def test_an_empty_layer_is_deleted_out_of_the_sdk_config_audited_and_creatable_again(api_server) -> None:
    key = _name("layer").replace("_", "-")
    with api_server.client("editor") as c:
        c.post("/v1/layers", json={"key": key, "name": "Ranking"}).raise_for_status()
    with api_server.client("sdk") as c:
        before = c.get("/v1/sdk/config")
        assert key in {layer["key"] for layer in before.json()["layers"]}
    with api_server.client("viewer") as c:
        assert _problem(c.delete(f"/v1/layers/{key}"), 403)["field"] == "Authorization"
    with api_server.client("editor") as c:
        deleted = c.delete(f"/v1/layers/{key}")
        assert deleted.status_code == 204 and deleted.content == b""
        assert key not in {layer["key"] for layer in c.get("/v1/layers").json()}
        assert _problem(c.delete(f"/v1/layers/{key}"), 404)["field"] == "key"
    with api_server.client("sdk") as c:
        after = c.get("/v1/sdk/config", headers={"If-None-Match": before.headers["ETag"]})
        assert after.status_code == 200 and after.headers["ETag"] != before.headers["ETag"]
        assert key not in {layer["key"] for layer in after.json()["layers"]}
    with api_server.client("admin") as c:
        entries = c.get("/v1/audit", params={"entity_type": "layer", "key": key}).json()
    assert [(e["action"], e["actor"]) for e in entries] == [("delete", "test-editor"), ("create", "test-editor")]
    assert entries[0]["before"] == {"key": key, "name": "Ranking"} and entries[0]["after"] is None
    with api_server.client("editor") as c:
        assert c.post("/v1/layers", json={"key": key}).status_code == 201
        assert c.post("/v1/experiments", json=_experiment(_name("in").replace("_", "-"), layer=key)).status_code == 201


def test_a_layer_with_an_experiment_in_it_is_kept_with_a_409_naming_it_even_once_archived(api_server) -> None:
    layer, key = _name("layer").replace("_", "-"), _name("exp").replace("_", "-")
    with api_server.client("editor") as c:
        c.post("/v1/layers", json={"key": layer}).raise_for_status()
        c.post("/v1/experiments", json=_experiment(key, layer=layer, layer_share=0.5)).raise_for_status()
        for step in ("start", "stop", "archive"):
            problem = _problem(c.delete(f"/v1/layers/{layer}"), 409)
            assert problem["field"] == "key" and f"experiment {key};" in problem["detail"]
            c.post(f"/v1/experiments/{key}/{step}").raise_for_status()
        assert key in _problem(c.delete(f"/v1/layers/{layer}"), 409)["detail"]
        assert layer in {entry["key"] for entry in c.get("/v1/layers").json()}
        assert c.get(f"/v1/experiments/{key}").json()["layer"] == layer


def test_holdouts_are_deleted_by_the_same_rule(api_server) -> None:
    used, spare, key = _name("ho").replace("_", "-"), _name("spare").replace("_", "-"), _name("exp").replace("_", "-")
    with api_server.client("editor") as c:
        c.post("/v1/holdouts", json={"key": used, "fraction": 0.05}).raise_for_status()
        c.post("/v1/holdouts", json={"key": spare, "fraction": 0.05}).raise_for_status()
        c.post("/v1/experiments", json=_experiment(key, holdout=used)).raise_for_status()
        assert key in _problem(c.delete(f"/v1/holdouts/{used}"), 409)["detail"]
        assert c.delete(f"/v1/holdouts/{spare}").status_code == 204
        listed = {h["key"] for h in c.get("/v1/holdouts").json()}
        assert used in listed and spare not in listed
        assert _problem(c.delete(f"/v1/holdouts/{spare}"), 404)["field"] == "key"
