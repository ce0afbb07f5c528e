"""Form logic without Streamlit: strategy factor pickers from the factor catalog, weights that
sum to 100 %, the split preview, request bodies and field-level validation errors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ablab.platform.errors import refine_field
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
    # Batch size, window and SLOs mean nothing without a batching policy (the strategy model
    # refuses them): a widget moved while the policy is "none" is not a choice to send.
    if "batching" in nested and nested["batching"].get("policy", "none") == "none":
        del nested["batching"]
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
        loc, msg = refine_field(".".join(str(p) for p in err.get("loc", ())), str(err.get("msg", "invalid")))
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


# -- custom metrics and segments (metrics.custom, metrics.segments) -----------------------
CUSTOM_TYPES = ("mean", "proportion", "ratio", "quantile")
AGGREGATIONS = ("request", "unit_mean", "unit_sum")
CUSTOM_COLUMNS = ("name", "type", "column", "numerator", "denominator", "aggregation", "scale", "quantile",
                  "lower_is_better", "cuped")
"""The editor table's columns; ``cuped`` is empty (none), ``pre_period`` or a covariate source."""


def _blank(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and value != value:  # NaN from an emptied table cell
        return True
    return isinstance(value, str) and not value.strip()


def custom_rows(custom: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """``metrics.custom`` as the editor's table rows (one per metric, every column present)."""
    out = []
    for m in custom or []:
        cuped = m.get("cuped")
        covariate = cuped.get("covariate") if isinstance(cuped, Mapping) else cuped
        out.append({
            "name": m.get("name", ""), "type": m.get("type", "mean"), "column": m.get("column"),
            "numerator": m.get("numerator"), "denominator": m.get("denominator"),
            "aggregation": m.get("aggregation", "request"), "scale": m.get("scale"), "quantile": m.get("quantile"),
            "lower_is_better": bool(m.get("lower_is_better", False)), "cuped": covariate,
        })
    return out


def custom_from_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The editor's table back to ``metrics.custom``: empty cells dropped, rows without a name
    skipped (a half-typed new row), ``cuped`` as ``{covariate: …}``. The API validates the rest
    and its messages appear under the table."""
    out = []
    for row in rows:
        if _blank(row.get("name")):
            continue
        metric: dict[str, Any] = {}
        for column in CUSTOM_COLUMNS:
            value = row.get(column)
            if _blank(value):
                continue
            if isinstance(value, str):
                value = value.strip()
            if column == "cuped":
                metric["cuped"] = {"covariate": value}
            elif column == "lower_is_better":
                if bool(value):
                    metric["lower_is_better"] = True
            elif column == "aggregation" and value == "request":
                continue
            elif column in ("scale", "quantile"):
                metric[column] = float(value)
            else:
                metric[column] = value
        out.append(metric)
    return out


def parse_segments(text: str) -> list[str]:
    """``dims.domain, dims.length`` → ``["dims.domain", "dims.length"]`` (order kept, no repeats)."""
    out: list[str] = []
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if part and part not in out:
            out.append(part)
    return out


def errors_under(errors: Mapping[str, str], prefix: str) -> list[str]:
    """The API's messages for ``prefix`` and anything below it (``metrics.custom.1.column``),
    each with the path that locates it."""
    return [f"{key}: {msg}" if key != prefix else msg for key, msg in errors.items()
            if key == prefix or key.startswith(prefix + ".")]
