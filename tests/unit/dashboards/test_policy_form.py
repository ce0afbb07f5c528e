"""The policy editor's logic (issue 33 item 6): form values → the ``{policy: {...}}`` strategy the
registry validates, a stored policy → the form and back unchanged, SLO keys, typed condition
values, and the API's refusals placed under the policy field they name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablab.dashboards import policy_form as pf
from ablab.platform.policy.simulate import router_policy
from ablab.platform.policy.spec import LATENCIES, PER_REQUEST_METRICS, SLO_QUANTILES, error_field, parse_policy

ARMS = (("terse", {"system_prompt": "Be terse."}), ("helpful", {"system_prompt": "Help.", "params": {"temperature": 0.7}}))
RULE = {"policy": {
    "kind": "rule", "arms": dict(ARMS),
    "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "terse"},
              {"when": {"attr.plan": {"in": ["pro", "team"]}, "prompt_tokens": {"le": 800}}, "arm": "helpful"}],
    "default": "helpful", "explore": 0.05}}


def test_a_router_form_makes_the_strategy_the_registry_accepts() -> None:
    form = pf.PolicyForm(kind="slo_router", arms=ARMS, features=("prompt_tokens", "attr.plan"),
                         slos=(pf.SloRow("ttft_ms", "p95", 400.0), pf.SloRow("e2e_ms", pf.MEAN, 2000.0),
                               pf.SloRow("tpot_ms", "p99", None)),  # no bound typed: left out
                         objective="accuracy", explore=0.05)
    strategy = pf.policy_strategy(form)
    assert strategy == {"policy": {"kind": "slo_router", "arms": dict(ARMS), "features": ["prompt_tokens", "attr.plan"],
                                   "slo": {"ttft_ms_p95": 400.0, "e2e_ms": 2000.0}, "objective": "accuracy", "explore": 0.05}}
    parsed = parse_policy(strategy)
    assert parsed.kind == "slo_router" and [s.quantile for s in parsed.slos()] == [0.95, None]


def test_a_rule_form_joins_conditions_on_one_feature_and_types_the_values() -> None:
    rows = (pf.RuleRow("terse", (pf.ConditionRow("prompt_tokens", "gt", "800"),)),
            pf.RuleRow("helpful", (pf.ConditionRow("attr.plan", "in", "pro, team"), pf.ConditionRow("prompt_tokens", "le", "800"))),
            pf.RuleRow("terse", (pf.ConditionRow("prompt_tokens", "ge", "10"), pf.ConditionRow("prompt_tokens", "lt", "20.5"))))
    strategy = pf.policy_strategy(pf.PolicyForm(kind="rule", arms=ARMS, rules=rows, default="helpful", explore=0.0))
    policy = strategy["policy"]
    assert "features" not in policy and "explore" not in policy and "slo" not in policy  # a rule has none of them
    assert policy["rules"][1] == {"when": {"attr.plan": {"in": ["pro", "team"]}, "prompt_tokens": {"le": 800}}, "arm": "helpful"}
    assert policy["rules"][2]["when"] == {"prompt_tokens": {"ge": 10, "lt": 20.5}}
    assert parse_policy(strategy).kind == "rule"


@pytest.mark.parametrize("strategy", [RULE, {"policy": router_policy().model_dump(mode="json")}], ids=["rule", "router"])
def test_a_stored_policy_round_trips_through_the_form(strategy: dict) -> None:
    assert pf.policy_strategy(pf.policy_form(strategy)) == strategy


def test_keys_the_form_has_no_widget_for_are_kept() -> None:
    stored = {"policy": {**RULE["policy"], "future_field": 3}}
    assert pf.policy_strategy(pf.policy_form(stored)) == stored


def test_an_ordinary_strategy_opens_a_fresh_form() -> None:
    assert pf.policy_form({"precision": "int8"}) == pf.PolicyForm()
    assert pf.policy_form(None).kind == "slo_router"


def test_every_slo_key_round_trips() -> None:
    for latency in LATENCIES:
        for statistic in pf.SLO_STATISTICS:
            key = pf.slo_key(latency, statistic)
            assert pf.split_slo(key) == (latency, statistic)
            parse_policy({"kind": "slo_router", "arms": dict(ARMS), "slo": {key: 100.0}, "objective": "accuracy",
                          "explore": 0.1})  # the registry reads the key the same way
    assert set(pf.SLO_STATISTICS) == {*SLO_QUANTILES, pf.MEAN}
    assert pf.split_slo("cost_usd_p95") == ("cost_usd_p95", pf.MEAN)  # not a latency: sent whole, the API names it


def test_condition_values_are_numbers_for_token_counts_and_text_for_attributes() -> None:
    assert pf.condition_value("prompt_tokens", "gt", " 800 ") == 800
    assert pf.condition_value("max_tokens", "le", "12.5") == 12.5
    assert pf.condition_value("prompt_tokens", "gt", "lots") == "lots"  # kept: the API says compare with numbers
    assert pf.condition_value("attr.plan", "eq", "42") == "42"
    assert pf.condition_value("attr.plan", "not_in", "free, , trial") == ["free", "trial"]
    assert pf.condition_value("prompt_tokens", "in", "1,2") == [1, 2]


def test_features_and_attribute_names() -> None:
    assert pf.attribute_names("plan, attr.tier,\nplan") == ["attr.plan", "attr.tier"]
    assert pf.split_features(["prompt_tokens", "attr.plan", "max_tokens"]) == (["prompt_tokens", "max_tokens"], "plan")
    form = pf.policy_form(RULE)
    assert pf.rule_features(form, ["attr.region"]) == ["prompt_tokens", "max_tokens", "attr.region", "attr.plan"]


def test_objectives_are_per_request_metrics_and_custom_means_over_requests() -> None:
    custom = [{"name": "tool_calls", "type": "mean", "column": "measures.tool_calls"},
              {"name": "solved", "type": "proportion", "column": "correct", "aggregation": "request"},
              {"name": "per_user", "type": "mean", "column": "score", "aggregation": "unit_mean"},
              {"name": "cost_per_1k", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens"}]
    assert pf.objective_choices(custom) == [*PER_REQUEST_METRICS, "tool_calls", "solved"]


def _registry_refusal(policy: dict, where: str = "variants.1.strategy") -> dict[str, str]:
    """What the editor keeps of the API's 422: ``{field: detail}``, the detail as the registry words it."""
    with pytest.raises(ValidationError) as raised:
        parse_policy(policy)
    field, message = error_field(raised.value, f"{where}.policy.")
    return {field: f"{field}: {message}"}


def test_a_refusal_lands_on_the_policy_field_it_names() -> None:
    router = {"kind": "slo_router", "arms": dict(ARMS), "slo": {"ttft_ms_p95": 400.0}, "objective": "accuracy", "explore": 0.6}
    found = pf.policy_errors(_registry_refusal(router), "variants.1.strategy")
    assert list(found) == ["explore"] and found["explore"].startswith("0.6 × 2 arms exceeds 1")
    found = pf.policy_errors(_registry_refusal({**router, "explore": 0.1, "slo": {"cost_usd_p95": 1.0}}), "variants.1.strategy")
    assert list(found) == ["slo"] and "not a latency" in found["slo"]
    overlap = {**RULE["policy"], "rules": [{"when": {"prompt_tokens": {"gt": 10}}, "arm": "terse"},
                                           {"when": {"prompt_tokens": {"gt": 20}}, "arm": "helpful"}]}
    found = pf.policy_errors(_registry_refusal(overlap), "variants.1.strategy")
    assert list(found) == ["rules.1"] and "taken by rules.0" in found["rules.1"]
    bad_arm = {**RULE["policy"], "arms": {**dict(ARMS), "terse": {"precision": "fp99"}}}
    assert list(pf.policy_errors(_registry_refusal(bad_arm), "variants.1.strategy")) == ["arms.terse"]
    # another variant's refusal, or one outside the policy, is not this policy's
    assert pf.policy_errors(_registry_refusal(router, "variants.0.strategy"), "variants.1.strategy") == {}
    assert pf.policy_errors({"variants.1.strategy": "a policy strategy holds only `policy`"}, "variants.1.strategy") == {
        "": "a policy strategy holds only `policy`"}


def test_errors_for_a_field_take_its_sub_fields() -> None:
    found = {"slo": "at least one", "slo.ttft_ms_p95": "bound", "slot": "other"}
    assert pf.errors_for(found, "slo") == ["at least one", "ttft_ms_p95: bound"]
