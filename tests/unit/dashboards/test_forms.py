"""Form logic: factor pickers from the schema, weights summing to 100 %, field errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ablab.dashboards import forms
from ablab.platform.strategy import FACTOR_NAMES, Strategy


def test_every_strategy_factor_has_a_picker_with_its_range():
    factors = {f.name: f for f in forms.strategy_factors()}
    assert {n for n, f in factors.items() if f.origin == "builtin"} == set(FACTOR_NAMES)
    assert {n: f.kind for n, f in factors.items() if f.origin == "gateway"} == {
        "backend": "str", "model": "str", "params": "json", "system_prompt": "text",
        "dialogue_state": "json", "prompt_split": "json", "context_prune": "json"}
    assert factors["precision"].choices == ("fp32", "bf16", "int8")
    assert (factors["kv_shards"].minimum, factors["kv_shards"].maximum) == (1, 64)
    assert factors["compression.tau"].kind == "float" and factors["compression.tau"].maximum == 1.0
    assert factors["sparse_ffn_k"].nullable and factors["sparse_ffn_k"].kind == "int"


def test_strategy_from_factors_keeps_only_changes_and_validates():
    values = dict(Strategy().factors())
    values.update({"compression.method": "entropy", "precision": "int8"})
    nested = forms.strategy_from_factors(values)
    assert nested == {"compression": {"method": "entropy"}, "precision": "int8"}
    assert Strategy.model_validate(nested).factors()["compression.method"] == "entropy"


def test_batching_values_without_a_policy_are_not_sent():
    values = dict(Strategy().factors())
    values.update({"batching.max_batch": 9, "batching.window_ms": 7.0})  # moved while the policy is "none"
    assert forms.strategy_from_factors(values) == {}
    values["batching.policy"] = "fixed"
    nested = forms.strategy_from_factors(values)
    assert nested == {"batching": {"policy": "fixed", "max_batch": 9, "window_ms": 7.0}}
    assert Strategy.model_validate(nested).batching.max_batch == 9


@given(st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=3))
def test_weights_always_sum_to_100(leading):
    weights = forms.complete_weights(leading)
    assert sum(weights) == 100 and weights[-1] >= 1


def test_weights_refuse_no_room_for_the_last():
    with pytest.raises(ValueError, match="weights"):
        forms.complete_weights([60, 40])


@given(st.integers(min_value=2, max_value=8))
def test_even_weights(n):
    w = forms.even_weights(n)
    assert sum(w) == 100 and max(w) - min(w) <= 1


def test_slider_max_leaves_one_percent_each():
    assert forms.slider_max([50], 2) == 48
    assert forms.slider_max([98], 1) == 1


def test_split_preview_accounts_for_everyone():
    rows = forms.split_preview({"a": 1, "b": 3}, traffic=0.5, holdout=0.1)
    shares = {r["segment"]: r["share"] for r in rows}
    assert shares["a"] == pytest.approx(0.9 * 0.5 * 0.25)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_rule_values():
    assert forms.parse_rule_value("us, ca", "in") == ["us", "ca"]
    assert forms.parse_rule_value("3", "gt") == 3
    assert forms.parse_rule_value("de", "eq") == "de"


def test_validation_errors_name_the_field():
    errors = forms.validate_create({"key": "Bad Key", "name": "", "traffic": 1.5, "control": "a",
                                    "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 0}]})
    assert set(errors) >= {"key", "name", "traffic", "variants.1.weight"}
    errors = forms.validate_create({"key": "k", "name": "n", "traffic": 1, "control": "zz",
                                    "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]})
    assert "control" in errors
    assert forms.validate_create({"key": "k", "name": "n", "traffic": 1, "control": "a",
                                  "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}]}) == {}


def test_diff_update_sends_only_changes():
    assert forms.diff_update({"name": "x", "traffic": 0.5}, {"name": "x", "traffic": 0.6}) == {"traffic": 0.6}


def test_boolean_factors_get_a_checkbox_kind():
    shed = {f.name: f for f in forms.strategy_factors()}["batching.shed_late"]
    assert shed.kind == "bool" and shed.default is False


def test_declared_factors_get_pickers_and_nest_into_the_strategy():
    listed = [
        {"name": "engine", "origin": "declared", "type": "enum", "values": ["vllm", "sglang"], "default": "vllm"},
        {"name": "params.temperature", "origin": "declared", "type": "number", "min": 0, "max": 2, "default": None},
        {"name": "precision", "origin": "builtin", "type": "enum", "values": ["fp32"]},  # built-ins are not re-declared
    ]
    catalog = forms.declared_catalog(listed)
    assert set(catalog.declared) == {"engine", "params.temperature"}
    pickers = {f.name: f for f in forms.strategy_factors(catalog)}
    assert pickers["engine"].choices == ("vllm", "sglang") and not pickers["engine"].nullable
    assert pickers["params.temperature"].nullable and pickers["params.temperature"].maximum == 2
    values = {**Strategy().factors(), "backend": "smollm", "model": None, "system_prompt": None,
              "params": {"max_tokens": 64}, "engine": "sglang", "params.temperature": 0.7}
    nested = forms.strategy_from_factors(values)
    assert nested == {"backend": "smollm", "params": {"max_tokens": 64, "temperature": 0.7}, "engine": "sglang"}
    body = {"key": "k", "name": "n", "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {**nested, "engine": "tgi"}}]}
    errors = forms.validate_create(body, catalog)
    assert "one of 'vllm', 'sglang'" in errors["variants.1.strategy"]
    assert forms.validate_create({**body, "variants": [body["variants"][0], {"key": "b", "weight": 1, "strategy": nested}]}, catalog) == {}
    with pytest.raises(ValueError, match="JSON object"):
        forms.parse_params("[1, 2]")
