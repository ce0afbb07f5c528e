"""The policy object: what it accepts, and every refusal naming its field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablab.platform.policy.spec import FixedArm, RulePolicy, SloRouter, error_field, parse_policy, policy_of

ROUTER = {
    "kind": "slo_router",
    "arms": {"terse": {"system_prompt": "Be terse."}, "helpful": {"system_prompt": "Help.", "params": {"temperature": 0.7}}},
    "features": ["prompt_tokens", "max_tokens", "attr.plan"],
    "slo": {"ttft_ms_p95": 400},
    "objective": "accuracy",
    "explore": 0.05,
}
RULE = {
    "kind": "rule",
    "arms": {"terse": {}, "helpful": {}},
    "rules": [{"when": {"prompt_tokens": {"gt": 800}}, "arm": "terse"},
              {"when": {"attr.plan": {"in": ["pro"]}, "prompt_tokens": {"le": 800}}, "arm": "helpful"}],
    "default": "helpful",
}


def _field(data: dict, **kw) -> tuple[str, str]:
    with pytest.raises(ValidationError) as err:
        parse_policy(data, **kw)
    return error_field(err.value)


def test_the_issue_example_parses_from_a_variant_strategy() -> None:
    p = parse_policy({"policy": ROUTER})
    assert isinstance(p, SloRouter)
    assert p.arm_names == ("terse", "helpful")
    assert [(s.latency, s.quantile, s.max_ms) for s in p.slos()] == [("ttft_ms", 0.95, 400.0)]
    assert p.objective_def().source == "correct" and not p.objective_def().lower_is_better
    assert policy_of({"policy": ROUTER}) == ROUTER and policy_of({"system_prompt": "x"}) is None
    # the hash is the policy's identity inside model versions: stable and content-based
    assert p.content_hash == parse_policy(dict(ROUTER)).content_hash
    assert p.content_hash != parse_policy({**ROUTER, "explore": 0.1}).content_hash


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"explore": 0}, "explore", "greater than 0"),
    ({"explore": 1}, "explore", "less than 1"),
    ({"explore": 0.6}, "explore", "exceeds 1"),
    ({"slo": {"cost_usd_p95": 1}}, "slo", "not a latency"),
    ({"slo": {"output_tokens": 10}}, "slo", "not a latency"),
    ({"slo": {"ttft_ms_p42": 10}}, "slo", "unknown SLO"),
    ({"slo": {"ttft_ms_p95": -1}}, "slo", "positive"),
    ({"objective": "ttft_ms_p95"}, "objective", "not a mean of one value per request"),
    ({"objective": "judge_score"}, "objective", "unknown metric"),
    ({"features": ["prompt_tokens", "temperature"]}, "features", "unknown feature"),
    ({"features": ["attr.Plan"]}, "features", "unknown feature"),
    ({"arms": {"only": {}}}, "arms", "at least two arms"),
    ({"arms": {"a": {"params": {"model": "x"}}, "b": {}}}, "arms.a", "not overridable"),
    ({"arms": {"a": {"policy": {}}, "b": {}}}, "arms.a", "not another policy"),
    ({"arms": {"A b": {}, "b": {}}}, "arms", "names are lowercase"),
    ({"typo": 1}, "typo", "Extra inputs"),
])
def test_router_refusals_name_the_field(change: dict, field: str, words: str) -> None:
    got_field, message = _field({**ROUTER, **change})
    assert got_field == field, message
    assert words in message


def test_custom_metrics_are_objectives_with_their_direction() -> None:
    from ablab.platform.stats.spec import parse_custom

    custom = {m.name: m for m in parse_custom([
        {"name": "judge_score", "type": "mean", "column": "score"},
        {"name": "p90_len", "type": "quantile", "column": "output_tokens", "quantile": 0.9},
    ])}
    p = parse_policy({**ROUTER, "objective": "judge_score"}, custom=custom)
    assert p.objective_def(custom).source == "score"
    field, message = _field({**ROUTER, "objective": "p90_len"}, custom=custom)
    assert field == "objective" and "quantile" in message


def test_rule_policy_and_its_features() -> None:
    p = parse_policy(RULE)
    assert isinstance(p, RulePolicy)
    assert p.features == ["prompt_tokens", "attr.plan"]


@pytest.mark.parametrize(("rules", "field", "words"), [
    ([{"when": {"prompt_tokens": {"gt": 100, "lt": 50}}, "arm": "terse"}], "rules.0.when.prompt_tokens", "select nothing"),
    ([{"when": {"prompt_tokens": {"gt": 4, "lt": 5}}, "arm": "terse"}], "rules.0.when.prompt_tokens", "select nothing"),
    ([{"when": {"prompt_tokens": {"lt": 0}}, "arm": "terse"}], "rules.0.when.prompt_tokens", "select nothing"),
    ([{"when": {"attr.plan": {"in": ["pro"], "ne": "pro"}}, "arm": "terse"}], "rules.0.when.attr.plan", "select nothing"),
    ([{"when": {"prompt_tokens": {"gt": 100}}, "arm": "terse"},
      {"when": {"prompt_tokens": {"gt": 200}, "attr.plan": {"eq": "pro"}}, "arm": "helpful"}], "rules.1", "rules.0 first"),
    ([{"when": {}, "arm": "terse"}, {"when": {"prompt_tokens": {"gt": 1}}, "arm": "helpful"}], "rules.1", "rules.0 first"),
    ([{"when": {"attr.plan": {"ne": "free"}}, "arm": "terse"},
      {"when": {"attr.plan": {"eq": "pro"}}, "arm": "helpful"}], "rules.1", "rules.0 first"),
    ([{"when": {"prompt_tokens": {"gt": 1}}, "arm": "nope"}], "rules.0.arm", "unknown arm"),
    ([{"when": {"temperature": {"gt": 1}}, "arm": "terse"}], "rules.0.when.temperature", "unknown feature"),
    ([{"when": {"attr.plan": {"gt": 1}}, "arm": "terse"}], "rules", "attributes are text"),
    ([{"when": {"prompt_tokens": {}}, "arm": "terse"}], "rules.0.when.prompt_tokens", "at least one"),
])
def test_rule_refusals_name_the_rule(rules: list, field: str, words: str) -> None:
    got_field, message = _field({**RULE, "rules": rules})
    assert got_field.startswith(field), (got_field, message)
    assert words in message


def test_rules_that_only_overlap_are_kept() -> None:
    # rules.1 also matches requests rules.0 does not take (prompt_tokens ≤ 100 on pro)
    parse_policy({**RULE, "rules": [{"when": {"prompt_tokens": {"gt": 100}}, "arm": "terse"},
                                    {"when": {"attr.plan": {"eq": "pro"}}, "arm": "helpful"}]})


def test_default_and_fixed_arms_must_exist() -> None:
    assert _field({**RULE, "default": "x"})[0] == "default"
    assert _field({"kind": "fixed", "arm": "a", "arms": {"b": {}}})[0] == "arm"
    p = parse_policy({"kind": "fixed", "arm": "control"})
    assert isinstance(p, FixedArm) and p.arm_names == ("control",)
