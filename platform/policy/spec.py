"""The policy object: a variant's strategy that chooses, per request, one of named arms.

A variant's ``strategy`` may be ``{policy: {...}}`` (docs/policies.md)::

    policy:
      kind: slo_router              # best predicted objective among arms meeting the SLO
      arms: {terse: {system_prompt: "..."}, helpful: {system_prompt: "...", params: {temperature: 0.7}}}
      features: [prompt_tokens, max_tokens, attr.plan]
      slo: {<latency>_p95: 400}     # a catalogue latency (time to first token, say) and its quantile
      objective: accuracy
      explore: 0.05

    policy:
      kind: rule                    # the first rule whose conditions all hold picks its arm
      arms: {terse: {...}, helpful: {...}}
      rules:
        - {when: {prompt_tokens: {gt: 800}}, arm: terse}
      default: helpful

``kind: fixed`` (``{kind: fixed, arm: X}``) names one arm: the candidate "always X" of
off-policy evaluation, where X is a logged variant or arm (``arms`` may be left out).

Each arm is an ordinary strategy mapping, checked by :func:`ablab.platform.strategy.open_strategy`
(with the deployment's factor catalog when validation is given ``context={"factors": ...}``).
Metrics are the stats catalogue's, plus the experiment's custom metrics passed as
``context={"custom": {name: lower_is_better}}``; SLOs may bound only the latencies the field
catalogue (:mod:`ablab.platform.fields`) marks as SLO-able. Every refusal is a pydantic
``ValidationError`` whose location names the field (``explore``, ``slo.<latency>_p50``,
``rules.1``).

Pure declarations and checks: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ablab.platform.fields import FIELDS
from ablab.platform.stats.metrics import METRICS
from ablab.platform.strategy import open_strategy

ARM_NAME = r"^[a-z][a-z0-9_]{0,63}$"
MAX_ARMS = 16
MAX_FEATURES = 8
MAX_RULES = 64
NUMERIC_FEATURES: tuple[str, ...] = ("prompt_tokens", "max_tokens")
"""Token counts of the request: non-negative integers (``max_tokens``: the caller's cap)."""
ATTR_PREFIX = "attr."
_ATTR_RE = re.compile(r"^attr\.[a-z][a-z0-9_]{0,63}$")
SLO_QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
LATENCIES: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.slo and f.unit == "ms")
"""Fields an SLO may bound: the catalogue's SLO-able millisecond fields."""

# Proportions whose per-request value is not a field: metric → source on the request.
_PROPORTION_SOURCES: dict[str, str] = {"accuracy": "correct", "error_rate": "error"}


def _per_request_metrics() -> dict[str, tuple[str, bool]]:
    """Built-in metrics that are a mean of one per-request value (the only ones a per-request
    model or an off-policy estimate can average): metric → (source, lower is better). Read
    from the stats catalogue, so a field it adds as a mean is a policy objective too."""
    out: dict[str, tuple[str, bool]] = {}
    for m in METRICS.values():
        if m.kind == "mean" and m.numerator.endswith("_sum") and m.numerator[:-4] in FIELDS:
            out[m.name] = (m.numerator[:-4], m.lower_is_better)
        elif m.kind == "proportion" and m.name in _PROPORTION_SOURCES:
            out[m.name] = (_PROPORTION_SOURCES[m.name], m.lower_is_better)
    return out


PER_REQUEST_METRICS: dict[str, tuple[str, bool]] = _per_request_metrics()


class PolicyInvalid(ValueError):
    """A policy, or what it is evaluated on, is unusable; ``field`` names where (a 422's field)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _err(kind: str, message: str) -> PydanticCustomError:
    # the message goes through the context: a template would read any brace in it as a field
    return PydanticCustomError(kind, "{message}", {"message": message})


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- features


def check_feature(name: str) -> str:
    if name in NUMERIC_FEATURES or _ATTR_RE.match(name):
        return name
    raise ValueError(f"unknown feature {name!r}; features are {', '.join(NUMERIC_FEATURES)} or attr.<name> "
                     "(a targeting attribute, lowercase snake_case)")


def is_numeric(feature: str) -> bool:
    return feature in NUMERIC_FEATURES


FeatureName = Annotated[str, Field(min_length=1, max_length=70)]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True, slots=True)
class Objective:
    """A metric as a per-request value: where it is read and which way is better."""

    metric: str
    source: str  # a catalogue field of the request, correct, score, error or measures.<name>
    lower_is_better: bool


def objective_of(metric: str, custom: Mapping[str, Any] | None = None) -> Objective:
    """The per-request reading of ``metric``: a built-in mean/proportion, or an experiment's
    custom mean/proportion over requests (``custom``: name → CustomMetric or lower_is_better).
    ValueError says why any other metric has no per-request value."""
    if metric in PER_REQUEST_METRICS:
        source, lower = PER_REQUEST_METRICS[metric]
        return Objective(metric, source, lower)
    if custom and metric in custom:
        m = custom[metric]
        if isinstance(m, bool):
            return Objective(metric, f"custom:{metric}", m)
        kind, column, aggregation = getattr(m, "kind", None), getattr(m, "column", None), getattr(m, "aggregation", None)
        if kind in ("mean", "proportion") and column and aggregation == "request":
            return Objective(metric, str(column), bool(m.lower_is_better))
        raise ValueError(f"{metric!r} is a {kind} ({aggregation}) metric; a policy objective is a mean of one value "
                         "per request (type mean or proportion, aggregation request)")
    if metric in METRICS:
        raise ValueError(f"{metric!r} is not a mean of one value per request (a quantile, ratio or goodput); "
                         f"use one of {', '.join(PER_REQUEST_METRICS)} or a custom mean/proportion")
    known = [*PER_REQUEST_METRICS, *(custom or {})]
    raise ValueError(f"unknown metric {metric!r}; known: {', '.join(known)}")


@dataclass(frozen=True, slots=True)
class SloBound:
    """One SLO: ``key`` as written (``<latency>_p95``), the latency, its quantile (None: the mean), the bound."""

    key: str
    latency: str
    quantile: float | None
    max_ms: float


def slo_bound(key: str, value: float) -> SloBound:
    for name in LATENCIES:
        if key == name:
            return SloBound(key, name, None, value)
        if key.startswith(name + "_") and key[len(name) + 1:] in SLO_QUANTILES:
            return SloBound(key, name, SLO_QUANTILES[key[len(name) + 1:]], value)
    base = next((f for f in FIELDS if key == f or key.startswith(f + "_")), None)
    if base is not None and base not in LATENCIES:
        raise ValueError(f"{base} is not a latency; an SLO bounds one of {', '.join(LATENCIES)}")
    raise ValueError(f"unknown SLO {key!r}; write <latency> (its mean) or <latency>_<q> with latency in "
                     f"{', '.join(LATENCIES)} and q in {', '.join(SLO_QUANTILES)}")


# --------------------------------------------------------------------------- arms


def _arms(arms: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
    ctx = info.context if isinstance(info.context, Mapping) else {}
    out: dict[str, dict[str, Any]] = {}
    for name, strategy in arms.items():
        if not re.match(ARM_NAME, name):
            raise _err("arm_name", f"arm {name!r}: names are lowercase letters, digits and _ ({ARM_NAME})")
        if isinstance(strategy, Mapping) and "policy" in strategy:
            raise _err("nested_policy", f"arm {name!r}: an arm is an ordinary strategy, not another policy")
        try:
            parsed = open_strategy(strategy, factors=ctx.get("factors"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            why = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            raise _err("arm_strategy", f"arm {name!r}: {where + ': ' if where else ''}{why}") from None
        out[name] = parsed.model_dump(mode="json", exclude_defaults=True)
    return out


ArmMap = Annotated[dict[Annotated[str, Field(max_length=64)], dict[str, Any]],
                   Field(min_length=1, max_length=MAX_ARMS, description="Arm name → an ordinary strategy mapping.")]


class _PolicyBase(_Frozen):
    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @property
    def content_hash(self) -> str:
        """Stable across processes: the policy's identity inside a model version."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    @property
    def arm_names(self) -> tuple[str, ...]:
        raise NotImplementedError


class SloRouter(_PolicyBase):
    """Per request: the arm with the best predicted ``objective`` among those whose predicted
    latency meets every SLO (none: the lowest predicted latency), each arm keeping ``explore``."""

    kind: Literal["slo_router"]
    arms: ArmMap
    features: list[FeatureName] = Field(default_factory=lambda: ["prompt_tokens"], max_length=MAX_FEATURES)
    slo: dict[str, float] = Field(min_length=1, max_length=4, description="{<latency>_<q> or <latency>: max ms}")
    objective: str = Field(min_length=1, max_length=64)
    explore: float = Field(gt=0.0, lt=1.0, description="Probability every arm keeps, whatever the model predicts.")

    @field_validator("arms")
    @classmethod
    def _check_arms(cls, arms: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        if len(arms) < 2:
            raise _err("too_few_arms", "a router needs at least two arms to choose between")
        return _arms(arms, info)

    @field_validator("features")
    @classmethod
    def _features(cls, features: list[str]) -> list[str]:
        for i, name in enumerate(features):
            try:
                check_feature(name)
            except ValueError as exc:
                raise _err("feature", f"[{i}] {exc}") from None
        if len(set(features)) != len(features):
            raise _err("feature", "a feature is listed twice")
        return features

    @field_validator("slo")
    @classmethod
    def _slo(cls, slo: dict[str, float]) -> dict[str, float]:
        for key, value in slo.items():
            try:
                slo_bound(key, value)
            except ValueError as exc:
                raise _err("slo", f"{key}: {exc}") from None
            if not (math.isfinite(value) and value > 0):
                raise _err("slo", f"{key}: the bound must be a positive number of ms, got {value}")
        return slo

    @field_validator("objective")
    @classmethod
    def _objective(cls, metric: str, info: ValidationInfo) -> str:
        ctx = info.context if isinstance(info.context, Mapping) else {}
        try:
            objective_of(metric, ctx.get("custom"))
        except ValueError as exc:
            raise _err("objective", str(exc)) from None
        return metric

    @model_validator(mode="after")
    def _floor_fits(self) -> SloRouter:
        if self.explore * len(self.arms) > 1.0 + 1e-12:
            raise _err("explore", f"explore: {self.explore:g} × {len(self.arms)} arms exceeds 1; at most "
                                  f"{1.0 / len(self.arms):.4g} with {len(self.arms)} arms")
        return self

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(self.arms)

    def slos(self) -> tuple[SloBound, ...]:
        return tuple(slo_bound(k, v) for k, v in self.slo.items())

    def objective_def(self, custom: Mapping[str, Any] | None = None) -> Objective:
        return objective_of(self.objective, custom)


# --------------------------------------------------------------------------- rules

Number = Annotated[float, Field(allow_inf_nan=False)]


class Condition(_Frozen):
    """Bounds on one feature; every bound given must hold. A condition on a feature the
    request lacks is false."""

    lt: Number | None = None
    le: Number | None = None
    gt: Number | None = None
    ge: Number | None = None
    eq: Number | str | None = None
    ne: Number | str | None = None
    in_: list[Number | str] | None = Field(default=None, alias="in", max_length=256)
    not_in: list[Number | str] | None = Field(default=None, max_length=256)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _something(self) -> Condition:
        if not self.model_dump(exclude_none=True):
            raise _err("condition", "a condition needs at least one of lt, le, gt, ge, eq, ne, in, not_in")
        return self


class Rule(_Frozen):
    when: dict[FeatureName, Condition] = Field(default_factory=dict, max_length=MAX_FEATURES,
                                               description="Feature → condition; all must hold (empty: always).")
    arm: str


@dataclass(slots=True)
class _Region:
    """The feature values one rule admits, per feature: an integer interval less some points
    (token counts), or a set of allowed / excluded strings (attributes). Absent: unconstrained."""

    lo: float = 0.0
    hi: float = math.inf
    out: frozenset[float] = frozenset()
    allowed: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()

    def empty(self, numeric: bool) -> bool:
        if numeric:
            if self.lo > self.hi:
                return True
            return self.hi - self.lo < len(self.out) + 1 and all(
                float(v) in self.out for v in range(int(self.lo), int(self.hi) + 1))
        return self.allowed is not None and not (self.allowed - self.excluded)

    def contains(self, other: _Region, numeric: bool) -> bool:
        if numeric:
            inner = [v for v in self.out if other.lo <= v <= other.hi and v not in other.out]
            return self.lo <= other.lo and other.hi <= self.hi and not inner
        mine = None if self.allowed is None else self.allowed - self.excluded
        if other.allowed is not None:
            theirs = other.allowed - other.excluded
            return theirs <= mine if mine is not None else not (theirs & self.excluded)
        return mine is None and self.excluded <= other.excluded


def _region(feature: str, cond: Condition, where: str = "") -> _Region:
    numeric = is_numeric(feature)
    r = _Region()
    values = cond.model_dump(by_alias=True, exclude_none=True)
    for op, value in values.items():
        items = value if isinstance(value, list) else [value]
        if numeric:
            if any(isinstance(v, str) for v in items):
                raise _err("condition", f"{where}{feature}.{op}: {feature} is a token count; compare it with numbers")
            nums = [float(v) for v in items]
            if op == "lt":
                r.hi = min(r.hi, math.ceil(nums[0]) - 1)
            elif op == "le":
                r.hi = min(r.hi, math.floor(nums[0]))
            elif op == "gt":
                r.lo = max(r.lo, math.floor(nums[0]) + 1)
            elif op == "ge":
                r.lo = max(r.lo, math.ceil(nums[0]))
            elif op in ("eq", "in"):
                ints = sorted({v for v in nums if v.is_integer() and v >= 0})
                if not ints:
                    r.lo, r.hi = 1.0, 0.0
                else:
                    r.lo, r.hi = max(r.lo, ints[0]), min(r.hi, ints[-1])
                    r.out = r.out | frozenset(float(v) for v in range(int(ints[0]), int(ints[-1]) + 1) if v not in ints) \
                        if ints[-1] - ints[0] < 10_000 else r.out
            else:  # ne, not_in
                r.out = r.out | frozenset(v for v in nums if v.is_integer())
        else:
            if op in ("lt", "le", "gt", "ge"):
                raise _err("condition", f"{where}{feature}.{op}: attributes are text; use eq, ne, in or not_in")
            texts = frozenset(str(v) for v in items)
            if op in ("eq", "in"):
                r.allowed = texts if r.allowed is None else r.allowed & texts
            else:
                r.excluded = r.excluded | texts
    return r


class RulePolicy(_PolicyBase):
    """Ordered rules over features; the first whose conditions all hold picks its arm, else
    ``default``. ``explore`` (optional) keeps that probability on every arm, so the rule's
    logs support off-policy evaluation of other arms."""

    kind: Literal["rule"]
    arms: ArmMap
    rules: list[Rule] = Field(min_length=1, max_length=MAX_RULES)
    default: str
    explore: float = Field(default=0.0, ge=0.0, lt=1.0)

    @field_validator("arms")
    @classmethod
    def _check_arms(cls, arms: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        return _arms(arms, info)

    @model_validator(mode="after")
    def _reachable(self) -> RulePolicy:
        arms = set(self.arms)
        if self.default not in arms:
            raise _err("default", f"default: unknown arm {self.default!r}; arms: {', '.join(self.arms)}")
        regions: list[dict[str, _Region]] = []
        for i, rule in enumerate(self.rules):
            if rule.arm not in arms:
                raise _err("rules", f"rules.{i}.arm: unknown arm {rule.arm!r}; arms: {', '.join(self.arms)}")
            region: dict[str, _Region] = {}
            for feature, cond in rule.when.items():
                try:
                    check_feature(feature)
                except ValueError as exc:
                    raise _err("rules", f"rules.{i}.when.{feature}: {exc}") from None
                region[feature] = _region(feature, cond, f"rules.{i}.when.")
                if region[feature].empty(is_numeric(feature)):
                    raise _err("rules", f"rules.{i}.when.{feature}: no value satisfies this condition, so the rule "
                               "can select nothing")
            for j, earlier in enumerate(regions):
                if all(f in region and earlier[f].contains(region[f], is_numeric(f)) for f in earlier):
                    raise _err("rules", f"rules.{i}: every request it matches is taken by rules.{j} first, so the "
                               "rule can select nothing")
            regions.append(region)
        if self.explore * len(self.arms) > 1.0 + 1e-12:
            raise _err("explore", f"explore: {self.explore} × {len(self.arms)} arms exceeds 1")
        return self

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(self.arms)

    @property
    def features(self) -> list[str]:
        return list(dict.fromkeys(f for rule in self.rules for f in rule.when))


class FixedArm(_PolicyBase):
    """Always ``arm``: an off-policy candidate ("always variant X"), or a degenerate policy."""

    kind: Literal["fixed"]
    arm: Annotated[str, Field(min_length=1, max_length=64)]
    arms: dict[str, dict[str, Any]] = Field(default_factory=dict, max_length=MAX_ARMS)

    @model_validator(mode="after")
    def _known(self) -> FixedArm:
        if self.arms and self.arm not in self.arms:
            raise _err("arm", f"arm: {self.arm!r} is not one of arms ({', '.join(self.arms)})")
        return self

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(self.arms) if self.arms else (self.arm,)

    @property
    def features(self) -> list[str]:
        return []


Policy = Annotated[SloRouter | RulePolicy | FixedArm, Field(discriminator="kind")]
PolicyT = SloRouter | RulePolicy | FixedArm
_ADAPTER: TypeAdapter[PolicyT] = TypeAdapter(Policy)


def parse_policy(data: Any, *, factors: Any = None, custom: Mapping[str, Any] | None = None) -> PolicyT:
    """A policy from its mapping (``{kind, ...}`` or a strategy's ``{policy: {...}}``).

    ``factors``: the deployment's factor catalog (arms are then checked fully); ``custom``:
    the experiment's custom metrics (name → CustomMetric). Raises pydantic's ValidationError,
    each error located at its field."""
    if isinstance(data, Mapping) and "policy" in data and "kind" not in data:
        data = data["policy"]
    return _ADAPTER.validate_python(data, context={"factors": factors, "custom": custom})


def policy_of(strategy: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The policy mapping of a variant's strategy, or None for an ordinary strategy."""
    if not strategy:
        return None
    policy = strategy.get("policy")
    return policy if isinstance(policy, Mapping) else None


def error_field(exc: Any, prefix: str = "") -> tuple[str, str]:
    """(field, message) of a pydantic ValidationError's first error, the field dotted and
    without the discriminator's tag, for a problem+json answer."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    if not errors:
        return prefix.rstrip(".") or "policy", str(exc)
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if str(p) not in ("slo_router", "rule", "fixed")]
    msg = str(first.get("msg", "invalid"))
    # rule checks name their own sub-path (rules.2.when.prompt_tokens: ...): use it
    m = re.match(r"^(rules\.\d+(?:\.\w+)*(?:\.attr\.\w+)?|default|explore|arm): ", msg)
    if m and (not loc or loc[0] in ("rules", "default", "explore", "arm")):
        return prefix + m.group(1), msg[m.end():]
    m = re.match(r"^arm '([a-z0-9_]+)': ", msg)
    if m and loc[:1] == ["arms"]:
        return f"{prefix}arms.{m.group(1)}", msg[m.end():]
    return prefix + (".".join(loc) or "policy"), msg
