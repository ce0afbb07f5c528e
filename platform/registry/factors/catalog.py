"""The factor catalog: every factor a strategy may set, with what each allows.

Pure logic (no database): built-in factors come from the strategy schema, gateway
factors from :class:`~ablab.platform.strategy.OpenStrategy`, declared factors from the
registry (``POST /v1/factors``). A strategy validated against a catalog names each
undeclared factor and each bad value with what is allowed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from ablab.platform.strategy import GATEWAY_FACTORS, OpenStrategy, Strategy

DECLARED_TYPES = ("number", "integer", "string", "boolean", "enum")
ORIGINS = ("builtin", "gateway", "declared")
# The largest integer every reader of a level keeps exactly: bounds live in float64
# columns, and JSON readers that parse numbers as doubles (JavaScript, ClickHouse's JSON
# functions) cannot tell 2**53 + 1 from 2**53. Integer levels beyond it are refused, not
# rounded somewhere downstream.
MAX_EXACT_INT = 2**53 - 1


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``True`` is not ``1``."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _fmt(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else repr(x) if isinstance(x, str) else str(x).lower() if isinstance(x, bool) else str(x)


@dataclass(frozen=True)
class FactorDef:
    """One factor: a flat name (``compression.tau``, ``params.temperature``, ``engine``)."""

    name: str
    type: str  # number | integer | string | boolean | enum | object
    origin: str = "declared"  # builtin | gateway | declared
    values: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    default: Any = None
    description: str = ""
    nullable: bool = False
    pattern: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # schema keywords kept as given (maxLength...)

    def allowed(self) -> str:
        """What a level may be, in words (used in error messages and the UI)."""
        if self.type == "enum":
            return "one of " + ", ".join(_fmt(v) for v in self.values or ())
        kind = {"number": "a number", "integer": "an integer", "string": "text", "boolean": "true or false",
                "object": "a mapping"}[self.type]
        if self.min is not None and self.max is not None:
            return f"{kind} from {_fmt(self.min)} to {_fmt(self.max)}"
        if self.min is not None:
            return f"{kind} ≥ {_fmt(self.min)}"
        if self.max is not None:
            return f"{kind} ≤ {_fmt(self.max)}"
        return kind

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a level of this factor, or None."""
        ok = {
            "number": isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "string": isinstance(value, str),
            "boolean": isinstance(value, bool),
            "enum": any(_same(value, v) for v in self.values or ()),
            "object": isinstance(value, Mapping),
        }[self.type]
        if ok and self.type == "integer" and abs(value) > MAX_EXACT_INT:
            return f"{self.name}={value} is not allowed; integers are kept exactly only up to ±{MAX_EXACT_INT} (2**53 - 1)"
        if ok and self.type in ("number", "integer"):
            ok = (self.min is None or value >= self.min) and (self.max is None or value <= self.max)
        if ok or (value is None and self.nullable):
            return None
        return f"{self.name}={_fmt(value)} is not allowed; allowed: {self.allowed()}"

    def json_schema(self) -> dict[str, Any]:
        if self.type == "enum":
            body: dict[str, Any] = {"enum": list(self.values or ())}
        else:
            body = {"type": self.type}
        if self.min is not None:
            body["minimum"] = self.min
        if self.max is not None:
            body["maximum"] = self.max
        if self.pattern:
            body["pattern"] = self.pattern
        body.update(self.extra)
        if self.nullable:
            body = {"anyOf": [body, {"type": "null"}]}
        if self.default is not None or self.nullable:
            body["default"] = self.default
        if self.description:
            body["description"] = self.description
        return {"title": self.name, **body}


# ---------------------------------------------------------------- built-in and gateway


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    return schema["$defs"][ref.rsplit("/", 1)[1]] if ref else node


def _from_schema(schema: Mapping[str, Any], name: str, node: Mapping[str, Any], origin: str) -> FactorDef:
    options = node.get("anyOf")
    body: Mapping[str, Any] = node
    nullable = False
    if options:
        non_null = [o for o in options if o.get("type") != "null"]
        nullable = len(non_null) < len(options)
        body = non_null[0]
    body = {**_resolve(schema, body), **{k: v for k, v in body.items() if k != "$ref"}}
    default = node.get("default")
    # an object factor (the gateway's prompt strategies) keeps its fields' schema, so
    # GET /v1/factors shows what it takes
    extra = {k: body[k] for k in ("minLength", "maxLength", "exclusiveMinimum", "properties", "required") if k in body}
    if "enum" in body:
        return FactorDef(name, "enum", origin, tuple(body["enum"]), default=default, description=node.get("description", ""), nullable=nullable)
    return FactorDef(name, body.get("type", "string"), origin, None, body.get("minimum"), body.get("maximum"), default,
                     node.get("description", ""), nullable, body.get("pattern"), extra)


@cache
def builtin_factors() -> tuple[FactorDef, ...]:
    """The built-in (runtime) factors, then the gateway's, from the strategy schema."""
    schema = OpenStrategy.model_json_schema()
    out = []
    for name, node in schema["properties"].items():
        if name == "schema_version":
            continue
        origin = "gateway" if name in GATEWAY_FACTORS else "builtin"
        target = _resolve(schema, node)
        if target.get("type") == "object" and "properties" in target:
            out += [_from_schema(schema, f"{name}.{sub}", subnode, origin) for sub, subnode in target["properties"].items()]
        elif name == "params":
            out.append(FactorDef("params", "object", origin, default={}, description=node.get("description", "")))
        else:
            out.append(_from_schema(schema, name, node, origin))
    assert {f.name for f in out if f.origin == "builtin"} == set(Strategy().factors())
    return tuple(out)


# ---------------------------------------------------------------- the catalog


class FactorCatalog:
    """Built-in, gateway and declared factors; checks strategies (see ``FactorChecker``)."""

    def __init__(self, declared: Iterable[FactorDef] = ()) -> None:
        self.declared: dict[str, FactorDef] = {d.name: d for d in declared}

    def all(self) -> list[FactorDef]:
        return [*builtin_factors(), *sorted(self.declared.values(), key=lambda d: d.name)]

    def get(self, name: str) -> FactorDef | None:
        return self.declared.get(name) or next((f for f in builtin_factors() if f.name == name), None)

    def defaults(self) -> dict[str, Any]:
        """Declared factors' defaults: the level of a variant that leaves the factor out."""
        return {name: d.default for name, d in self.declared.items() if d.default is not None}

    def _suggest(self, name: str) -> str:
        names = [f.name for f in self.all()] + list(OpenStrategy.model_fields)
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        return f" (did you mean '{close[0]}'?)" if close else ""

    def problems(self, strategy: OpenStrategy) -> list[tuple[str, str]]:
        """(flat factor name, message) for every undeclared factor and bad value."""
        out = []
        for name, value in strategy.declared().items():
            spec = self.declared.get(name)
            if spec is None:
                out.append((name, f"factor '{name}' is not declared{self._suggest(name)}; declare it with POST /v1/factors "
                                  "(or a `factors:` section for `ablab apply`); GET /v1/factors lists every factor"))
            elif (why := spec.problem(value)) is not None:
                out.append((name, why))
        for key, value in strategy.params.items():
            spec = self.declared.get(f"params.{key}")
            if spec is not None and (why := spec.problem(value)) is not None:
                out.append((f"params.{key}", why))
        return out


def sets_factor(strategy: Mapping[str, Any] | None, name: str) -> bool:
    """Whether a stored strategy mapping sets the factor ``name`` (``engine`` at the top,
    ``params.temperature`` inside ``params``)."""
    data = strategy or {}
    if name.startswith("params."):
        params = data.get("params")
        return isinstance(params, Mapping) and name.split(".", 1)[1] in params
    return name in data


def _int_beyond(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > MAX_EXACT_INT


def definition_problems(d: FactorDef) -> list[tuple[str, str]]:
    """Why a declaration is not coherent (values only for enums, a range only for numbers...),
    as ``(field, why)`` so the refusal names the field at fault."""
    out: list[tuple[str, str]] = []
    if d.type not in DECLARED_TYPES:
        out.append(("type", f"type must be one of {', '.join(DECLARED_TYPES)}"))
        return out
    bound = "min" if d.min is not None else "max"
    if d.type == "enum":
        if not d.values:
            out.append(("values", "an enum needs `values`: the allowed levels"))
        elif len({repr(v) for v in d.values}) != len(d.values):
            out.append(("values", "`values` must not repeat a level"))
        for i, v in enumerate(d.values or ()):
            if isinstance(v, int) and _int_beyond(v):
                out.append((f"values[{i}]", f"{v} is beyond ±{MAX_EXACT_INT} (2**53 - 1), the largest integer kept exactly"))
    elif d.values is not None:
        out.append(("values", f"`values` is for enums; a {d.type} factor takes `min`/`max` or nothing"))
    if d.type not in ("number", "integer") and (d.min is not None or d.max is not None):
        out.append((bound, f"`min`/`max` are for number and integer factors, not {d.type}"))
    if d.type == "integer":
        for name, b in (("min", d.min), ("max", d.max)):
            if b is not None and not float(b).is_integer():
                out.append((name, "`min`/`max` of an integer factor must be integers"))
            # Bounds are float64 columns: beyond 2**53 - 1 the stored bound is not the one given.
            elif _int_beyond(b):
                out.append((name, f"{int(b)} is beyond ±{MAX_EXACT_INT} (2**53 - 1): an integer bound is stored "
                                  "as a float64, exact only up to there"))
    if d.min is not None and d.max is not None and d.min > d.max:
        out.append(("min", f"`min` ({_fmt(d.min)}) is above `max` ({_fmt(d.max)})"))
    if d.default is not None and not out and (why := d.problem(d.default)) is not None:
        out.append(("default", why))
    return out
