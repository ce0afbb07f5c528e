"""The shapes of an experiment's results, time series and attribution (pydantic v2).

The engine builds these objects (:func:`ablab.platform.stats.engine.analyze_results`); the
API publishes them in OpenAPI (re-exported by :mod:`ablab.platform.analytics.schemas`),
``ablab analyze --json`` and the results route write their JSON, and the dashboard client
checks responses against them. Plain models, read by attribute: their JSON is the mapping.
A value the statistics cannot give (too little data, NaN) is null; numpy numbers become
Python ones.

Closed: a field the engine does not declare here is refused (``extra="forbid"``), so the
shapes and the JSON cannot drift apart. The one open object is a Pareto point, whose
objectives are keyed by metric name. Every declared key is in the JSON (null where it does
not apply, ``power`` on a control row), except ``shadows``, ``data_quality`` and
``policies``, left out when there are none.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _finite(value: Any) -> Any:
    """NaN and ±inf are null; numpy scalars are Python numbers (an int stays an int)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def json_ready(value: Any) -> Any:
    """Containers of numbers as JSON-ready values: NaN/inf → None, numpy → Python."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return _finite(value)


Number = Annotated[int | float | None, BeforeValidator(_finite)]  # an int stays an int (counts)
Interval = list[Number]  # [low, high]; [null, null] where undefined
Json = Annotated[dict[str, Any], BeforeValidator(json_ready)]
# Keys left out of the JSON when null (shadows, data_quality, policies).
_ABSENT_WHEN_NONE: dict[str, Any] = {"exclude_if": lambda value: value is None}


def _nulls() -> list[Number]:
    return [None, None]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- results


class Unadjusted(_Shape):
    """The same comparison without the covariate."""

    abs_diff: Number = None
    abs_ci: Interval = Field(default_factory=_nulls)
    rel_diff: Number = None
    rel_ci: Interval = Field(default_factory=_nulls)
    p_value: Number = None
    se: Number = None


class Cuped(_Shape):
    """Variance reduction applied to a treatment row (the row's own fields are the adjusted ones)."""

    covariate: str | None = None
    theta: Number = None
    variance_reduction: Number = None
    # each arm's adjusted estimate, Ȳ − θ(X̄ − X̄ pooled over both arms): their difference is
    # the row's abs_diff; variant_adjusted is the row's estimate_cuped
    control_adjusted: Number = None
    variant_adjusted: Number = None
    unadjusted: Unadjusted | None = None


class Power(_Shape):
    mde_rel: Number = None
    n_needed: Number = None
    n: Number = None  # per variant, in randomization units
    seconds_to_decision: Number = None  # null when the rate is unknown; 0 once n ≥ n_needed


class MetricRow(_Shape):
    """One metric of one variant; the control's comparison fields are null."""

    metric: str
    variant: str
    units: Number = None
    n: Number = None
    estimate: Number = None
    ci: Interval = Field(default_factory=_nulls)
    lower_is_better: bool = True
    abs_diff: Number = None
    abs_ci: Interval = Field(default_factory=_nulls)
    rel_diff: Number = None
    rel_ci: Interval = Field(default_factory=_nulls)
    p_value: Number = None
    # the standard error of abs_diff: abs_ci is abs_diff ± k·se (k: the test's critical value)
    # and the p-value tests abs_diff / se (the two-proportion z-test's p-value alone uses the
    # pooled standard error under the null)
    se: Number = None
    p_value_adjusted: Number = None
    method: str | None = None
    error: str | None = None
    estimate_cuped: Number = None  # where CUPED applied: the adjusted treatment value
    coverage: Number = None  # accuracy rows: labeled share of requests
    per_second: Number = None  # goodput rows
    # custom metrics (metrics.custom in the experiment)
    custom: bool = False
    type: Literal["mean", "proportion", "ratio", "quantile"] | None = None
    aggregation: Literal["request", "unit_mean", "unit_sum"] | None = None
    cuped: Cuped | None = None
    power: Power | None = None  # treatment rows


class Inference(_Shape):
    sequential: bool = False
    method: str = "fixed_horizon"
    tuning_n: Number = None
    correction: str | None = None


class Srm(_Shape):
    """Sample-ratio mismatch: observed vs expected units per variant."""

    p_value: Number = None
    flagged: bool = False
    statistic: Number = None
    observed: dict[str, Number] = Field(default_factory=dict)
    expected: dict[str, Number] = Field(default_factory=dict)
    skipped: str | None = None


class CoverageArm(_Shape):
    labeled: Number = None
    requests: Number = None
    coverage: Number = None


class Coverage(_Shape):
    """Whether labels cover the variants alike (a skew biases accuracy)."""

    by_variant: dict[str, CoverageArm] = Field(default_factory=dict)
    p_value: Number = None
    flagged: bool = False


class Guardrail(_Shape):
    variant: str
    metric: str
    kind: str
    threshold: Number = None
    relative: bool | None = None
    status: Literal["pass", "fail", "inconclusive"] | str
    pause: bool = False
    reason: str = ""


class Decision(_Shape):
    variant: str
    decision: str
    reasons: list[str] = Field(default_factory=list)


class SegmentRow(_Shape):
    value: str
    metric: str
    variant: str
    n: Number = None
    estimate: Number = None
    abs_diff: Number = None
    rel_diff: Number = None
    rel_ci: Interval = Field(default_factory=_nulls)
    p_value: Number = None
    p_value_adjusted: Number = None
    se: Number = None  # the comparison's standard error, as on a metric row (null for the control)


class Heterogeneity(_Shape):
    metric: str
    variant: str
    q: Number = None
    df: Number = None
    p_value: Number = None
    flagged: bool = False


class Segment(_Shape):
    dimension: str
    rows: list[SegmentRow] = Field(default_factory=list)
    heterogeneity: list[Heterogeneity] = Field(default_factory=list)


class ShadowCoverage(_Shape):
    """How many of a variant's requests were chosen for a shadow, and what became of them."""

    requests: int = 0  # the variant's requests
    chosen: int = 0  # chosen for a shadow: sent + dropped
    sent: int = 0
    dropped: int = 0  # the shadow's concurrency cap was full
    shadowed: int = 0  # primaries with a shadow event
    failed: int = 0  # shadow events with error set
    orphaned: int = 0  # shadow events whose primary is not among the variant's requests (yet)


class ShadowRow(_Shape):
    """One metric of one variant's shadow requests, each against its own primary:
    differences shadow − primary over ``n_pairs`` pairs (paired t; for latencies also the
    sign and Wilcoxon signed-rank tests)."""

    metric: str
    variant: str  # the primary's variant
    n_pairs: int = 0
    primary_mean: Number = None
    shadow_mean: Number = None
    mean_diff: Number = None
    sd_diff: Number = None
    ci: Interval = Field(default_factory=_nulls)
    p_value: Number = None
    p_value_adjusted: Number = None
    sign_p_value: Number = None  # latencies
    wilcoxon_p_value: Number = None  # latencies
    method: str = "paired_t"
    lower_is_better: bool = True
    custom: bool = False
    type: Literal["mean", "proportion"] | None = None
    coverage: ShadowCoverage = Field(default_factory=ShadowCoverage)


# ---------------------------------------------------------------- policy variants (issue 33)


class ArmMetric(_Shape):
    """One metric's per-request mean over an arm's requests with a value, its interval over
    randomization units (requests of one unit are dependent)."""

    metric: str
    n: int = 0
    estimate: Number = None
    ci: Interval = Field(default_factory=_nulls)


class SloCompliance(_Shape):
    """One SLO of a router over its variant's requests: ``observed`` is the statistic the SLO
    bounds (the quantile, or the mean when the SLO names none), ``compliance`` the share of
    requests whose ``field`` is within ``bound``; ``met`` is null without data."""

    metric: str  # as the policy writes it, e.g. ttft_ms_p95
    field: str
    quantile: Number = None  # null: the SLO bounds the mean
    bound: float
    n: int = 0
    observed: Number = None
    ci: Interval = Field(default_factory=_nulls)
    compliance: Number = None
    met: bool | None = None


class ArmRow(_Shape):
    """One arm of a policy variant: how much of the variant's traffic it took and how it did."""

    arm: str
    requests: int = 0
    share: Number = None  # of the variant's requests
    share_ci: Interval = Field(default_factory=_nulls)  # over units
    mean_propensity: Number = None  # the policy's own probability of this arm, as logged
    slo_compliance: Number = None  # share of its requests meeting every bound; null without SLO or data
    metrics: list[ArmMetric] = Field(default_factory=list)


class PolicyBreakdown(_Shape):
    """A policy variant's arms, SLO compliance and model state (``results.policies``)."""

    variant: str
    kind: Literal["slo_router", "rule", "fixed"]
    requests: int = 0
    units: int = 0
    model_version: str | None = None  # the version most of its requests were decided under
    exploring: bool = False  # most of its requests were decided without a model (uniform)
    objective: str | None = None
    slo: list[SloCompliance] = Field(default_factory=list)
    arms: list[ArmRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class PolicyEstimate(_Shape):
    estimate: Number = None
    ci: Interval = Field(default_factory=_nulls)


class ArmCredit(_Shape):
    """``contribution = share × (mean − control mean)``: the arms' contributions add up to the gain."""

    arm: str
    share: Number = None  # of the policy's requests with a value of the metric
    mean: Number = None
    contribution: Number = None
    ci: Interval = Field(default_factory=_nulls)


class FeatureCredit(_Shape):
    """A feature's Shapley share of V(policy) − V(policy blind to all its features)."""

    feature: str
    credit: Number = None
    ci: Interval = Field(default_factory=_nulls)


class PolicyCredit(_Shape):
    """Where a policy variant's gain over the control comes from (``attribution.policies``)."""

    variant: str
    metric: str
    baseline: str  # the control variant
    gain: PolicyEstimate = Field(default_factory=PolicyEstimate)  # policy mean − control mean, measured
    arms: list[ArmCredit] = Field(default_factory=list)
    routing: PolicyEstimate = Field(default_factory=PolicyEstimate)  # V(policy) − V(best single arm), doubly robust
    features: list[FeatureCredit] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class ShippedWindow(_Shape):
    """The ship that ended the comparison: ``variant`` had all traffic from ``at``, in ``phase``."""

    variant: str
    at: str
    phase: int


class Window(_Shape):
    """The events analysed: ``start <= ts < end`` (ISO-8601; null: unbounded on that side)."""

    start: str | None = None
    end: str | None = None
    shipped: ShippedWindow | None = None


class Results(_Shape):
    """``GET /v1/experiments/{key}/results`` and ``ablab analyze --json``."""

    experiment: str
    control: str
    unit: str
    alpha: float
    inference: Inference = Field(default_factory=Inference)
    srm: Srm = Field(default_factory=Srm)
    coverage: Coverage = Field(default_factory=Coverage)
    metrics: list[MetricRow] = Field(default_factory=list)
    guardrails: list[Guardrail] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list)
    segments: list[Segment] = Field(default_factory=list)
    # only when the experiment has shadow activity (issue 34)
    shadows: list[ShadowRow] | None = Field(default=None, **_ABSENT_WHEN_NONE)
    # ``ablab analyze`` only: what the event file held that the analysis could not use
    data_quality: Json | None = Field(default=None, **_ABSENT_WHEN_NONE)
    # only when the experiment has a policy variant (issue 33)
    policies: list[PolicyBreakdown] | None = Field(default=None, **_ABSENT_WHEN_NONE)
    # the analysed window; absent when neither a start nor an end bounds it
    window: Window | None = Field(default=None, **_ABSENT_WHEN_NONE)

    def rows(self, metric: str) -> list[MetricRow]:
        return [r for r in self.metrics if r.metric == metric]


# ---------------------------------------------------------------- time series


class Point(_Shape):
    n: Number = None
    value: Number = None
    ci: Interval = Field(default_factory=_nulls)


class WindowPoint(Point):
    """One 10 s window: its own value and the running value up to it."""

    ts: str
    late: int = 0
    cumulative: Point | None = None


class Series(_Shape):
    variant: str
    points: list[WindowPoint] = Field(default_factory=list)


class Timeseries(_Shape):
    """``GET /v1/experiments/{key}/timeseries``."""

    experiment: str
    metric: str
    window_s: int
    series: list[Series] = Field(default_factory=list)


# ---------------------------------------------------------------- attribution


class ParetoPoint(_Shape):
    """A variant's objectives (the headline latency, cost and accuracy, or the metrics asked
    for) as extra fields: the one open shape, its keys are metric names."""

    model_config = ConfigDict(extra="allow")

    variant: str
    on_frontier: bool
    dominated_by: list[str] = Field(default_factory=list)


class Pareto(_Shape):
    objectives: dict[str, Literal["min", "max"]] = Field(default_factory=dict)
    points: list[ParetoPoint] = Field(default_factory=list)


class Effect(_Shape):
    term: str
    factors: list[str] = Field(default_factory=list)
    order: int = 1
    estimate: Number = None
    ci: Interval = Field(default_factory=_nulls)
    p_value: Number = None


class Factorial(_Shape):
    """One metric's factor effects; ``error`` (e.g. "not_enough_data") when they cannot be estimated."""

    error: str | None = None
    factors: list[str] = Field(default_factory=list)
    design: str | None = None
    effects: list[Effect] = Field(default_factory=list)
    shapley: Json | None = None  # open: best_variant, total, shares, sum_of_shares


class Attribution(_Shape):
    """``GET /v1/experiments/{key}/attribution``: which factor moved which metric."""

    experiment: str
    control: str
    pareto: Pareto = Field(default_factory=Pareto)
    factors: dict[str, Json] = Field(default_factory=dict)  # variant → factor → level
    factorial: dict[str, Factorial] = Field(default_factory=dict)  # metric → effects
    # only when the experiment has a policy variant (issue 33)
    policies: list[PolicyCredit] | None = Field(default=None, **_ABSENT_WHEN_NONE)
