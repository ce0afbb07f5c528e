"""Declarations no strategy could honour are refused, each naming the field at fault: body
fields the gateway owns, booleans or text given as numeric bounds, integers beyond what is
kept exactly, non-finite numbers."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ablab.platform.errors import refine_field
from ablab.platform.registry.factors.catalog import MAX_EXACT_INT, FactorCatalog, FactorDef, sets_factor
from ablab.platform.registry.factors.schemas import FactorCreate
from ablab.platform.strategy import open_strategy


def _refusal(body: dict | str) -> tuple[str, str]:
    """(field, message) as the API's problem+json would name them."""
    with pytest.raises(ValidationError) as caught:
        if isinstance(body, str):
            FactorCreate.model_validate_json(body)
        else:
            FactorCreate.model_validate(body)
    first = caught.value.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "body"
    return refine_field(loc, first["msg"])


@pytest.mark.parametrize(("name", "why"), [
    ("params.stream", "the caller decides whether to stream"),
    ("params.messages", "the caller's messages are not a factor"),
    ("params.prompt", "the caller's prompt is not a factor"),
    ("params.stream_options", "the gateway manages stream options"),
    ("params.user", "identifies the unit"),
    ("params.model", "set the `model` factor instead"),
])
def test_body_fields_the_gateway_owns_cannot_be_declared(name: str, why: str) -> None:
    field, message = _refusal({"name": name, "type": "boolean"})
    assert field == "name"
    assert f"'{name}' cannot be declared" in message and why in message
    # ... because no strategy may set them: the declaration would be a factor nobody can use
    with pytest.raises(ValidationError, match="not overridable"):
        open_strategy({"params": {name.split(".", 1)[1]: True}})


def test_a_body_field_a_strategy_may_set_is_still_declarable() -> None:
    declared = FactorCreate.model_validate({"name": "params.stream_mode", "type": "string"})
    assert declared.name == "params.stream_mode"


@pytest.mark.parametrize(("body", "field", "says"), [
    ('{"name": "x", "type": "number", "min": true}', "min", "expected a number, got boolean true"),
    ('{"name": "x", "type": "number", "max": false}', "max", "expected a number, got boolean false"),
    ('{"name": "x", "type": "integer", "min": false, "max": 3}', "min", "expected a number, got boolean false"),
    ('{"name": "x", "type": "number", "min": "1"}', "min", 'expected a number, got text "1"'),
    ('{"name": "x", "type": "number", "default": true}', "default", "x=true is not allowed; allowed: a number"),
    ('{"name": "x", "type": "integer", "default": false}', "default", "x=false is not allowed; allowed: an integer"),
])
def test_booleans_are_not_numbers(body: str, field: str, says: str) -> None:
    got, message = _refusal(body)
    assert got == field and says in message


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "type": "integer", "min": 2**53}, "min"),
    ({"name": "x", "type": "integer", "max": -(2**53) - 1}, "max"),
    ({"name": "x", "type": "integer", "min": 0, "max": 2**63}, "max"),
    ({"name": "x", "type": "integer", "default": 2**53}, "default"),
    ({"name": "x", "type": "integer", "default": -(2**60)}, "default"),
    ({"name": "x", "type": "enum", "values": [1, 2**53]}, "values.1"),
])
def test_integers_beyond_two_to_the_53_are_refused(body: dict, field: str) -> None:
    got, message = _refusal(body)
    assert got == field and str(MAX_EXACT_INT) in message


def test_integers_up_to_two_to_the_53_minus_one_are_kept_exactly() -> None:
    declared = FactorCreate.model_validate(
        {"name": "x", "type": "integer", "min": -MAX_EXACT_INT, "max": MAX_EXACT_INT, "default": MAX_EXACT_INT})
    assert (declared.min, declared.max, declared.default) == (-MAX_EXACT_INT, MAX_EXACT_INT, MAX_EXACT_INT)
    assert int(declared.max) == 2**53 - 1  # a float64 holds it exactly
    big = FactorCreate.model_validate({"name": "y", "type": "number", "max": 1e300})  # floats are floats
    assert big.max == 1e300


def test_a_strategy_level_beyond_two_to_the_53_is_refused() -> None:
    catalog = FactorCatalog([FactorDef("seed_base", "integer")])
    assert catalog.problems(open_strategy({"seed_base": MAX_EXACT_INT})) == []
    [(name, why)] = catalog.problems(open_strategy({"seed_base": 2**53 + 1}))
    assert name == "seed_base" and "2**53 - 1" in why


@pytest.mark.parametrize(("body", "field"), [
    ('{"name": "x", "type": "number", "max": Infinity}', "max"),
    ('{"name": "x", "type": "number", "min": -Infinity}', "min"),
    ('{"name": "x", "type": "number", "min": NaN}', "min"),
    ('{"name": "x", "type": "number", "default": NaN}', "default"),
    ('{"name": "x", "type": "enum", "values": [1, Infinity]}', "values.1"),
])
def test_non_finite_numbers_are_refused_naming_the_field(body: str, field: str) -> None:
    got, message = _refusal(json.dumps(json.loads(body)))  # Python's json reads NaN/Infinity, as FastAPI's does
    assert got == field and ("finite" in message or "not a level" in message)


def test_sets_factor_reads_top_level_and_params_factors() -> None:
    strategy = {"engine": "vllm", "params": {"temperature": 0.2}, "kv_shards": 1}
    assert sets_factor(strategy, "engine") and sets_factor(strategy, "params.temperature")
    assert not sets_factor(strategy, "tier") and not sets_factor(strategy, "params.top_p")
    assert not sets_factor({}, "params.temperature") and not sets_factor(None, "engine")
