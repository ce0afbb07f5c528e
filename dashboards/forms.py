"""Form logic without Streamlit: strategy factor pickers from the schema, weights that
sum to 100 %, the split preview, request bodies and field-level validation errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ablab.platform.registry.schemas import ExperimentCreate, ExperimentUpdate
from ablab.platform.strategy import Strategy


@dataclass(frozen=True, slots=True)
class Factor:
    """One picker: a flat factor name (``compression.tau``) and what the schema allows."""

    name: str
    kind: str  # "enum" | "int" | "float" | "bool" | "str"
    default: Any
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    help: str = ""

    @property
    def label(self) -> str:
        return self.name.replace(".", " · ").replace("_", " ")


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if ref:
        return schema["$defs"][ref.rsplit("/", 1)[1]]
    return node


def _factor(schema: Mapping[str, Any], name: str, node: Mapping[str, Any]) -> Factor:
    nullable = False
    options = node.get("anyOf")
    body = node
    if options:
        non_null = [o for o in options if o.get("type") != "null"]
        nullable = len(non_null) < len(options)
        body = non_null[0]
    body = {**_resolve(schema, body), **{k: v for k, v in body.items() if k != "$ref"}}
    default = node.get("default")
    if "enum" in body:
        return Factor(name, "enum", default, nullable, choices=tuple(body["enum"]), help=node.get("description", ""))
    kind = {"integer": "int", "number": "float", "boolean": "bool"}.get(body.get("type"), "str")
    return Factor(name, kind, default, nullable, body.get("minimum"), body.get("maximum"),
                  pattern=body.get("pattern"), help=node.get("description", ""))


def strategy_factors() -> list[Factor]:
    """Every factor the strategy schema defines, nested objects flattened."""
    schema = Strategy.model_json_schema()
    out = []
    for name, node in schema["properties"].items():
        if name == "schema_version":
            continue
        target = _resolve(schema, node)
        if target.get("type") == "object":
            for sub, subnode in target["properties"].items():
                out.append(_factor(schema, f"{name}.{sub}", subnode))
        else:
            out.append(_factor(schema, name, node))
    return out


def strategy_from_factors(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat factor values → the nested strategy dict, keeping only non-default choices."""
    defaults = Strategy().factors()
    nested: dict[str, Any] = {}
    for name, value in values.items():
        if value == defaults.get(name):
            continue
        if "." in name:
            head, tail = name.split(".", 1)
            nested.setdefault(head, {})[tail] = value
        else:
            nested[name] = value
    return nested


# -- weights -----------------------------------------------------------------------------
def complete_weights(leading: Sequence[int]) -> list[int]:
    """Percent weights of all variants: the given ones, and the last takes what is left."""
    total = sum(leading)
    if any(w < 1 for w in leading) or total > 100 - 1:
        raise ValueError(f"weights: the first {len(leading)} variants take {total}%; leave at least 1% for the last")
    return [*leading, 100 - total]


def even_weights(n: int) -> list[int]:
    base = 100 // n
    return [base + (1 if i < 100 - base * n else 0) for i in range(n)]


def slider_max(previous: Sequence[int], remaining_after: int) -> int:
    """Largest weight this slider may take so every later variant still gets ≥ 1 %."""
    return max(1, 100 - sum(previous) - remaining_after)


def split_preview(weights: Mapping[str, float], *, traffic: float, holdout: float = 0.0) -> list[dict[str, Any]]:
    """Share of all units landing in each variant, and outside the experiment."""
    total = sum(weights.values()) or 1.0
    eligible = (1 - holdout) * traffic
    rows = [{"segment": k, "share": eligible * w / total} for k, w in weights.items()]
    if holdout:
        rows.append({"segment": "holdout", "share": holdout})
    rows.append({"segment": "not in experiment", "share": max(0.0, 1 - holdout - eligible)})
    return rows


# -- targeting values --------------------------------------------------------------------
def parse_rule_value(text: str, op: str) -> Any:
    """Users type ``us, ca`` or ``3`` or ``"x"``; turn it into the JSON value the rule needs."""
    text = text.strip()
    if op in ("in", "not_in"):
        if text.startswith("["):
            return json.loads(text)
        return [_scalar(part) for part in text.split(",") if part.strip()]
    return _scalar(text)


def _scalar(text: str) -> Any:
    text = text.strip()
    try:
        return json.loads(text)
    except ValueError:
        return text


# -- validation --------------------------------------------------------------------------
def field_errors(exc: ValidationError) -> dict[str, str]:
    """pydantic errors keyed by dotted field path (``variants.1.weight``); model-level
    errors are attributed to the field they name when they name one."""
    out: dict[str, str] = {}
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if not loc:
            loc = _guess_field(msg)
        out.setdefault(loc, msg)
    return out


def _guess_field(message: str) -> str:
    for name in ("control", "variants", "forced", "layer_share", "guardrails", "targeting"):
        if name in message or (name == "variants" and "variant" in message):
            return name
    return "form"


def validate_create(body: Mapping[str, Any]) -> dict[str, str]:
    try:
        ExperimentCreate.model_validate(body)
    except ValidationError as exc:
        return field_errors(exc)
    return {}


def validate_update(body: Mapping[str, Any]) -> dict[str, str]:
    try:
        ExperimentUpdate.model_validate(body)
    except ValidationError as exc:
        return field_errors(exc)
    return {}


def diff_update(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that changed, so a PATCH never rewrites what the user did not touch."""
    return {k: v for k, v in wanted.items() if current.get(k) != v}
