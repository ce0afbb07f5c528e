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
