"""The one top-level analysis: per-variant statistics in, CONTRACTS "Analysis output" out.

``analyze(spec=…, stats=…)`` serves both the results API (stats built from a ClickHouse
``GROUP BY experiment, variant, unit_id``) and ``ablab analyze`` (stats built from an
event file), so both return the same JSON. Pure: no I/O, NaN becomes ``null``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .aggregates import VariantStats
from .comparisons import Comparison, cuped_test, mean_ci, proportion_test, quantile_test, ratio_test, welch_test
from .corrections import adjust, homogeneity_test, srm_check
from .decisions import decide, evaluate_guardrails
from .metrics import METRICS, MetricDef
from .quantiles import QuantileEstimate, quantile_ci
from .spec import ExperimentSpec
from .sufficient import ProportionStats, RatioStats, SampleStats

NAN = math.nan


def _as_sample(r: RatioStats) -> SampleStats:
    # request-randomized rows hold one request each (y ∈ {0, 1}, x = 0 when y = 0)
    return SampleStats(r.sum_y, r.sum_x, r.sum_x2)


def _as_proportion(r: RatioStats) -> ProportionStats:
    return ProportionStats(r.sum_y, r.sum_x)


def _quantile(spec: ExperimentSpec, m: MetricDef, vs: VariantStats) -> QuantileEstimate:
    hist = vs.histograms.get(m.numerator)
    if hist is None:
        return QuantileEstimate(0, m.quantile or NAN, NAN, NAN, NAN, NAN)
    deff = 1.0 if spec.request_randomized else vs.design_effect(m.numerator)
    return quantile_ci(hist, m.quantile, alpha=spec.alpha, design_effect=deff)


def arm_estimate(spec: ExperimentSpec, m: MetricDef, vs: VariantStats) -> tuple[float, float, float, tuple[float, float]]:
    """(estimate, variance of the estimate, n, interval) of one variant's own metric value."""
    if m.kind == "quantile":
        q = _quantile(spec, m, vs)
        return q.estimate, q.se**2, float(q.n), (q.lo, q.hi)
    r = vs.ratios[m.name]
    if spec.request_randomized and m.kind == "mean":
        var = _as_sample(r).mean_variance
    elif spec.request_randomized and m.kind == "proportion":
        var = _as_proportion(r).mean_variance
    else:
        var = r.mean_variance
    est = r.ratio
    return est, var, r.sum_y, mean_ci(est, var, alpha=spec.alpha)


def _arm(spec: ExperimentSpec, m: MetricDef, vs: VariantStats) -> dict[str, Any]:
    est, _, n, ci = arm_estimate(spec, m, vs)
    return {"n": n, "estimate": est, "ci": list(ci)}


def compare_metric(spec: ExperimentSpec, m: MetricDef, control: VariantStats, variant: VariantStats) -> Comparison:
    """Pick the right test for the metric and the randomization unit."""
    kw = {"alpha": spec.alpha, "sequential": spec.tuning_n if spec.sequential else None}
    if m.kind == "quantile":
        return quantile_test(_quantile(spec, m, control), _quantile(spec, m, variant), **kw)
    if spec.cuped and m.name in control.cuped and m.name in variant.cuped:
        return cuped_test(control.cuped[m.name], variant.cuped[m.name], **kw)
    rc, rt = control.ratios[m.name], variant.ratios[m.name]
    if spec.request_randomized and m.kind == "mean":
        return welch_test(_as_sample(rc), _as_sample(rt), **kw)
    if spec.request_randomized and m.kind == "proportion":
        return proportion_test(_as_proportion(rc), _as_proportion(rt), **kw)
    return ratio_test(rc, rt, **kw)  # user/session units: delta method over units


def _coverage(spec: ExperimentSpec, stats: Mapping[str, VariantStats]) -> dict[str, Any]:
    by_variant = {}
    labeled, requests = {}, {}
    for v in spec.variants:
        r = stats[v.key].ratios["coverage"]
        labeled[v.key], requests[v.key] = r.sum_x, r.sum_y
        by_variant[v.key] = {"labeled": r.sum_x, "requests": r.sum_y, "coverage": r.ratio}
    p = homogeneity_test(labeled, requests)
    return {"by_variant": by_variant, "p_value": p, "flagged": bool(math.isfinite(p) and p < spec.coverage_alpha)}


def json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def empty_variant() -> VariantStats:
    names = [m.name for m in METRICS.values() if m.kind != "quantile"] + ["coverage"]
    return VariantStats(0.0, {n: RatioStats() for n in names})


def analyze(
    *,
    spec: ExperimentSpec,
    stats: Mapping[str, VariantStats],
    exposures: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The CONTRACTS analysis object for one experiment (JSON-ready)."""
    stats = {v.key: stats.get(v.key) or empty_variant() for v in spec.variants}
    unit_counts = exposures if exposures is not None else {k: s.units for k, s in stats.items()}
    srm = srm_check(unit_counts, spec.weights)
    if spec.adaptive:  # the allocator moved the weights between phases: no fixed split to check
        srm = type(srm)(math.nan, math.nan, False, srm.observed, {})
    control = stats[spec.control]

    rows: list[dict[str, Any]] = []
    for name in spec.metrics:
        m = METRICS[name]
        for v in spec.variants:
            vs = stats[v.key]
            row: dict[str, Any] = {"metric": name, "variant": v.key, "units": vs.units, **_arm(spec, m, vs)}
            row["lower_is_better"] = m.lower_is_better
            if v.key == spec.control:
                row.update(
                    abs_diff=None, abs_ci=[None, None], rel_diff=None, rel_ci=[None, None],
                    p_value=None, p_value_adjusted=None, method="control", error=None,
                )
            else:
                c = compare_metric(spec, m, control, vs)
                if c.method.startswith("cuped") and c.ok:
                    row["estimate_cuped"] = c.variant
                row.update(
                    abs_diff=c.abs_diff, abs_ci=list(c.abs_ci), rel_diff=c.rel_diff, rel_ci=list(c.rel_ci),
                    p_value=c.p_value, method=c.method, error=c.error,
                )
            if name == "accuracy":
                cov = vs.ratios["coverage"]
                row["coverage"] = cov.ratio
            if name == "goodput" and vs.duration_s:
                row["per_second"] = vs.ratios["goodput"].sum_x / vs.duration_s
            rows.append(row)

    compared = [r for r in rows if r["method"] != "control"]
    for r, p in zip(compared, adjust([r["p_value"] for r in compared], spec.correction)):
        r["p_value_adjusted"] = p

    by_key = {(r["metric"], r["variant"]): r for r in rows}
    coverage = _coverage(spec, stats)
    guardrails = evaluate_guardrails(spec, by_key)
    decisions = decide(
        spec, by_key, guardrails, srm_flagged=srm.flagged, srm_p=srm.p_value, coverage_flagged=coverage["flagged"]
    )
    result = {
        "experiment": spec.key,
        "control": spec.control,
        "unit": spec.unit,
        "alpha": spec.alpha,
        "inference": {
            "sequential": spec.sequential,
            "method": "msprt" if spec.sequential else "fixed_horizon",
            "tuning_n": spec.tuning_n if spec.sequential else None,
            "correction": spec.correction,
        },
        "srm": {
            "p_value": srm.p_value,
            "flagged": srm.flagged,
            "statistic": srm.statistic,
            "observed": srm.observed,
            "expected": srm.expected,
            **({"skipped": "adaptive allocation: weights changed between phases"} if spec.adaptive else {}),
        },
        "coverage": coverage,
        "metrics": rows,
        "guardrails": guardrails,
        "decisions": decisions,
    }
    if extra:
        result.update(extra)
    return json_ready(result)
