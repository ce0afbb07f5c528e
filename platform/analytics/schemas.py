"""The shapes of an experiment's results, time series and attribution (pydantic v2).

One definition for the API's response models (so OpenAPI publishes them), ``ablab analyze
--json`` and the dashboard client, which parses responses into these objects. The engine
builds JSON-ready dicts (:func:`ablab.platform.stats.engine.analyze`); these models read
them. A value the statistics cannot give (too little data) is null, never NaN.

Closed shapes forbid nothing either: fields the engine adds in a later version are kept
(``extra="allow"``) so an older reader passes them on instead of failing.
"""

from __future__ import annotations

import inspect
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Number = int | float | None  # an int stays an int (counts), as in the JSON
# A key the engine writes only sometimes stays absent in the API's JSON too where pydantic
# can say so (``exclude_if``, pydantic ≥ 2.11); older versions write it as null.
_ABSENT_WHEN_NONE: dict[str, Any] = (
    {"exclude_if": lambda value: value is None} if "exclude_if" in inspect.signature(Field).parameters else {}
)
Interval = list[int | float | None]  # [low, high]; [null, null] where undefined


class _Shape(BaseModel):
    # Attribute access for typed readers; the read-only mapping methods (get, [], in, keys,
    # items) answer as the JSON object would, for code written against the dict.
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def get(self, name: str, default: Any = None) -> Any:
        """``dict.get`` over fields and extras, for readers written against the JSON."""
        value = getattr(self, name, None)
        if value is None and self.model_extra and name in self.model_extra:
            value = self.model_extra[name]
        return default if value is None else value

    def __getitem__(self, name: str) -> Any:
        if name in type(self).model_fields or (self.model_extra and name in self.model_extra):
            return getattr(self, name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in type(self).model_fields or bool(self.model_extra and name in self.model_extra))

    def keys(self) -> list[str]:
        """The JSON object's keys (fields, then extras); with ``__getitem__``, ``dict(shape)`` works."""
        return [*type(self).model_fields, *(self.model_extra or {})]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]

    def values(self) -> list[Any]:
        return [getattr(self, k) for k in self.keys()]


# ---------------------------------------------------------------- results


class Unadjusted(_Shape):
    abs_diff: Number = None
    abs_ci: Interval = Field(default_factory=lambda: [None, None])
    rel_diff: Number = None
    rel_ci: Interval = Field(default_factory=lambda: [None, None])
    p_value: Number = None


class Cuped(_Shape):
    """Variance reduction applied to a treatment row (the row's own fields are the adjusted ones)."""

    covariate: str | None = None
    theta: Number = None
    variance_reduction: Number = None
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
    ci: Interval = Field(default_factory=lambda: [None, None])
    lower_is_better: bool = True
    abs_diff: Number = None
    abs_ci: Interval = Field(default_factory=lambda: [None, None])
    rel_diff: Number = None
    rel_ci: Interval = Field(default_factory=lambda: [None, None])
    p_value: Number = None
    p_value_adjusted: Number = None
    method: str | None = None
    error: str | None = None
    estimate_cuped: Number = None
    coverage: Number = None  # accuracy rows: labeled share of requests
    per_second: Number = None  # goodput rows
    # custom metrics (metrics.custom in the experiment)
    custom: bool = False
    type: Literal["mean", "proportion", "ratio", "quantile"] | None = None
    aggregation: Literal["request", "unit_mean", "unit_sum"] | None = None
    cuped: Cuped | None = None
    power: Power | None = None


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
    rel_ci: Interval = Field(default_factory=lambda: [None, None])
    p_value: Number = None
    p_value_adjusted: Number = None


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
    ci: Interval = Field(default_factory=lambda: [None, None])
    p_value: Number = None
    p_value_adjusted: Number = None
    sign_p_value: Number = None  # latencies
    wilcoxon_p_value: Number = None  # latencies
    method: str = "paired_t"
    lower_is_better: bool = True
    custom: bool = False
    type: Literal["mean", "proportion"] | None = None
    coverage: ShadowCoverage = Field(default_factory=ShadowCoverage)


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
    # only when the experiment has shadow activity (issue 34); absent otherwise (null under pydantic < 2.11)
    shadows: list[ShadowRow] | None = Field(default=None, **_ABSENT_WHEN_NONE)

    def rows(self, metric: str) -> list[MetricRow]:
        return [r for r in self.metrics if r.metric == metric]


# ---------------------------------------------------------------- time series


class Point(_Shape):
    n: Number = None
    value: Number = None
    ci: Interval = Field(default_factory=lambda: [None, None])


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
    """A variant's objectives (``e2e_ms``, ``cost_usd``, ``accuracy``) as extra fields."""

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
    ci: Interval = Field(default_factory=lambda: [None, None])
    p_value: Number = None


class Factorial(_Shape):
    """One metric's factor effects; ``error`` (e.g. "not_enough_data") when they cannot be estimated."""

    error: str | None = None
    factors: list[str] = Field(default_factory=list)
    design: str | None = None
    effects: list[Effect] = Field(default_factory=list)
    shapley: dict[str, Any] | None = None  # open: best_variant, total, shares, sum_of_shares


class Attribution(_Shape):
    """``GET /v1/experiments/{key}/attribution``: which factor moved which metric."""

    experiment: str
    control: str
    pareto: Pareto = Field(default_factory=Pareto)
    factors: dict[str, dict[str, Any]] = Field(default_factory=dict)  # variant → factor → level
    factorial: dict[str, Factorial] = Field(default_factory=dict)  # metric → effects
