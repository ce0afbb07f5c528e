"""What the engine needs to know about an experiment, parsed from the API/YAML shape.

Accepts the body of ``POST /v1/experiments`` (``key, control, variants: [{key, weight,
strategy}], unit, metrics?, guardrails?``) plus analysis options. Plain dataclasses; an
experiment-defined metric is its pydantic model (:mod:`.custom_metric`, the one the registry
validates request bodies with), which the engine reads as it is. Errors name the offending
field.

Guardrails::

    guardrails:
      - {metric: <latency>_p95, max: 800}               # SLA: confidently above → breach (pauses)
      - {metric: accuracy, margin: 0.02}                # non-inferiority, absolute
      - {metric: error_rate, margin: 0.10, relative: true}

The analysis window: events with ``start <= ts < end`` are the experiment (``start``: the
experiment's start, events before it are CUPED's pre-period; ``end``: ``analysis.end``, or
the time of a ship, :class:`Shipped`, whichever is earlier). After a ship every new unit gets
the shipped variant, so those events compare nothing: the comparison is the phases before it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ablab.platform import fields

from .custom_metric import CUSTOM_METRIC, CUSTOM_METRIC_TYPES, CustomMetric, error_text, snake_name
from .metrics import DEFAULT_METRICS, METRICS, SLO_METRICS, MetricDef
from .result_models import ShippedWindow, Window
from .sequential import DEFAULT_TUNING_N


class SpecError(ValueError):
    """Bad experiment definition; the message names the field."""


@dataclass(frozen=True, slots=True)
class Shipped:
    """A ship that closed the comparison: from ``at`` (ISO-8601) ``variant`` had all of the
    experiment's traffic, in ``phase``. The spec's weights are then the split before the ship."""

    variant: str
    at: str
    phase: int


@dataclass(frozen=True, slots=True)
class VariantSpec:
    key: str
    weight: float
    strategy: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Guardrail:
    metric: str
    max: float | None = None  # SLA bounds on the variant's own value
    min: float | None = None
    margin: float | None = None  # non-inferiority margin against control (in the bad direction)
    relative: bool = False
    pause: bool = True  # a breach pauses the variant automatically

    @property
    def kind(self) -> str:
        return "non_inferiority" if self.margin is not None else "sla"


@dataclass(frozen=True, slots=True)
class ExperimentSpec:
    key: str
    control: str
    variants: tuple[VariantSpec, ...]
    unit: str = "user"
    metrics: tuple[str, ...] = DEFAULT_METRICS
    primary: tuple[str, ...] = (fields.HEADLINE_LATENCY,)
    guardrails: tuple[Guardrail, ...] = ()
    slos: Mapping[str, float] = field(default_factory=dict)  # metric → max ms, for goodput
    alpha: float = 0.05
    sequential: bool = True
    tuning_n: float = DEFAULT_TUNING_N
    correction: str = "holm"
    cuped: bool = True
    coverage_alpha: float = 0.001
    start: str | None = None  # ISO-8601; inference events before it are the CUPED pre-period
    end: str | None = None  # ISO-8601, exclusive: events at or after it are not the experiment's
    shipped: Shipped | None = None  # the ship that set ``end`` (or came after a user's earlier end)
    # weights were changed by the adaptive allocator (phases): the split is not the configured
    # weights, so the sample-ratio check against them does not apply
    adaptive: bool = False
    custom: tuple[CustomMetric, ...] = ()  # experiment-defined metrics, also named in ``metrics``
    segments: tuple[str, ...] = ()  # dimensions to slice results by (``dims.<name>``)
    mde: Mapping[str, float] = field(default_factory=dict)  # metric → relative MDE for power

    def metric_def(self, name: str) -> MetricDef | CustomMetric:
        """The definition of a built-in or an experiment-defined metric."""
        for m in self.custom:
            if m.name == name:
                return m
        try:
            return METRICS[name]
        except KeyError:
            known = ", ".join([*METRICS, *(m.name for m in self.custom)])
            raise ValueError(f"unknown metric {name!r}; known: {known}") from None

    def mde_for(self, name: str) -> float:
        return float(self.mde.get(name, DEFAULT_MDE))

    @property
    def weights(self) -> dict[str, float]:
        return {v.key: v.weight for v in self.variants}

    @property
    def treatments(self) -> list[str]:
        return [v.key for v in self.variants if v.key != self.control]

    @property
    def request_randomized(self) -> bool:
        return self.unit == "request"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        return parse_spec(data)


def _need(data: Mapping[str, Any], name: str, where: str = "") -> Any:
    if name not in data or data[name] in (None, ""):
        raise SpecError(f"{where}{name}: required")
    return data[name]


def _number(value: Any, name: str, *, lo: float = -math.inf, hi: float = math.inf) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{name}: expected a number, got {value!r}") from None
    if not lo <= out <= hi or math.isnan(out):
        raise SpecError(f"{name}: {out} is outside [{lo}, {hi}]")
    return out


def _guardrail(raw: Any, i: int, known: Mapping[str, Any]) -> Guardrail:
    where = f"guardrails[{i}]."
    if not isinstance(raw, Mapping):
        raise SpecError(f"guardrails[{i}]: expected a mapping, got {raw!r}")
    unknown = set(raw) - {"metric", "max", "min", "margin", "relative", "pause"}
    if unknown:
        raise SpecError(f"{where}{sorted(unknown)[0]}: unknown field")
    name = _need(raw, "metric", where)
    if name not in known:
        raise SpecError(f"{where}metric: unknown metric {name!r}; known: {', '.join(known)}")
    bounds = {k: _number(raw[k], f"{where}{k}") for k in ("max", "min", "margin") if raw.get(k) is not None}
    if not bounds:
        raise SpecError(f"{where}: needs one of max, min (SLA) or margin (non-inferiority)")
    if "margin" in bounds and bounds["margin"] < 0:
        raise SpecError(f"{where}margin: must be ≥ 0, got {bounds['margin']}")
    return Guardrail(metric=name, relative=bool(raw.get("relative", False)), pause=bool(raw.get("pause", True)), **bounds)


# --- experiment-defined metrics, segments, MDE ---------------------------------------

DEFAULT_MDE = 0.05
MAX_CUSTOM = 32
MAX_SEGMENTS = 5


def _snake(value: Any, where: str, max_len: int = 64) -> str:
    try:
        return snake_name(value, max_len)
    except ValueError as exc:
        raise SpecError(f"{where}: {exc}") from None


def validate_custom(raw: Any) -> tuple[CustomMetric, ...]:
    """``metrics.custom``: each entry validated by its type's model (already-validated models
    pass as they are), then what only the list can tell: no built-in's name, none twice."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise SpecError("metrics.custom: expected a list of metric definitions")
    if len(raw) > MAX_CUSTOM:
        raise SpecError(f"metrics.custom: at most {MAX_CUSTOM} metrics, got {len(raw)}")
    out: list[CustomMetric] = []
    for i, item in enumerate(raw):
        where = f"metrics.custom[{i}]"
        m: CustomMetric
        if isinstance(item, CUSTOM_METRIC_TYPES):
            m = item
        elif not isinstance(item, Mapping):
            raise SpecError(f"{where}: expected a mapping, got {item!r}")
        else:
            try:
                m = CUSTOM_METRIC.validate_python(item)
            except ValidationError as exc:
                raise SpecError(error_text(exc, where)) from None
        if m.name in METRICS or m.name == "coverage":
            raise SpecError(f"{where}.name: {m.name!r} is a built-in metric; pick another name")
        if any(o.name == m.name for o in out):
            raise SpecError(f"{where}.name: {m.name!r} is defined twice")
        out.append(m)
    return tuple(out)


parse_custom = validate_custom
"""The spec's reading of ``metrics.custom``: the validated models are the engine's definitions."""


def parse_segments(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, list):
        raise SpecError("metrics.segments: expected a list such as [dims.domain]")
    if len(raw) > MAX_SEGMENTS:
        raise SpecError(f"metrics.segments: at most {MAX_SEGMENTS} dimensions, got {len(raw)}")
    out: list[str] = []
    for i, d in enumerate(raw):
        if not isinstance(d, str) or not d.startswith("dims."):
            raise SpecError(f"metrics.segments[{i}]: expected dims.<name>, got {d!r}")
        _snake(d.removeprefix("dims."), f"metrics.segments[{i}]")
        if d in out:
            raise SpecError(f"metrics.segments[{i}]: {d!r} is listed twice")
        out.append(d)
    return tuple(out)


def parse_mde(raw: Any, known: Mapping[str, Any]) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("analysis.mde: expected {metric: relative MDE}, e.g. {judge_score: 0.02}")
    out = {}
    for name, value in raw.items():
        if name not in known:
            raise SpecError(f"analysis.mde.{name}: unknown metric; known: {', '.join(known)}")
        v = _number(value, f"analysis.mde.{name}")
        if not (0 < v and math.isfinite(v)):
            raise SpecError(f"analysis.mde.{name}: a relative MDE must be > 0, got {v}")
        out[str(name)] = v
    return out


def iso_moment(text: Any, name: str) -> datetime:
    """An ISO-8601 time (UTC when it names no zone); :class:`SpecError` naming ``name`` otherwise."""
    if isinstance(text, datetime):
        moment = text
    else:
        try:
            moment = datetime.fromisoformat(str(text).strip().replace(" ", "T").replace("Z", "+00:00"))
        except ValueError:
            raise SpecError(f"{name}: not an ISO-8601 time: {text!r}") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _end(raw: Any, start: str | None) -> str | None:
    """``analysis.end``: ISO-8601, after ``start`` when there is one (an empty window analyzes nothing)."""
    if raw is None or raw == "":
        return None
    end = iso_moment(raw, "analysis.end")
    if start is not None and end <= iso_moment(start, "start"):
        raise SpecError(f"analysis.end: {end.isoformat()} is not after the start {start}")
    return end.isoformat() if isinstance(raw, datetime) else str(raw)


def with_ship(spec: ExperimentSpec, shipped: Shipped, weights: Mapping[str, float]) -> ExperimentSpec:
    """``spec`` analysed as the comparison before ``shipped``: events before the ship (or the
    user's earlier ``end``), and the split the variants had then (``weights`` by variant; a
    variant added since has none), so the sample-ratio check tests the split the units saw."""
    at = iso_moment(shipped.at, "shipped.at")
    end = spec.end if spec.end is not None and iso_moment(spec.end, "analysis.end") <= at else at.isoformat()
    if spec.start is not None and at <= iso_moment(spec.start, "start"):
        raise SpecError(f"shipped.at: {shipped.at} is not after the start {spec.start}")
    variants = tuple(replace(v, weight=float(weights.get(v.key, 0.0))) for v in spec.variants)
    return replace(spec, end=end, shipped=shipped, variants=variants)


def analysis_window(spec: ExperimentSpec) -> Window | None:
    """What the results JSON says about the window (absent when neither bound applies)."""
    if spec.start is None and spec.end is None:
        return None
    shipped = None
    if spec.shipped is not None:
        shipped = ShippedWindow(variant=spec.shipped.variant, at=spec.shipped.at, phase=spec.shipped.phase)
    return Window(start=spec.start, end=spec.end, shipped=shipped)


def parse_spec(data: Mapping[str, Any]) -> ExperimentSpec:
    if not isinstance(data, Mapping):
        raise SpecError(f"experiment: expected a mapping, got {type(data).__name__}")
    key = str(_need(data, "key"))
    raw_variants = _need(data, "variants")
    if not isinstance(raw_variants, list) or len(raw_variants) < 2:
        raise SpecError("variants: need a list of at least two variants")
    variants = []
    for i, v in enumerate(raw_variants):
        if not isinstance(v, Mapping):
            raise SpecError(f"variants[{i}]: expected a mapping")
        strategy = v.get("strategy") or {}
        if not isinstance(strategy, Mapping):
            raise SpecError(f"variants[{i}].strategy: expected a mapping")
        variants.append(
            VariantSpec(str(_need(v, "key", f"variants[{i}].")), _number(v.get("weight", 1.0), f"variants[{i}].weight", lo=0.0), dict(strategy))
        )
    keys = [v.key for v in variants]
    if len(set(keys)) != len(keys):
        raise SpecError(f"variants: duplicate key in {keys}")
    control = str(data.get("control") or keys[0])
    if control not in keys:
        raise SpecError(f"control: {control!r} is not one of the variants {keys}")
    unit = str(data.get("unit", "user"))
    if unit not in ("user", "session", "request"):
        raise SpecError(f"unit: must be user, session or request, got {unit!r}")

    metrics_field = data.get("metrics")
    analysis = dict(data.get("analysis") or {})
    slos = dict(data.get("slos") or {})
    names: list[str] = list(DEFAULT_METRICS)
    primary = analysis.get("primary", data.get("primary"))
    custom: tuple[CustomMetric, ...] = ()
    segments: tuple[str, ...] = ()
    if isinstance(metrics_field, Mapping):  # {primary, custom, segments, report, slos}
        unknown = set(metrics_field) - {"primary", "custom", "segments", "report", "slos"}
        if unknown:
            raise SpecError(f"metrics.{sorted(unknown)[0]}: unknown field; known: primary, custom, segments, report, slos")
        slos.update(metrics_field.get("slos") or {})
        primary = metrics_field.get("primary", primary)
        custom = parse_custom(metrics_field.get("custom"))
        segments = parse_segments(metrics_field.get("segments"))
        names = list(metrics_field.get("report") or names)
    elif isinstance(metrics_field, list):
        names = [str(m) for m in metrics_field]
    elif metrics_field is not None:
        raise SpecError("metrics: expected a list of metric names or a mapping")
    known: dict[str, Any] = {**METRICS, **{m.name: m for m in custom}}
    where = "metrics.report" if isinstance(metrics_field, Mapping) else "metrics"
    for i, name in enumerate(names):
        if name not in known:
            raise SpecError(f"{where}[{i}]: unknown metric {name!r}; known: {', '.join(known)}")
    primary_t = tuple([primary] if isinstance(primary, str) else (primary or [fields.HEADLINE_LATENCY]))
    for name in primary_t:
        if name not in known:
            raise SpecError(f"primary: unknown metric {name!r}; known: {', '.join(known)}")
    for name, bound in slos.items():
        if name not in SLO_METRICS:
            raise SpecError(f"slos.{name}: SLOs may bound {', '.join(SLO_METRICS)}")
        _number(bound, f"slos.{name}", lo=0.0)
    guardrails = tuple(_guardrail(g, i, known) for i, g in enumerate(data.get("guardrails") or []))
    names = list(dict.fromkeys([*names, *primary_t, *(g.metric for g in guardrails), *(m.name for m in custom)]))
    mde = parse_mde(analysis.get("mde"), known)

    start = str(data["start"]) if data.get("start") else (str(analysis["start"]) if analysis.get("start") else None)
    end = _end(analysis.get("end", data.get("end")), start)

    correction = str(analysis.get("correction", "holm"))
    if correction not in ("holm", "bh", "none"):
        raise SpecError(f"analysis.correction: must be holm, bh or none, got {correction!r}")
    return ExperimentSpec(
        key=key,
        control=control,
        variants=tuple(variants),
        unit=unit,
        metrics=tuple(names),
        primary=primary_t,
        guardrails=guardrails,
        slos={k: float(v) for k, v in slos.items()},
        alpha=_number(analysis.get("alpha", 0.05), "analysis.alpha", lo=1e-6, hi=0.5),
        sequential=bool(analysis.get("sequential", True)),
        tuning_n=_number(analysis.get("tuning_n", DEFAULT_TUNING_N), "analysis.tuning_n", lo=1.0),
        correction=correction,
        cuped=bool(analysis.get("cuped", True)),
        start=start,
        end=end,
        custom=custom,
        segments=segments,
        mde=mde,
    )
