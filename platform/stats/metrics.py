"""The metric catalogue: names as in docs/contracts.md and the per-unit columns behind them,
derived from the field catalogue (:mod:`ablab.platform.fields`).

Per-unit aggregates (one row per variant × randomization unit, what
``GROUP BY experiment, variant, unit_id`` returns) carry these columns:

========================= =================================================
``requests``              inference events of the unit
``errors``                of which had ``error`` set
``<f>_sum``/``<f>_n``     sum and count of field ``f`` over requests that report it,
                          for each field the catalogue rolls up (``per_unit``)
``<f>_sq``                optional: Σ of squared request values (design effect of a quantile)
``labeled``/``correct``   labelled requests and correct ones (joined by trace_id)
``labeled_<cost>_sum``    Σ cost over labelled requests (cost per correct answer)
``good``                  requests meeting every configured SLO (goodput)
``pre_<col>``             optional pre-period value of ``<col>`` (CUPED covariate)
========================= =================================================

:data:`UNIT_COLUMNS` lists them for today's catalogue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ablab.platform import fields

Kind = Literal["mean", "proportion", "ratio", "quantile"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    kind: Kind
    numerator: str  # per-unit column (for quantiles: the field the histogram is over)
    denominator: str
    lower_is_better: bool
    quantile: float | None = None


def _mean(name: str) -> MetricDef:
    """A field's mean per request: over the requests that report it where it may be absent."""
    f = fields.FIELDS[name]
    denominator = fields.unit_column(name, "n") if "n" in f.per_unit else "requests"
    return MetricDef(name, "mean", fields.unit_column(name, "sum"), denominator, fields.lower_is_better(name))


def _quantile(name: str, q: float) -> MetricDef:
    return MetricDef(fields.quantile_metric(name, q), "quantile", name, fields.unit_column(name, "n"),
                     fields.lower_is_better(name), q)


COST_PER_CORRECT = "cost_per_correct"
_COUNTED = [m for m in fields.MEAN_FIELDS if "n" in fields.FIELDS[m].per_unit]  # latencies: may be absent
METRICS: dict[str, MetricDef] = {
    m.name: m
    for m in (
        *(_mean(name) for name in _COUNTED),
        *(_quantile(name, q) for q in fields.RESULT_QUANTILES for name in fields.HISTOGRAM_FIELDS),
        MetricDef("accuracy", "proportion", "correct", "labeled", False),
        *(_mean(name) for name in fields.MEAN_FIELDS if name not in _COUNTED),
        MetricDef(COST_PER_CORRECT, "ratio", fields.labeled_sum_column(fields.COST_FIELD), "correct",
                  fields.lower_is_better(fields.COST_FIELD)),
        MetricDef("goodput", "proportion", "good", "requests", False),
        MetricDef("error_rate", "proportion", "errors", "requests", True),
    )
}
"""Built-in metrics, in report order: field means that may be absent (latencies), their
quantiles, accuracy, the other field means (cost), cost per correct answer, goodput, errors."""

DEFAULT_METRICS: tuple[str, ...] = tuple(METRICS)
HISTOGRAM_SOURCES: tuple[str, ...] = fields.HISTOGRAM_FIELDS
UNIT_COLUMNS: tuple[str, ...] = (
    "requests",
    "errors",
    *fields.unit_columns(),
    "labeled",
    "correct",
    fields.labeled_sum_column(fields.COST_FIELD),
    "good",
)
SLO_METRICS: tuple[str, ...] = fields.SLO_FIELDS
"""Fields each SLO may bound (goodput = every configured SLO met, no error), in catalogue order."""
INFERENCE_SOURCES: tuple[str, ...] = fields.INFERENCE_FIELDS
"""Measured fields of the inference event a custom metric may read."""
ERROR_SOURCE = "error"
LOWER_IS_BETTER_SOURCES: frozenset[str] = fields.lower_is_better_fields() | {ERROR_SOURCE}
"""Sources where less is better by nature (time, money, failures): a custom metric over one
is lower-is-better unless it says otherwise; everything else: more is better."""


def metric(name: str) -> MetricDef:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


# --- metrics an experiment defines (docs/contracts.md, "Analysis output") ---------------
#
# A custom metric reads one value per request from a *source*:
#   - a measured field of the inference event (:data:`INFERENCE_SOURCES`: the field catalogue's),
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
# for every custom metric (:mod:`.custom_metric`), the columns its ``custom_columns`` names;
# the engine reads only those. Per-variant histograms of a quantile metric are keyed by the metric's name.

LABEL_SOURCES: tuple[str, ...] = ("score", "correct")
MEASURE_PREFIX = "measures."
DIM_PREFIX = "dims."
