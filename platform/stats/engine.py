"""The one top-level analysis: per-variant statistics in, CONTRACTS "Analysis output" out.

``analyze_results(spec=…, stats=…)`` builds the closed result models
(:mod:`.result_models`) and serves both the results API (stats built from a ClickHouse
``GROUP BY experiment, variant, unit_id``) and ``ablab analyze`` (stats built from an event
file), so both give the same JSON (:func:`analyze` writes it). Pure: no I/O, NaN becomes
``null``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

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
from .custom_metric import CUSTOM_METRIC_TYPES, CustomMetric, RatioMetric
from .decisions import decide, evaluate_guardrails
from .metrics import METRICS, MetricDef
from .paired import ShadowPairs, shadow_rows
from .power import power_row
from .quantiles import QuantileEstimate, quantile_ci
from .result_models import (
    Coverage,
    CoverageArm,
    Cuped,
    Inference,
    MetricRow,
    Power,
    Results,
    Segment,
    ShadowRow,
    Srm,
    Unadjusted,
    json_ready,
)
from .segments import segment_breakdown
from .spec import ExperimentSpec, analysis_window
from .sufficient import CupedStats, ProportionStats, RatioStats, SampleStats

__all__ = ["analyze_results", "arm_estimate", "compare_metric", "empty_variant", "json_ready"]

AnyMetric = MetricDef | CustomMetric

NAN = math.nan


def _as_sample(r: RatioStats) -> SampleStats:
    # request-randomized rows hold one request each (y ∈ {0, 1}, x = 0 when y = 0)
    return SampleStats(r.sum_y, r.sum_x, r.sum_x2)


def _as_proportion(r: RatioStats) -> ProportionStats:
    return ProportionStats(r.sum_y, r.sum_x)


def _unit_level(m: AnyMetric) -> bool:
    return isinstance(m, CUSTOM_METRIC_TYPES) and m.aggregation in ("unit_mean", "unit_sum")


def _scaled(r: RatioStats, k: float) -> RatioStats:
    if k == 1.0:
        return r
    return RatioStats(r.n, k * r.sum_x, k * k * r.sum_x2, r.sum_y, r.sum_y2, k * r.sum_xy)


def _scale(m: AnyMetric) -> float:
    return m.scale if isinstance(m, RatioMetric) else 1.0


def _ratio(m: AnyMetric, vs: VariantStats) -> RatioStats:
    return _scaled(vs.ratios.get(m.name) or RatioStats(), _scale(m))


def _quantile(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> QuantileEstimate:
    key = m.name if isinstance(m, CUSTOM_METRIC_TYPES) else m.numerator  # built-ins share the latency's histogram
    hist = vs.histograms.get(key)
    if hist is None:
        return QuantileEstimate(0, m.quantile or NAN, NAN, NAN, NAN, NAN)
    deff = 1.0 if spec.request_randomized else vs.design_effect(key)
    return quantile_ci(hist, m.quantile or NAN, alpha=spec.alpha, design_effect=deff)


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


def _cuped_pair(
    spec: ExperimentSpec, m: AnyMetric, control: VariantStats, variant: VariantStats
) -> tuple[CupedStats, CupedStats] | None:
    """The CUPED statistics of both arms when CUPED applies to ``m``, else None."""
    if not spec.cuped or m.kind == "quantile" or (isinstance(m, CUSTOM_METRIC_TYPES) and not m.covariate):
        return None
    if m.name in control.cuped and m.name in variant.cuped:
        k = _scale(m)
        return control.cuped[m.name].scaled(k), variant.cuped[m.name].scaled(k)
    return None


def compare_metric(
    spec: ExperimentSpec, m: AnyMetric, control: VariantStats, variant: VariantStats, *, cuped: bool = True
) -> Comparison:
    """Pick the right test for the metric, its aggregation and the randomization unit."""
    alpha, sequential = spec.alpha, (spec.tuning_n if spec.sequential else None)
    if m.kind == "quantile":
        return quantile_test(_quantile(spec, m, control), _quantile(spec, m, variant), alpha=alpha, sequential=sequential)
    pair = _cuped_pair(spec, m, control, variant) if cuped else None
    if pair is not None:
        test = cuped_mean_test if _unit_level(m) else cuped_test
        return test(*pair, alpha=alpha, sequential=sequential)
    if _unit_level(m):  # one value per unit (its mean or its total): Welch over units
        return welch_test(variant_sample(control, m), variant_sample(variant, m), alpha=alpha, sequential=sequential)
    rc, rt = _ratio(m, control), _ratio(m, variant)
    if spec.request_randomized and m.kind == "mean":
        return welch_test(_as_sample(rc), _as_sample(rt), alpha=alpha, sequential=sequential)
    if spec.request_randomized and m.kind == "proportion":
        return proportion_test(_as_proportion(rc), _as_proportion(rt), alpha=alpha, sequential=sequential)
    return ratio_test(rc, rt, alpha=alpha, sequential=sequential)  # user/session units: delta method over units


def variant_sample(vs: VariantStats, m: AnyMetric) -> SampleStats:
    return vs.samples.get(m.name) or SampleStats()


def _power_arm(spec: ExperimentSpec, m: AnyMetric, vs: VariantStats) -> tuple[tuple[float, float, float], float | None]:
    """((estimate, variance, randomization units behind it), units per second) of one arm."""
    est, var, _, _ = arm_estimate(spec, m, vs)
    units = variant_sample(vs, m).n if isinstance(m, CUSTOM_METRIC_TYPES) and m.aggregation == "unit_mean" else vs.units
    rate = units / vs.duration_s if vs.duration_s else None
    return (est, var, units), rate


def _power(spec: ExperimentSpec, m: AnyMetric, control: VariantStats, vs: VariantStats, c: Comparison) -> Power:
    arm_c, rate_c = _power_arm(spec, m, control)
    arm_t, rate_t = _power_arm(spec, m, vs)
    if c.ok and c.variance_reduction is not None and 0 < c.variance_reduction < 1:
        # CUPED: the test runs on the adjusted values, whose variance is this much smaller
        keep = 1 - c.variance_reduction
        arm_c, arm_t = ((e, v * keep, n) for e, v, n in (arm_c, arm_t))
    row = power_row(mde_rel=spec.mde_for(m.name), alpha=spec.alpha, control=arm_c, variant=arm_t, rates=(rate_c, rate_t))
    return Power.model_validate(row)


def _unadjusted(c: Comparison) -> Unadjusted:
    return Unadjusted(
        abs_diff=c.abs_diff, abs_ci=list(c.abs_ci), rel_diff=c.rel_diff, rel_ci=list(c.rel_ci), p_value=c.p_value, se=c.se,
    )


def _cuped_report(spec: ExperimentSpec, m: AnyMetric, c: Comparison, control: VariantStats, vs: VariantStats) -> Cuped | None:
    if not (c.method.startswith("cuped") and c.ok):
        return None
    plain = compare_metric(spec, m, control, vs, cuped=False)
    return Cuped(
        covariate=m.covariate if isinstance(m, CUSTOM_METRIC_TYPES) else "pre_period",
        theta=c.theta,
        variance_reduction=c.variance_reduction,
        control_adjusted=c.control,
        variant_adjusted=c.variant,
        unadjusted=_unadjusted(plain),
    )


def _coverage(spec: ExperimentSpec, stats: Mapping[str, VariantStats]) -> Coverage:
    by_variant: dict[str, CoverageArm] = {}
    labeled: dict[str, float] = {}
    requests: dict[str, float] = {}
    for v in spec.variants:
        r = stats[v.key].ratios["coverage"]
        labeled[v.key], requests[v.key] = r.sum_x, r.sum_y
        by_variant[v.key] = CoverageArm(labeled=r.sum_x, requests=r.sum_y, coverage=r.ratio)
    p = homogeneity_test(labeled, requests)
    return Coverage(by_variant=by_variant, p_value=p, flagged=bool(math.isfinite(p) and p < spec.coverage_alpha))


def empty_variant(custom: tuple[CustomMetric, ...] = ()) -> VariantStats:
    names = [m.name for m in METRICS.values() if m.kind != "quantile"] + ["coverage"] + [m.name for m in custom]
    samples = {m.name: SampleStats() for m in custom if _unit_level(m)}
    return VariantStats(0.0, {n: RatioStats() for n in names}, samples=samples)


def _row(
    spec: ExperimentSpec, name: str, m: AnyMetric, variant: str, vs: VariantStats, control: VariantStats,
    c: Comparison | None, p_adjusted: float | None,
) -> MetricRow:
    """One metric of one variant; ``c`` is None for the control (its comparison fields are null)."""
    est, _, n, ci = arm_estimate(spec, m, vs)
    cuped_ok = c is not None and c.ok and c.method.startswith("cuped")
    return MetricRow(
        metric=name, variant=variant, units=vs.units, n=n, estimate=est, ci=list(ci),
        lower_is_better=m.lower_is_better,
        custom=isinstance(m, CUSTOM_METRIC_TYPES), type=m.kind, aggregation=m.aggregation if isinstance(m, CUSTOM_METRIC_TYPES) else "request",
        abs_diff=None if c is None else c.abs_diff,
        abs_ci=[None, None] if c is None else list(c.abs_ci),
        rel_diff=None if c is None else c.rel_diff,
        rel_ci=[None, None] if c is None else list(c.rel_ci),
        p_value=None if c is None else c.p_value,
        se=None if c is None else c.se,
        p_value_adjusted=p_adjusted,
        method="control" if c is None else c.method,
        error=None if c is None else c.error,
        estimate_cuped=c.variant if c is not None and cuped_ok else None,
        cuped=None if c is None else _cuped_report(spec, m, c, control, vs),
        power=None if c is None else _power(spec, m, control, vs, c),
        coverage=vs.ratios["coverage"].ratio if name == "accuracy" else None,
        per_second=vs.ratios["goodput"].sum_x / vs.duration_s if name == "goodput" and vs.duration_s else None,
    )


def analyze_results(
    *,
    spec: ExperimentSpec,
    stats: Mapping[str, VariantStats],
    exposures: Mapping[str, float] | None = None,
    extra: Mapping[str, Any] | None = None,
    segments: Mapping[str, Mapping[str, Mapping[str, VariantStats]]] | None = None,
    shadows: ShadowPairs | None = None,
) -> Results:
    """The CONTRACTS analysis object for one experiment, built as the closed result models.

    ``segments``: per dimension, per value, per-variant statistics of that slice; adds
    the ``segments`` breakdown (:func:`.segments.segment_breakdown`).
    ``shadows``: the experiment's shadow requests paired with their primaries; adds the
    ``shadows`` rows (:func:`.paired.shadow_rows`) when there is any shadow activity.
    ``extra``: further top-level fields the models declare (``data_quality``).
    """
    stats = {v.key: stats.get(v.key) or empty_variant(spec.custom) for v in spec.variants}
    unit_counts = exposures if exposures is not None else {k: s.units for k, s in stats.items()}
    srm = srm_check(unit_counts, spec.weights)
    control = stats[spec.control]

    # every comparison first: the multiplicity correction runs over all of them at once
    cells: list[tuple[str, AnyMetric, str, Comparison | None]] = []
    for name in spec.metrics:
        m = spec.metric_def(name)
        for v in spec.variants:
            c = None if v.key == spec.control else compare_metric(spec, m, control, stats[v.key])
            cells.append((name, m, v.key, c))
    adjusted = iter(adjust([c.p_value for *_, c in cells if c is not None], spec.correction))
    rows = [
        _row(spec, name, m, key, stats[key], control, c, None if c is None else next(adjusted))
        for name, m, key, c in cells
    ]

    by_key = {(r.metric, r.variant): r for r in rows}
    coverage = _coverage(spec, stats)
    guardrails = evaluate_guardrails(spec, by_key)
    # adaptive: the allocator moved the weights between phases, so no fixed split to check
    srm_flagged = bool(srm.flagged) and not spec.adaptive
    srm_p = math.nan if spec.adaptive else srm.p_value
    decisions = decide(spec, by_key, guardrails, srm_flagged=srm_flagged, srm_p=srm_p, coverage_flagged=coverage.flagged)
    return Results(
        experiment=spec.key,
        control=spec.control,
        unit=spec.unit,
        alpha=spec.alpha,
        inference=Inference(
            sequential=spec.sequential,
            method="msprt" if spec.sequential else "fixed_horizon",
            tuning_n=spec.tuning_n if spec.sequential else None,
            correction=spec.correction,
        ),
        srm=Srm(
            p_value=srm_p,
            flagged=srm_flagged,
            statistic=math.nan if spec.adaptive else srm.statistic,
            observed=dict(srm.observed),
            expected={} if spec.adaptive else dict(srm.expected),
            skipped="adaptive allocation: weights changed between phases" if spec.adaptive else None,
        ),
        coverage=coverage,
        metrics=rows,
        guardrails=guardrails,
        decisions=decisions,
        segments=[Segment.model_validate(s) for s in segment_breakdown(spec, segments)] if segments else [],
        shadows=[ShadowRow.model_validate(r) for r in shadow_rows(spec, shadows)] if shadows is not None and shadows.active else None,
        window=analysis_window(spec),
        **dict(extra or {}),
    )
