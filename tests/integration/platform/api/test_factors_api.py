"""Declared factors and open strategies through the real API, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest

from ablab.platform.strategy import content_hash

pytestmark = pytest.mark.integration

ENGINE = {"name": "engine", "type": "enum", "values": ["vllm", "sglang", "tgi"], "default": "vllm",
          "description": "Serving engine behind the backend."}
TEMPERATURE = {"name": "params.temperature", "type": "number", "min": 0, "max": 2, "description": "Sampling temperature."}


def _key() -> str:
    return f"f-{uuid.uuid4().hex[:8]}"


def _experiment(key: str, treatment: dict, control: dict | None = None) -> dict:
    return {"key": key, "name": key, "traffic": 1.0, "control": "a",
            "variants": [{"key": "a", "weight": 1, "strategy": control or {}}, {"key": "b", "weight": 1, "strategy": treatment}]}


@pytest.fixture(scope="module")
def declared(api_server) -> None:
    with api_server.client("editor") as c:
        for body in (ENGINE, TEMPERATURE):
            r = c.post("/v1/factors", json=body)
            assert r.status_code in (200, 201), r.text


def test_declare_is_idempotent_and_listed_with_schemas(api_server, declared) -> None:
    with api_server.client("editor") as c:
        again = c.post("/v1/factors", json=ENGINE)
        assert again.status_code == 200, again.text  # same declaration: nothing to do
        clash = c.post("/v1/factors", json={**ENGINE, "values": ["vllm"]})
        assert clash.status_code == 409 and "PUT /v1/factors/engine" in clash.json()["detail"]
        builtin = c.post("/v1/factors", json={"name": "precision", "type": "string"})
        assert builtin.status_code == 422 and "built-in" in builtin.json()["detail"]
        incoherent = c.post("/v1/factors", json={"name": "depth", "type": "integer", "min": 5, "max": 1})
        assert incoherent.status_code == 422 and "min" in incoherent.json()["detail"]
    with api_server.client("viewer") as c:
        assert c.post("/v1/factors", json={"name": "x", "type": "boolean"}).status_code == 403
        page = c.get("/v1/factors").json()
    by_name = {f["name"]: f for f in page["items"]}
    assert page["total"] == len(page["items"])
    assert by_name["compression.tau"]["origin"] == "builtin"
    assert by_name["compression.tau"]["json_schema"]["minimum"] == 0 and by_name["compression.tau"]["json_schema"]["maximum"] == 1
    assert {n for n, f in by_name.items() if f["origin"] == "gateway"} == {
            "backend", "model", "params", "system_prompt", "dialogue_state", "prompt_split", "context_prune"}
    assert by_name["engine"]["json_schema"]["enum"] == ["vllm", "sglang", "tgi"] and by_name["engine"]["default"] == "vllm"
    assert by_name["params.temperature"]["json_schema"] == {"title": "params.temperature", "type": "number", "minimum": 0,
                                                            "maximum": 2, "description": "Sampling temperature."}


def test_undeclared_factor_is_refused_with_its_name(api_server, declared) -> None:
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=_experiment(_key(), {"engin": "vllm"}))
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["field"] == "variants.1.strategy.engin"
    assert "'engin' is not declared" in problem["detail"] and "did you mean 'engine'" in problem["detail"]


@pytest.mark.parametrize(
    ("strategy", "field", "allowed"),
    [
        ({"engine": "triton"}, "variants.1.strategy.engine", "one of 'vllm', 'sglang', 'tgi'"),
        ({"params": {"temperature": 3}}, "variants.1.strategy.params.temperature", "a number from 0 to 2"),
        ({"engine": 1}, "variants.1.strategy.engine", "one of 'vllm', 'sglang', 'tgi'"),
    ],
)
def test_a_declared_factors_bad_value_is_refused_with_what_is_allowed(api_server, declared, strategy, field, allowed) -> None:
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=_experiment(_key(), strategy))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and allowed in r.json()["detail"]


def test_gateway_and_declared_factors_are_stored_hashed_and_served_unchanged(api_server, declared) -> None:
    key = _key()
    treatment = {"backend": "smollm", "model": "SmolLM2-135M-Instruct", "system_prompt": "Answer in one word.",
                 "params": {"temperature": 0.2, "max_tokens": 64, "stop": ["\n"]}, "engine": "sglang", "cot_depth": 2}
    with api_server.client("editor") as c:
        r = c.post("/v1/experiments", json=_experiment(key, treatment))
        assert r.status_code == 201, r.text
        c.post(f"/v1/experiments/{key}/start").raise_for_status()
        read = c.get(f"/v1/experiments/{key}").json()
    control, variant = read["variants"]
    assert control["strategy_hash"] == "19058e0a7156d2bd"  # the plain baseline's hash since the first release
    assert "backend" not in control["strategy"] and "params" not in control["strategy"]
    assert {k: variant["strategy"][k] for k in treatment} == treatment
    assert variant["strategy_hash"] == content_hash(treatment)
    with api_server.client("sdk") as c:
        config = c.get("/v1/sdk/config").json()
        assigned = c.post("/v1/assign", json={"unit_id": "u-1", "experiments": [key]}).json()
    served = next(e for e in config["experiments"] if e["key"] == key)
    assert [v["strategy"] for v in served["variants"]] == [control["strategy"], variant["strategy"]]
    assert assigned["assignments"][0]["strategy"] in (control["strategy"], variant["strategy"])


def test_update_is_validated_and_factor_changes_respect_live_experiments(api_server, declared) -> None:
    key = _key()
    with api_server.client("editor") as c:
        exp = c.post("/v1/experiments", json=_experiment(key, {"engine": "tgi"})).json()
        patch = {"variants": _experiment(key, {"engine": "tgi", "tenant": "x"})["variants"], "new_phase": True}
        r = c.patch(f"/v1/experiments/{key}", json=patch, headers={"If-Match": f'"{exp["version"]}"'})
        assert r.status_code == 422 and r.json()["field"] == "variants.1.strategy.tenant"
        narrowed = {k: v for k, v in ENGINE.items() if k != "name"} | {"values": ["vllm", "sglang"]}
        r = c.put("/v1/factors/engine", json=narrowed)
        assert r.status_code == 409 and f"{key}/b" in r.json()["detail"]
        c.post(f"/v1/experiments/{key}/stop").raise_for_status()
        widened = {k: v for k, v in ENGINE.items() if k != "name"} | {"values": ["vllm", "sglang", "tgi", "trtllm"]}
        r = c.put("/v1/factors/engine", json=widened)
        assert r.status_code == 200 and r.json()["values"] == ["vllm", "sglang", "tgi", "trtllm"]
        assert c.get("/v1/factors/engine").json()["allowed"] == "one of 'vllm', 'sglang', 'tgi', 'trtllm'"
        assert c.get("/v1/factors/no_such").status_code == 404


def test_attribution_reads_declared_defaults_from_the_database(api_server, declared) -> None:
    from ablab.platform.analytics.service import stats_spec
    from ablab.platform.registry import service as registry
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.factors import service as factors
    from ablab.platform.stats.attribution import strategy_levels

    key = _key()
    with api_server.client("editor") as c:
        c.post("/v1/experiments", json=_experiment(key, {"engine": "sglang", "params": {"temperature": 0.9}},
                                                   {"params": {"temperature": 0.2}})).raise_for_status()
    engine = make_engine(api_server.database_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            exp = factors.with_declared_defaults(session, registry.to_read(registry.get_experiment(session, key)))
    finally:
        engine.dispose()
    levels = strategy_levels(stats_spec(exp))
    assert (levels["a"]["engine"], levels["b"]["engine"]) == ("vllm", "sglang")  # a leaves it out: the default
    assert (levels["a"]["params.temperature"], levels["b"]["params.temperature"]) == (0.2, 0.9)
