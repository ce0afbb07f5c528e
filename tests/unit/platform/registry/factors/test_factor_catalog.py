"""The factor catalog: built-in factors from the schema, declarations checked for coherence."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablab.platform.registry.factors.catalog import FactorCatalog, FactorDef, builtin_factors
from ablab.platform.registry.factors.schemas import FactorCreate, FactorRead
from ablab.platform.strategy import FACTOR_NAMES


def test_builtin_pack_and_gateway_factors_are_listed_with_schemas() -> None:
    factors = {f.name: f for f in builtin_factors()}
    assert {n for n, f in factors.items() if f.origin == "builtin"} == set(FACTOR_NAMES)
    assert {n for n, f in factors.items() if f.origin == "gateway"} == {"backend", "model", "params", "system_prompt",
                                                                        "dialogue_state", "prompt_split", "context_prune"}
    # the prompt strategies are object factors whose schema lists their fields
    split = factors["prompt_split"].json_schema()["anyOf"][0]
    assert split["required"] == ["latency_budget_ms"] and set(split["properties"]) == {"prefill_tps", "latency_budget_ms",
                                                                                       "delimiter", "keep"}
    assert FactorRead.of(factors["context_prune"]).allowed == "a mapping"
    assert factors["kv_shards"].json_schema()["maximum"] == 64
    assert factors["precision"].json_schema()["enum"] == ["fp32", "bf16", "int8"]
    assert factors["sparse_ffn_k"].json_schema()["anyOf"][1] == {"type": "null"}
    read = FactorRead.of(factors["compression.tau"])
    assert read.allowed == "a number from 0 to 1" and read.default == 0.18


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "precision", "type": "string"}, "built-in or gateway factor"),
        ({"name": "params", "type": "string"}, "built-in or gateway factor"),
        ({"name": "compression.tau", "type": "number"}, "should match pattern"),
        ({"name": "engine", "type": "enum"}, "an enum needs `values`"),
        ({"name": "engine", "type": "enum", "values": ["a", "a"]}, "must not repeat"),
        ({"name": "tier", "type": "string", "values": ["a"]}, "`values` is for enums"),
        ({"name": "tier", "type": "boolean", "min": 0}, "`min`/`max` are for number and integer"),
        ({"name": "beam", "type": "integer", "min": 0.5}, "must be integers"),
        ({"name": "beam", "type": "integer", "min": 4, "max": 1}, "is above `max`"),
        ({"name": "beam", "type": "integer", "min": 1, "max": 4, "default": 9}, "default: beam=9 is not allowed"),
        ({"name": "beam", "type": "number", "max": float("inf")}, "finite"),
    ],
)
def test_incoherent_declarations_are_refused(body, message) -> None:
    with pytest.raises(ValidationError, match=message):
        FactorCreate.model_validate(body)


def test_declared_params_constrain_body_overrides_and_defaults_fill_attribution_levels() -> None:
    d = FactorCreate.model_validate({"name": "params.top_p", "type": "number", "min": 0, "max": 1, "default": 1})
    catalog = FactorCatalog([d.definition(d.name), FactorDef("engine", "enum", values=("a", "b"), default="a")])
    assert catalog.defaults() == {"params.top_p": 1, "engine": "a"}
    assert catalog.get("params.top_p").allowed() == "a number from 0 to 1"
    assert catalog.get("compression.tau").origin == "builtin"
    assert [f.name for f in catalog.all()][-2:] == ["engine", "params.top_p"]
    assert FactorDef("flag", "enum", values=(1, 2)).problem(True) is not None  # true is not 1
