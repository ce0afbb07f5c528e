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
from .comparisons import (
    Comparison,
    cuped_mean_test,
    cuped_test,
    mean_ci,
    proportion_test,
    quantile_test,
    ratio_test,
    welch_test,
)
from .corrections import adjust, homogeneity_test, srm_check
from .decisions import decide, evaluate_guardrails
from .metrics import METRICS, CustomMetric, MetricDef
from .paired import ShadowPairs, shadow_rows
from .power import power_row
from .quantiles import QuantileEstimate, quantile_ci
from .segments import segment_breakdown
from .spec import ExperimentSpec
from .sufficient import CupedStats, ProportionStats, RatioStats, SampleStats

AnyMetric = MetricDef | CustomMetric

NAN = math.nan


def _as_sample(r: RatioStats) -> SampleStats:
    # request-randomized rows hold one request each (y ∈ {0, 1}, x = 0 when y = 0)
    return SampleStats(r.sum_y, r.sum_x, r.sum_x2)


def _as_proportion(r: RatioStats) -> ProportionStats:
    return ProportionStats(r.sum_y, r.sum_x)


def _custom(m: AnyMetric) -> bool:
    return isinstance(m, CustomMetric)


def _unit_level(m: AnyMetric) -> bool:
    return _custom(m) and m.aggregation in ("unit_mean", "unit_sum")


def _scaled(r: RatioStats, k: float) -> RatioStats:
    if k == 1.0:
        return r
    return RatioStats(r.n, k * r.sum_x, k * k * r.sum_x2, r.sum_y, r.sum_y2, k * r.sum_xy)


def _scale(m: AnyMetric) -> float:
    return m.scale if _custom(m) and m.kind == "ratio" else 1.0


def _ratio(m: AnyMetric, vs: VariantStats) -> RatioStats:
    return _scaled(vs.ratios.get(m.name) or RatioStats(), _scale(m))


def _quantile(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> QuantileEstimate:
    key = m.name if _custom(m) else m.numerator  # built-ins share the latency's histogram
    hist = vs.histograms.get(key)
    if hist is None:
        return QuantileEstimate(0, m.quantile or NAN, NAN, NAN, NAN, NAN)
    deff = 1.0 if spec.request_randomized else vs.design_effect(key)
    return quantile_ci(hist, m.quantile, alpha=spec.alpha, design_effect=deff)


def arm_estimate(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> tuple[float, float, float, tuple[float, float]]:
    """(estimate, variance of the estimate, n, interval) of one variant's own metric value."""
    if m.kind == "quantile":
        q = _quantile(spec, m, vs)
        return q.estimate, q.se**2, float(q.n), (q.lo, q.hi)
    if _unit_level(m):
        smp = vs.samples.get(m.name) or SampleStats()
        est, var = smp.mean, smp.mean_variance
        return est, var, smp.n, mean_ci(est, var, alpha=spec.alpha)
    r = _ratio(m, vs)
    if spec.request_randomized and m.kind == "mean":
        var = _as_sample(r).mean_variance
    elif spec.request_randomized and m.kind == "proportion":
        var = _as_proportion(r).mean_variance
    else:
        var = r.mean_variance
    est = r.ratio
    return est, var, r.sum_y, mean_ci(est, var, alpha=spec.alpha)


def _arm(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> dict[str, Any]:
    est, _, n, ci = arm_estimate(spec, m, vs)
    return {"n": n, "estimate": est, "ci": list(ci)}


def _cuped_pair(spec: ExperimentSpec, m: AnyMetric, control: VariantStats, variant: VariantStats):
    """The CUPED statistics of both arms when CUPED applies to ``m``, else None."""
    if not spec.cuped or m.kind == "quantile" or (_custom(m) and not m.cuped):
        return None
    if m.name in control.cuped and m.name in variant.cuped:
        k = _scale(m)
        return control.cuped[m.name].scaled(k), variant.cuped[m.name].scaled(k)
    return None


def compare_metric(
    spec: ExperimentSpec, m: AnyMetric, control: VariantStats, variant: VariantStats, *, cuped: bool = True
) -> Comparison:
    """Pick the right test for the metric, its aggregation and the randomization unit."""
    kw = {"alpha": spec.alpha, "sequential": spec.tuning_n if spec.sequential else None}
    if m.kind == "quantile":
        return quantile_test(_quantile(spec, m, control), _quantile(spec, m, variant), **kw)
    pair = _cuped_pair(spec, m, control, variant) if cuped else None
    if pair is not None:
        return (cuped_mean_test if _unit_level(m) else cuped_test)(*pair, **kw)
    if _unit_level(m):  # one value per unit (its mean or its total): Welch over units
        return welch_test(variant_sample(control, m), variant_sample(variant, m), **kw)
    rc, rt = _ratio(m, control), _ratio(m, variant)
    if spec.request_randomized and m.kind == "mean":
        return welch_test(_as_sample(rc), _as_sample(rt), **kw)
    if spec.request_randomized and m.kind == "proportion":
        return proportion_test(_as_proportion(rc), _as_proportion(rt), **kw)
    return ratio_test(rc, rt, **kw)  # user/session units: delta method over units


def variant_sample(vs: VariantStats, m: AnyMetric) -> SampleStats:
    return vs.samples.get(m.name) or SampleStats()


def _power_arm(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> tuple[tuple[float, float, float], float | None]:
    """((estimate, variance, randomization units behind it), units per second) of one arm."""
    est, var, _, _ = arm_estimate(spec, m, vs)
    units = variant_sample(vs, m).n if _custom(m) and m.aggregation == "unit_mean" else vs.units
    rate = units / vs.duration_s if vs.duration_s else None
    return (est, var, units), rate


def _power(spec: ExperimentSpec, m: AnyMetric, control: VariantStats, vs: VariantStats, c: Comparison) -> dict[str, Any]:
    arm_c, rate_c = _power_arm(spec, m, control)
    arm_t, rate_t = _power_arm(spec, m, vs)
    if c.ok and c.variance_reduction is not None and 0 < c.variance_reduction < 1:
        # CUPED: the test runs on the adjusted values, whose variance is this much smaller
        keep = 1 - c.variance_reduction
        arm_c, arm_t = ((e, v * keep, n) for e, v, n in (arm_c, arm_t))
    return power_row(mde_rel=spec.mde_for(m.name), alpha=spec.alpha, control=arm_c, variant=arm_t, rates=(rate_c, rate_t))


def _comparison_fields(c: Comparison) -> dict[str, Any]:
    return {
        "abs_diff": c.abs_diff, "abs_ci": list(c.abs_ci), "rel_diff": c.rel_diff, "rel_ci": list(c.rel_ci),
        "p_value": c.p_value,
    }


def _cuped_report(spec: ExperimentSpec, m: AnyMetric, c: Comparison, control: VariantStats, vs: VariantStats):
    if not (c.method.startswith("cuped") and c.ok):
        return None
    plain = compare_metric(spec, m, control, vs, cuped=False)
    return {
        "covariate": m.cuped if _custom(m) else "pre_period",
        "theta": c.theta,
        "variance_reduction": c.variance_reduction,
        "unadjusted": _comparison_fields(plain),
    }


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


def empty_variant(custom: tuple[CustomMetric, ...] = ()) -> VariantStats:
    names = [m.name for m in METRICS.values() if m.kind != "quantile"] + ["coverage"] + [m.name for m in custom]
    samples = {m.name: SampleStats() for m in custom if _unit_level(m)}
    return VariantStats(0.0, {n: RatioStats() for n in names}, samples=samples)


def analyze(
    *,
    spec: ExperimentSpec,
    stats: Mapping[str, VariantStats],
    exposures: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
    segments: Mapping[str, Mapping[str, Mapping[str, VariantStats]]] | None = None,
    shadows: ShadowPairs | None = None,
) -> dict[str, Any]:
    """The CONTRACTS analysis object for one experiment (JSON-ready).

    ``segments``: per dimension, per value, per-variant statistics of that slice; adds
    the ``segments`` breakdown (:func:`.segments.segment_breakdown`).
    ``shadows``: the experiment's shadow requests paired with their primaries; adds the
    ``shadows`` rows (:func:`.paired.shadow_rows`) when there is any shadow activity.
    """
    stats = {v.key: stats.get(v.key) or empty_variant(spec.custom) for v in spec.variants}
    unit_counts = exposures if exposures is not None else {k: s.units for k, s in stats.items()}
    srm = srm_check(unit_counts, spec.weights)
    if spec.adaptive:  # the allocator moved the weights between phases: no fixed split to check
        srm = type(srm)(math.nan, math.nan, False, srm.observed, {})
    control = stats[spec.control]

    rows: list[dict[str, Any]] = []
    for name in spec.metrics:
        m = spec.metric_def(name)
        for v in spec.variants:
            vs = stats[v.key]
            row: dict[str, Any] = {"metric": name, "variant": v.key, "units": vs.units, **_arm(spec, m, vs)}
            row["lower_is_better"] = m.lower_is_better
            row.update(
                custom=_custom(m), type=m.kind, aggregation=m.aggregation if _custom(m) else "request", cuped=None,
            )
            if v.key == spec.control:
                row.update(
                    abs_diff=None, abs_ci=[None, None], rel_diff=None, rel_ci=[None, None],
                    p_value=None, p_value_adjusted=None, method="control", error=None,
                )
            else:
                c = compare_metric(spec, m, control, vs)
                if c.method.startswith("cuped") and c.ok:
                    row["estimate_cuped"] = c.variant
                row.update(**_comparison_fields(c), method=c.method, error=c.error)
                row["cuped"] = _cuped_report(spec, m, c, control, vs)
                row["power"] = _power(spec, m, control, vs, c)
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
        "segments": segment_breakdown(spec, segments) if segments else [],
    }
    if shadows is not None and shadows.active:
        result["shadows"] = shadow_rows(spec, shadows)
    if extra:
        result.update(extra)
    return json_ready(result)
