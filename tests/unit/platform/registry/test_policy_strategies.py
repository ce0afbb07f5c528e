"""A variant's strategy may be a policy (issue #33, docs/policies.md): the registry validates it
whole with ``parse_policy`` (arms against the factor catalog, the objective against the
experiment's custom metrics) and refuses a bad one with a 422 naming the policy's field."""

from __future__ import annotations

from typing import Any

import pytest

ROUTER: dict[str, Any] = {
    "kind": "slo_router",
    "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help.", "params": {"temperature": 0.7}}},
    "features": ["prompt_tokens", "max_tokens", "attr.plan"],
    "slo": {"ttft_ms_p95": 400},
    "objective": "accuracy",
    "explore": 0.05,
}
RULE: dict[str, Any] = {
    "kind": "rule",
    "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help."}},
    "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "terse"}],
    "default": "helpful",
}


def _body(policy: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"key": "router", "name": "r", "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"policy": policy}}], **extra}


def test_a_policy_strategy_is_stored_and_published(api) -> None:
    client, auth = api
    r = client.post("/v1/experiments", json=_body(ROUTER), headers={"Authorization": auth["editor"]})
    assert r.status_code == 201, r.text
    assert r.json()["variants"][1]["strategy"]["policy"] == ROUTER
    client.post("/v1/experiments/router/start", headers={"Authorization": auth["editor"]}).raise_for_status()
    payload = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]}).json()
    exp = next(e for e in payload["experiments"] if e["key"] == "router")
    assert next(v for v in exp["variants"] if v["key"] == "b")["strategy"]["policy"]["arms"]["terse"] == {"system_prompt": "Be terse."}


def test_an_objective_may_be_the_experiments_custom_mean(api) -> None:
    client, auth = api
    custom = [{"name": "helpfulness", "type": "mean", "column": "score"}]
    body = _body({**ROUTER, "objective": "helpfulness"}, metrics={"custom": custom})
    r = client.post("/v1/experiments", json=body, headers={"Authorization": auth["editor"]})
    assert r.status_code == 201, r.text
    # without the custom metric the same objective is unknown
    r = client.post("/v1/experiments", json={**_body({**ROUTER, "objective": "helpfulness"}), "key": "other"},
                    headers={"Authorization": auth["editor"]})
    assert r.status_code == 422 and r.json()["field"] == "variants.1.strategy.policy.objective", r.json()


P = "variants.1.strategy.policy."


@pytest.mark.parametrize(("policy", "field", "words"), [
    ({**RULE, "rules": [{"when": {"prompt_tokens": {"gt": 8}}, "arm": "expert"}]}, P + "rules.0.arm", "unknown arm"),
    ({**RULE, "default": "expert"}, P + "default", "unknown arm"),
    ({**ROUTER, "features": ["prompt_tokens", "colour"]}, P + "features", "colour"),
    ({**ROUTER, "objective": "no_such_metric"}, P + "objective", "unknown metric"),
    ({**ROUTER, "objective": "ttft_ms_p95"}, P + "objective", ""),
    ({**ROUTER, "explore": 0.0}, P + "explore", ""),
    ({**ROUTER, "explore": 1.0}, P + "explore", ""),
    ({**ROUTER, "explore": 0.6}, P + "explore", "exceeds 1"),
    ({**ROUTER, "slo": {"cost_usd_p95": 0.01}}, P + "slo", "not a latency"),
    ({**ROUTER, "arms": {"terse": {"engine": "fast"}, "helpful": {}}}, P + "arms.terse", "not declared"),
    ({**ROUTER, "arms": {"terse": {"params": {"stream": True}}, "helpful": {}}}, P + "arms.terse", "params.stream"),
    ({**RULE, "rules": [{"when": {"prompt_tokens": {"gt": 4, "lt": 5}}, "arm": "terse"}]}, P + "rules.0.when.prompt_tokens",
     "select nothing"),
    ({**RULE, "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "terse"},
                        {"when": {"prompt_tokens": {"gt": 900}}, "arm": "helpful"}]}, P + "rules.1", "select nothing"),
])
def test_a_bad_policy_is_422_naming_its_field(api, policy: dict[str, Any], field: str, words: str) -> None:
    client, auth = api
    r = client.post("/v1/experiments", json=_body(policy), headers={"Authorization": auth["editor"]})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field, r.json()
    assert words in r.text


def test_a_policy_strategy_holds_nothing_else_and_updates_are_checked(api) -> None:
    client, auth = api
    body = _body(ROUTER)
    body["variants"][1]["strategy"]["backend"] = "fast"
    r = client.post("/v1/experiments", json=body, headers={"Authorization": auth["editor"]})
    assert r.status_code == 422 and "only `policy`" in r.text, r.text
    created = client.post("/v1/experiments", json=_body(RULE), headers={"Authorization": auth["editor"]})
    created.raise_for_status()
    bad = _body({**RULE, "default": "nobody"})
    r = client.patch("/v1/experiments/router", json={"variants": bad["variants"], "new_phase": True},
                     headers={"Authorization": auth["editor"], "If-Match": created.headers["ETag"]})
    assert r.status_code == 422 and r.json()["field"] == P + "default", r.text


def test_declared_factors_in_arms_and_their_defaults(unit_of_work) -> None:
    from ablab.platform.registry import service as registry
    from ablab.platform.registry.factors import service as factors
    from ablab.platform.registry.factors.schemas import FactorCreate
    from ablab.platform.registry.schemas import ExperimentCreate

    with unit_of_work() as session:
        factors.declare_factor(session, data=FactorCreate.model_validate(
            {"name": "engine", "type": "enum", "values": ["vllm", "sglang"], "default": "vllm"}), actor="ed")
    policy = {**ROUTER, "arms": {"terse": {"engine": "sglang"}, "helpful": {}}}
    with unit_of_work() as session:  # an arm may set a declared factor to an allowed level
        registry.create_experiment(session, data=ExperimentCreate.model_validate(_body(policy)), actor="ed",
                                   bucket_space=10_000)
    with unit_of_work() as session:
        exp = registry.to_read(registry.get_experiment(session, "router"))
        filled = factors.with_declared_defaults(session, exp)
    # the fixed variant spells out the default; the policy variant stays as set (its arms are served as they are)
    assert filled.variants[0].strategy["engine"] == "vllm"
    assert filled.variants[1].strategy == {**exp.variants[1].strategy}
    assert "engine" not in filled.variants[1].strategy
