"""What the engine needs to know about an experiment, parsed from the API/YAML shape.

Accepts the body of ``POST /v1/experiments`` (``key, control, variants: [{key, weight,
strategy}], unit, metrics?, guardrails?``) plus analysis options. Plain dataclasses, no
pydantic, so the engine stays numpy/scipy only; errors name the offending field.

Guardrails::

    guardrails:
      - {metric: ttft_ms_p95, max: 800}                 # SLA: confidently above → breach (pauses)
      - {metric: accuracy, margin: 0.02}                # non-inferiority, absolute
      - {metric: error_rate, margin: 0.10, relative: true}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .metrics import DEFAULT_METRICS, METRICS, SLO_METRICS, metric
from .sequential import DEFAULT_TUNING_N


class SpecError(ValueError):
    """Bad experiment definition; the message names the field."""


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
    primary: tuple[str, ...] = ("e2e_ms",)
    guardrails: tuple[Guardrail, ...] = ()
    slos: Mapping[str, float] = field(default_factory=dict)  # metric → max ms, for goodput
    alpha: float = 0.05
    sequential: bool = True
    tuning_n: float = DEFAULT_TUNING_N
    correction: str = "holm"
    cuped: bool = True
    coverage_alpha: float = 0.001
    start: str | None = None  # ISO-8601; inference events before it are the CUPED pre-period
    # weights were changed by the adaptive allocator (phases): the split is not the configured
    # weights, so the sample-ratio check against them does not apply
    adaptive: bool = False

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
    def from_dict(cls, data: Mapping[str, Any]) -> "ExperimentSpec":
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


def _guardrail(raw: Any, i: int) -> Guardrail:
    where = f"guardrails[{i}]."
    if not isinstance(raw, Mapping):
        raise SpecError(f"guardrails[{i}]: expected a mapping, got {raw!r}")
    unknown = set(raw) - {"metric", "max", "min", "margin", "relative", "pause"}
    if unknown:
        raise SpecError(f"{where}{sorted(unknown)[0]}: unknown field")
    name = _need(raw, "metric", where)
    try:
        metric(name)
    except ValueError as exc:
        raise SpecError(f"{where}metric: {exc}") from None
    bounds = {k: _number(raw[k], f"{where}{k}") for k in ("max", "min", "margin") if raw.get(k) is not None}
    if not bounds:
        raise SpecError(f"{where}: needs one of max, min (SLA) or margin (non-inferiority)")
    if "margin" in bounds and bounds["margin"] < 0:
        raise SpecError(f"{where}margin: must be ≥ 0, got {bounds['margin']}")
    return Guardrail(metric=name, relative=bool(raw.get("relative", False)), pause=bool(raw.get("pause", True)), **bounds)


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
    if isinstance(metrics_field, Mapping):  # {primary: [...], slos: {...}, report: [...]}
        slos.update(metrics_field.get("slos") or {})
        primary = metrics_field.get("primary", primary)
        names = list(metrics_field.get("report") or names)
    elif isinstance(metrics_field, list):
        names = [str(m) for m in metrics_field]
    elif metrics_field is not None:
        raise SpecError("metrics: expected a list of metric names or a mapping")
    for i, name in enumerate(names):
        if name not in METRICS:
            raise SpecError(f"metrics[{i}]: unknown metric {name!r}; known: {', '.join(METRICS)}")
    primary_t = tuple([primary] if isinstance(primary, str) else (primary or ["e2e_ms"]))
    for name in primary_t:
        if name not in METRICS:
            raise SpecError(f"primary: unknown metric {name!r}")
    for name, bound in slos.items():
        if name not in SLO_METRICS:
            raise SpecError(f"slos.{name}: SLOs may bound {', '.join(SLO_METRICS)}")
        _number(bound, f"slos.{name}", lo=0.0)
    guardrails = tuple(_guardrail(g, i) for i, g in enumerate(data.get("guardrails") or []))
    names = list(dict.fromkeys([*names, *primary_t, *(g.metric for g in guardrails)]))

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
        start=str(data["start"]) if data.get("start") else (str(analysis["start"]) if analysis.get("start") else None),
    )
