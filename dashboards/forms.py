"""Form logic without Streamlit: strategy factor pickers from the factor catalog, weights that
sum to 100 %, the split preview, request bodies and field-level validation errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ablab.platform.registry.factors.catalog import FactorCatalog, FactorDef
from ablab.platform.registry.schemas import ExperimentCreate, ExperimentUpdate
from ablab.platform.strategy import Strategy


@dataclass(frozen=True, slots=True)
class Factor:
    """One picker: a flat factor name (``compression.tau``, ``params.temperature``,
    ``engine``) and what the catalog allows."""

    name: str
    kind: str  # "enum" | "int" | "float" | "bool" | "str" | "text" (long text) | "json" (a mapping)
    default: Any
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()
    pattern: str | None = None
    help: str = ""
    origin: str = "builtin"  # builtin | gateway | declared

    @property
    def label(self) -> str:
        return self.name.replace(".", " · ").replace("_", " ")


_KINDS = {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "object": "json", "enum": "enum"}


def _picker(d: FactorDef) -> Factor:
    kind = "text" if d.name == "system_prompt" else _KINDS.get(d.type, "str")
    # A declared factor left out means its default (or, without one, "not set").
    nullable = d.nullable or (d.origin == "declared" and d.default is None) or d.origin == "gateway"
    return Factor(d.name, kind, d.default, nullable, d.min, d.max, tuple(d.values or ()), d.pattern, d.description, d.origin)


def declared_catalog(items: Sequence[Mapping[str, Any]] | None) -> FactorCatalog:
    """The declared factors of a ``GET /v1/factors`` answer, as a catalog to validate with."""
    return FactorCatalog(
        FactorDef(i["name"], i["type"], "declared", tuple(i["values"]) if i.get("values") is not None else None,
                  i.get("min"), i.get("max"), i.get("default"), i.get("description") or "")
        for i in items or () if i.get("origin") == "declared"
    )


def strategy_factors(catalog: FactorCatalog | None = None) -> list[Factor]:
    """Every factor a strategy may set: built-in, gateway, then declared ones."""
    return [_picker(d) for d in (catalog or FactorCatalog()).all()]


def strategy_from_factors(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat factor values → the nested strategy dict, keeping only choices that say
    something: built-in factors off their default, gateway and declared factors set."""
    defaults = Strategy().factors()
    nested: dict[str, Any] = {}
    for name, value in values.items():
        if (value == defaults[name]) if name in defaults else (value is None or value == "" or value == {}):
            continue
        if name == "params":
            nested.setdefault("params", {}).update(value)
        elif "." in name:  # a built-in object's field, or params.<field>
            head, tail = name.split(".", 1)
            nested.setdefault(head, {})[tail] = value
        else:
            nested[name] = value
    return nested


def parse_params(text: str) -> dict[str, Any]:
    """The ``params`` picker: a JSON object of request-body overrides (empty = none)."""
    text = text.strip()
    if not text:
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError('params: write a JSON object such as {"temperature": 0.2, "max_tokens": 256}')
    return value


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


def validate_create(body: Mapping[str, Any], catalog: FactorCatalog | None = None) -> dict[str, str]:
    """Field errors of a create body; with the catalog, strategies are checked as the API does."""
    try:
        ExperimentCreate.model_validate(body, context={"factors": catalog} if catalog is not None else None)
    except ValidationError as exc:
        return field_errors(exc)
    return {}


def validate_update(body: Mapping[str, Any], catalog: FactorCatalog | None = None) -> dict[str, str]:
    try:
        ExperimentUpdate.model_validate(body, context={"factors": catalog} if catalog is not None else None)
    except ValidationError as exc:
        return field_errors(exc)
    return {}


def diff_update(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that changed, so a PATCH never rewrites what the user did not touch."""
    return {k: v for k, v in wanted.items() if current.get(k) != v}
