"""The metric catalogue: names as in docs/contracts.md and the per-unit columns behind them.

Per-unit aggregates (one row per variant × randomization unit, what
``GROUP BY experiment, variant, unit_id`` returns) carry these columns:

===================== =====================================================
``requests``          inference events of the unit
``errors``            of which had ``error`` set
``<m>_sum``/``<m>_n`` sum and count of latency ``m`` ∈ e2e_ms, ttft_ms, tpot_ms
                      over requests that report it (TPOT needs output_tokens > 1)
``<m>_sq``            optional: Σ of squared request values (design effect of p95)
``cost_usd_sum``      Σ cost over requests (billing cost where it arrived)
``labeled``/``correct`` labelled requests and correct ones (joined by trace_id)
``labeled_cost_usd_sum`` Σ cost over labelled requests (cost per correct answer)
``good``              requests meeting every configured SLO (goodput)
``pre_<col>``         optional pre-period value of ``<col>`` (CUPED covariate)
===================== =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["mean", "proportion", "ratio", "quantile"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    kind: Kind
    numerator: str  # per-unit column (for quantiles: the latency the histogram is over)
    denominator: str
    lower_is_better: bool
    quantile: float | None = None


def _latency(name: str) -> MetricDef:
    return MetricDef(name, "mean", f"{name}_sum", f"{name}_n", True)


def _quantile(base: str, q: float) -> MetricDef:
    return MetricDef(f"{base}_p{round(q * 100)}", "quantile", base, f"{base}_n", True, q)


METRICS: dict[str, MetricDef] = {
    m.name: m
    for m in (
        _latency("e2e_ms"),
        _latency("ttft_ms"),
        _latency("tpot_ms"),
        _quantile("e2e_ms", 0.95),
        _quantile("ttft_ms", 0.95),
        _quantile("e2e_ms", 0.99),
        _quantile("ttft_ms", 0.99),
        MetricDef("accuracy", "proportion", "correct", "labeled", False),
        MetricDef("cost_usd", "mean", "cost_usd_sum", "requests", True),
        MetricDef("cost_per_correct", "ratio", "labeled_cost_usd_sum", "correct", True),
        MetricDef("goodput", "proportion", "good", "requests", False),
        MetricDef("error_rate", "proportion", "errors", "requests", True),
    )
}

DEFAULT_METRICS: tuple[str, ...] = tuple(METRICS)
HISTOGRAM_SOURCES: tuple[str, ...] = ("e2e_ms", "ttft_ms")
UNIT_COLUMNS: tuple[str, ...] = (
    "requests",
    "errors",
    "e2e_ms_sum",
    "e2e_ms_n",
    "e2e_ms_sq",
    "ttft_ms_sum",
    "ttft_ms_n",
    "ttft_ms_sq",
    "tpot_ms_sum",
    "tpot_ms_n",
    "cost_usd_sum",
    "labeled",
    "correct",
    "labeled_cost_usd_sum",
    "good",
)
# Latencies each SLO may bound (goodput = every configured SLO met, no error).
SLO_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms")


def metric(name: str) -> MetricDef:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


# --- metrics an experiment defines (docs/contracts.md, "Analysis output") ---------------
#
# A custom metric reads one value per request from a *source*:
#   - a measured field of the inference event (``e2e_ms``, ``output_tokens``, ``cost_usd``…),
#   - ``measures.<name>``: a custom measure the event carried,
#   - ``score`` / ``correct``: the trace's latest label (judge or human), joined by trace_id,
#   - ``error``: 1 when the request failed, else 0.
# and is aggregated in one of three ways; the randomization unit's variance is always used:
#   - ``request``   Σ value / Σ requests-with-a-value over units (delta method);
#   - ``unit_mean`` each unit's own mean, then Welch over units that have a value;
#   - ``unit_sum``  each unit's total, then Welch over all units of the variant.
# A ``ratio`` is Σ numerator / Σ denominator (delta method), times ``scale``.
#
# The per-unit aggregation (store SQL and the offline numpy path, one specification) emits,
# for every custom metric, the columns named by :func:`custom_columns`; the engine reads
# only those. Per-variant histograms of a quantile metric are keyed by the metric's name.

Aggregation = Literal["request", "unit_mean", "unit_sum"]
CupedSource = Literal["pre_period"] | str  # "pre_period" or a source name (a named covariate)
LABEL_SOURCES: tuple[str, ...] = ("score", "correct")
MEASURE_PREFIX = "measures."
DIM_PREFIX = "dims."


@dataclass(frozen=True, slots=True)
class CustomMetric:
    name: str
    kind: Kind
    column: str | None = None  # mean / proportion / quantile: the source
    numerator: str | None = None  # ratio
    denominator: str | None = None  # ratio
    aggregation: Aggregation = "request"
    scale: float = 1.0
    quantile: float | None = None
    lower_is_better: bool = False
    cuped: CupedSource | None = None  # None: no adjustment

    @property
    def sources(self) -> tuple[str, ...]:
        """The per-request sources this metric reads (the covariate included)."""
        own = (self.numerator, self.denominator) if self.kind == "ratio" else (self.column,)
        extra = (self.cuped,) if self.cuped not in (None, "pre_period") else ()
        return tuple(s for s in (*own, *extra) if s)


def custom_columns(m: CustomMetric) -> dict[str, str]:
    """Per-unit column names for ``m``: role → column.

    ``x``/``y``: numerator/denominator sums of the unit (``request``: Σ value and the count of
    requests with a value; ``unit_mean``/``unit_sum``: the same sums, the engine divides or
    not); ``sq``: Σ value² over the unit's requests (a quantile's design effect);
    ``pre_x``/``pre_y``: the same sums over the pre-period (CUPED ``pre_period``);
    ``cov_x``/``cov_y``: in-period sums of the named covariate (CUPED ``covariate``).
    """
    base = f"c__{m.name}"
    out = {"x": f"{base}__x", "y": f"{base}__y"}
    if m.kind == "quantile":
        out["sq"] = f"{base}__sq"
    if m.cuped == "pre_period":
        out.update(pre_x=f"pre__{base}__x", pre_y=f"pre__{base}__y")
    elif m.cuped:
        out.update(cov_x=f"{base}__cov_x", cov_y=f"{base}__cov_y")
    return out
