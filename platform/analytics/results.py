"""Results from the ClickHouse store: per-unit rows → per-variant statistics → the engine.

Read only: nothing here writes (the rollup is kept fresh by the loader and by its
maintenance step, ``AnalyticsBackend.sync_rollup``, run when an experiment is created or
changed and by the monitor's pass). Two sources of per-unit rows:

- the per-unit rollup ``unit_stats`` / ``unit_segment_stats`` (about one row per unit, and per
  unit and segment value), when it can give every column of the plan exactly (the rule:
  :func:`ablab.platform.stats.unit_agg.rollup_unsupported`) and is current (computed under the
  experiment's SLOs, segment choice and layout, no request before ``start``);
- otherwise one scan of ``raw_events`` rendered from the experiment's per-unit plan
  (:mod:`ablab.platform.stats.unit_agg`, the same plan ``ablab analyze`` renders in numpy):
  per-unit rows, per-segment rows and histograms in one pass (GROUPING SETS), plus a
  per-unit pre-period query for CUPED and a top-values query for segments.

Shadow requests (``type = 'shadow'``, issue 34) are read from ``raw_events`` either way, each
with its primary (:func:`shadow_pairs`), for the paired analysis.

No SQL about the store's tables lives here: the plan is rendered by
:mod:`ablab.platform.stats.unit_agg` and executed, and the rollup read, by the store through
the port :class:`~ablab.platform.analytics.store_port.AnalyticsReads` (passed in: the API owns
the store; chDB allows one owner per data directory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ablab.platform.stats import paired as pr
from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.aggregates import VariantStats, segment_stats_from_units, variant_stats_from_units
from ablab.platform.stats.attribution import attribution_results
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.metrics import HISTOGRAM_SOURCES
from ablab.platform.stats.result_models import Attribution, PolicyBreakdown, Results
from ablab.platform.stats.spec import ExperimentSpec
from ablab.platform.stats.sufficient import HistogramStats

if TYPE_CHECKING:
    from ablab.platform.analytics.store_port import AnalyticsReads

Segments = dict[str, dict[str, dict[str, VariantStats]]]


@dataclass(eq=False)
class StoreAggregates:
    stats: dict[str, VariantStats]
    exposures: dict[str, float] | None
    segments: Segments | None = None
    source: str = "raw"  # "raw" | "rollup"
    units: dict[str, np.ndarray] | None = None  # the per-unit rows (unit_id: a 64-bit hash of the unit)
    histograms: dict[str, dict[str, HistogramStats]] | None = None


def _exposures(store: AnalyticsReads, spec: ExperimentSpec, *, final: bool) -> dict[str, float] | None:
    # exposures after the analysis end (a ship: every later unit is the shipped variant's) are no part of the split
    got = store.exposures(spec.key, final=final, end_ms=ua.end_ms(spec.end) if spec.end else None)
    if not got or spec.request_randomized:
        return None
    return {v.key: float(got.get(v.key, 0)) for v in spec.variants}


def aggregates_from_raw(store: AnalyticsReads, spec: ExperimentSpec, *, final: bool = True) -> StoreAggregates:
    """Everything the engine reads, from one scan of ``raw_events`` (plus the small queries)."""
    plan = ua.plan(spec)
    billing = store.has_billing()  # the billing join only when there is billing
    probe = ua.store_sql(plan, spec, final=final, billing=billing)
    sql = ua.store_sql(plan, spec, final=final, billing=billing, top=store.top_values(probe))
    rows = store.unit_rows(sql)
    sets = rows.pop("grouping_set")
    pre = store.pre_rows(sql)

    def part(code: int) -> dict[str, np.ndarray]:
        mask = (sets == code) & (rows["requests"] > 0)
        return {k: v[mask] for k, v in rows.items()}

    units = part(sql.sets["units"])
    ua.attach_pre(plan, units, units["unit_id"], pre)
    histograms: dict[str, dict[str, HistogramStats]] = {}
    spans = [0.0]
    for j, h in enumerate(plan.histograms):
        code = sql.sets[f"hist:{h.key}"]
        mask = sets == code
        spans.append(float(rows["span_s"][mask].max()) if mask.any() else 0.0)
        for variant in np.unique(rows["variant"][mask]):
            m = mask & (rows["variant"] == variant)
            histograms.setdefault(str(variant), {})[h.key] = HistogramStats.from_buckets(rows[f"h{j}"][m], rows[h.count_column][m])
    span = max(spans)  # the histogram sets span each variant; the widest is the experiment's span
    durations = {v.key: span for v in spec.variants} if span > 0 else None
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped, custom=spec.custom)
    segments: Segments | None = None
    if plan.segments:
        segments = {}
        for j, dim in enumerate(plan.segments):
            seg = part(sql.sets[f"seg:{dim}"])
            seg["segment"] = seg.pop(f"g{j}")
            ua.attach_pre(plan, seg, seg["unit_id"], pre)
            segments[f"dims.{dim}"] = segment_stats_from_units(seg, cuped=spec.cuped, custom=spec.custom)
    return StoreAggregates(stats, _exposures(store, spec, final=final), segments, "raw", units, histograms)


# --- the per-unit rollup (migrations 0006–0013, written and read by the store; layout: unit_agg) ---


def rollup_applies(spec: ExperimentSpec) -> bool:
    """The rollup can give every per-unit column of the plan exactly (the rule:
    :func:`ablab.platform.stats.unit_agg.rollup_unsupported`)."""
    return ua.rollup_unsupported(ua.plan(spec), spec) is None


def rollup_current(store: AnalyticsReads, spec: ExperimentSpec) -> bool:
    """True when every rollup row of the experiment was computed under its SLOs and the
    current layout, and no request precedes ``spec.start`` (rollup sums are all-time sums)."""
    return store.rollup_current(spec)


def _rollup_segments(store: AnalyticsReads, spec: ExperimentSpec, plan: ua.UnitPlan, units: dict[str, np.ndarray]) -> Segments:
    """Per-segment statistics from ``unit_segment_stats``: the top values by requests, the
    rest folded into "(other)"; a unit with no row for a dimension is all "(none)"."""
    out: Segments = {}
    for dim in plan.segments:
        seg, labels, variants = store.rollup_segments(spec, plan, dim)
        seg["variant"], seg["segment"] = seg.pop("variant_code"), seg.pop("segment_code")
        # a unit whose requests never carry the dimension has no row: its whole row is "(none)"
        unit_variant = np.searchsorted(np.asarray(variants, dtype=object), np.asarray(units["variant"], dtype=object))
        rest = np.ones(units["unit_id"].size, dtype=bool)
        for code in np.unique(unit_variant):
            mine = unit_variant == code
            rest[mine] = ~np.isin(units["unit_id"][mine], seg["unit_id"][seg["variant"] == code])
        n_rest = int(rest.sum())
        fill = {"variant": unit_variant[rest], "segment": np.full(n_rest, labels.index(ua.NONE), dtype=np.uint32)}
        seg = {k: np.concatenate([np.asarray(v), fill[k] if k in fill else np.asarray(units[k])[rest]]) for k, v in seg.items()}
        ua.attach_pre(plan, seg, seg["unit_id"], None)
        out[f"dims.{dim}"] = segment_stats_from_units(seg, names=labels, variants=variants, cuped=spec.cuped, custom=spec.custom)
    return out


def aggregates_from_rollup(store: AnalyticsReads, spec: ExperimentSpec) -> StoreAggregates:
    """Per-variant (and per-segment) statistics from ``unit_stats`` / ``unit_segment_stats``
    (about one row per unit, and per unit and segment value), read only."""
    plan = ua.plan(spec)
    why = ua.rollup_unsupported(plan, spec)
    if why:
        raise ValueError(f"experiment {spec.key!r}: the per-unit rollup cannot give {why}")
    units = store.rollup_units(spec, plan)
    ua.attach_pre(plan, units, units["unit_id"], None)  # no request precedes start (rollup_current)
    per_variant = store.rollup_spans(spec)  # the time span per variant
    buckets = store.rollup_histograms(spec)  # the latency histograms per variant
    histograms: dict[str, dict[str, HistogramStats]] = {}
    for variant, *_ in per_variant:
        mine = buckets["variant"] == variant
        histograms[str(variant)] = {
            lat: HistogramStats.from_buckets(buckets["bucket"][mine & (buckets["latency"] == lat)],
                                             buckets["count"][mine & (buckets["latency"] == lat)])
            for lat in HISTOGRAM_SOURCES
        }
    span = (max(r[2] for r in per_variant) - min(r[1] for r in per_variant)) / 1000 if per_variant else 0.0
    durations = {v.key: span for v in spec.variants} if span > 0 else None
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped, custom=spec.custom)
    segments = _rollup_segments(store, spec, plan, units) if plan.segments else None
    return StoreAggregates(stats, _exposures(store, spec, final=False), segments, "rollup", units, histograms)


def aggregates(store: AnalyticsReads, spec: ExperimentSpec) -> StoreAggregates:
    """The fastest exact source: the rollup where it applies and is current, else the raw scan."""
    if rollup_applies(spec) and rollup_current(store, spec):
        return aggregates_from_rollup(store, spec)
    return aggregates_from_raw(store, spec)


def variant_stats(store: AnalyticsReads, spec: ExperimentSpec) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    agg = aggregates(store, spec)
    return agg.stats, agg.exposures


def shadow_pairs(store: AnalyticsReads, spec: ExperimentSpec, *, final: bool = True) -> pr.ShadowPairs | None:
    """The experiment's shadow requests, each with its primary (issue 34), from ``raw_events``;
    None when it has no shadow activity, which one probe finds out (no FINAL, three columns:
    milliseconds), so results without shadows pay that one query. The SQL is
    :func:`ablab.platform.stats.unit_agg.shadow_sql`; the rows are what
    :func:`ablab.platform.stats.paired.shadow_rows` reads."""
    if not store.shadow_activity(ua.shadow_sql(spec, (), final=final)):
        return None
    sql = ua.shadow_sql(spec, pr.shadow_sources(spec), final=final, billing=store.has_billing())
    rows, requests = store.shadow_rows(sql)

    def values(prefix: str) -> dict[str, np.ndarray]:
        return {src: np.asarray(_floats(rows[f"{prefix}{i}"]), dtype=float) for i, src in enumerate(sql.sources)}

    paired = np.asarray(rows["paired"], dtype=bool)
    return pr.ShadowPairs(
        np.asarray(rows["variant"], dtype=object), paired, np.asarray(rows["primary_key"]).astype(np.uint64),
        values("p"), values("s"), pr.requests_from_rows(requests),
    )


def _floats(column: np.ndarray) -> np.ndarray:
    """A nullable numeric column as floats (NULL → NaN)."""
    if column.dtype == object:
        return np.array([np.nan if v is None else float(v) for v in column], dtype=float)
    return column.astype(float)


def policy_breakdowns(store: AnalyticsReads, spec: ExperimentSpec) -> list[PolicyBreakdown] | None:
    """``results.policies`` (issue 33): one read of the experiment's logged events, only when it
    has a policy variant; the reading and the numbers are ``ablab analyze``'s
    (:func:`ablab.platform.policy.breakdown.policy_results`)."""
    from ablab.platform.policy.breakdown import has_policies, policy_results

    return policy_results(store.logged_events(spec.key), spec) if has_policies(spec) else None


def _analyze(store: AnalyticsReads, spec: ExperimentSpec, agg: StoreAggregates) -> Results:
    policies = policy_breakdowns(store, spec)
    return analyze_results(spec=spec, stats=agg.stats, exposures=agg.exposures, segments=agg.segments,
                           shadows=shadow_pairs(store, spec), extra=None if policies is None else {"policies": policies})


def results(store: AnalyticsReads, spec: ExperimentSpec) -> Results:
    """``GET /v1/experiments/{key}/results`` from the store."""
    return _analyze(store, spec, aggregates(store, spec))


def results_from_raw(store: AnalyticsReads, spec: ExperimentSpec, *, final: bool = True) -> Results:
    return _analyze(store, spec, aggregates_from_raw(store, spec, final=final))


def results_from_rollup(store: AnalyticsReads, spec: ExperimentSpec) -> Results:
    return _analyze(store, spec, aggregates_from_rollup(store, spec))


def attribution(store: AnalyticsReads, spec: ExperimentSpec) -> Attribution:
    """``GET /v1/experiments/{key}/attribution`` from the store; with a policy variant, its
    credit from one read of the logged events (:func:`ablab.platform.policy.credit.policy_credits_from_events`)."""
    from ablab.platform.policy.breakdown import has_policies
    from ablab.platform.policy.credit import policy_credits_from_events

    result = attribution_results(spec=spec, stats=aggregates(store, spec).stats)
    if has_policies(spec):
        result.policies = policy_credits_from_events(store.logged_events(spec.key), spec)
    return result
