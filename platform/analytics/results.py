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

Every value is a bound parameter; the client is passed in (the API owns it; chDB allows one
owner per data directory).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ablab.platform.stats import paired as pr
from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.aggregates import VariantStats, segment_stats_from_units, variant_stats_from_units
from ablab.platform.stats.engine import analyze
from ablab.platform.stats.metrics import HISTOGRAM_SOURCES
from ablab.platform.stats.spec import ExperimentSpec
from ablab.platform.stats.sufficient import HistogramStats

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

Segments = dict[str, dict[str, dict[str, VariantStats]]]


@dataclass(eq=False)
class StoreAggregates:
    stats: dict[str, VariantStats]
    exposures: dict[str, float] | None
    segments: Segments | None = None
    source: str = "raw"  # "raw" | "rollup"
    units: dict[str, np.ndarray] | None = None  # the per-unit rows (unit_id: a 64-bit hash of the unit)
    histograms: dict[str, dict[str, HistogramStats]] | None = None


def _columns(client: Client, sql: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    table = client.query_arrow(sql, parameters=dict(params))
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def _exposures(client: Client, spec: ExperimentSpec, *, final: bool) -> dict[str, float] | None:
    exp = _columns(client, f"""
        SELECT toString(variant) AS variant, uniqExact(unit_id) AS units FROM raw_events {'FINAL' if final else ''}
        WHERE type = 'exposure' AND experiment = {{experiment:String}} GROUP BY variant
    """, {"experiment": spec.key})
    if not exp["variant"].size or spec.request_randomized:
        return None
    got = dict(zip(map(str, exp["variant"]), exp["units"].tolist()))
    return {v.key: float(got.get(v.key, 0)) for v in spec.variants}


def _top_values(client: Client, sql: ua.StoreSQL) -> dict[str, list[str]]:
    if sql.top_values is None:
        return {}
    rows = client.query(sql.top_values, parameters=sql.params).result_rows
    top: dict[str, list[str]] = {}
    for dim, value, _ in rows:
        top.setdefault(str(dim), []).append(str(value))
    return top


def aggregates_from_raw(client: Client, spec: ExperimentSpec, *, final: bool = True) -> StoreAggregates:
    """Everything the engine reads, from one scan of ``raw_events`` (plus the small queries)."""
    plan = ua.plan(spec)
    # the billing join only when there is billing (a primary-key range check, milliseconds)
    billing = bool(client.query("SELECT count() FROM raw_events WHERE type = 'cost'").result_rows[0][0])
    probe = ua.store_sql(plan, spec, final=final, billing=billing)
    sql = ua.store_sql(plan, spec, final=final, billing=billing, top=_top_values(client, probe))
    rows = _columns(client, sql.main, sql.params)
    sets = rows.pop("grouping_set")
    pre = None
    if sql.pre is not None:
        got = _columns(client, sql.pre, sql.params)
        pre = got if got["unit"].size else None

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
    return StoreAggregates(stats, _exposures(client, spec, final=final), segments, "raw", units, histograms)


# --- the per-unit rollup (migrations 0006–0013, written by the loader's recompute; layout: unit_agg) ---


def rollup_applies(spec: ExperimentSpec) -> bool:
    """The rollup can give every per-unit column of the plan exactly (the rule:
    :func:`ablab.platform.stats.unit_agg.rollup_unsupported`)."""
    return ua.rollup_unsupported(ua.plan(spec), spec, ua.ROLLUP_SUMS) is None


def rollup_current(client: Client, spec: ExperimentSpec) -> bool:
    """True when every ``unit_stats`` row of the experiment was computed under its SLOs and
    the current rollup layout, and no request precedes ``spec.start`` (rollup sums are
    all-time sums)."""
    params: dict[str, Any] = {"experiment": spec.key, "key": ua.rollup_key(spec.slos, segments=bool(spec.segments))}
    early = "0"
    if spec.start:
        params["start_ms"] = ua.start_ms(spec.start)
        early = "toUnixTimestamp64Milli(min_ts) < {start_ms:Int64}"
    stale = client.query(
        f"SELECT countIf(slo_key != {{key:String}} OR rollup_version < {ua.ROLLUP_VERSION} OR ({early} AND requests > 0)) "
        "FROM unit_stats FINAL WHERE experiment = {experiment:String}",
        parameters=params,
    ).result_rows[0][0]
    return not stale


def _rollup_segments(client: Client, spec: ExperimentSpec, plan: ua.UnitPlan, units: dict[str, np.ndarray]) -> Segments:
    """Per-segment statistics from ``unit_segment_stats``: the top values by requests, the
    rest folded into "(other)"; a unit with no row for a dimension is all "(none)"."""
    out: Segments = {}
    base = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
    for dim in plan.segments:
        p: dict[str, Any] = {**base, "dim": dim}
        top = [str(r[0]) for r in client.query(
            "SELECT value, sum(requests) AS c FROM unit_segment_stats FINAL WHERE experiment = {experiment:String} "
            "AND dim = {dim:String} AND variant IN {variants:Array(String)} AND value != {none:String} "
            f"GROUP BY value HAVING c > 0 ORDER BY c DESC, value LIMIT {ua.MAX_SEGMENT_VALUES + 1}",
            parameters={**p, "none": ua.NONE}).result_rows]
        fold = len(top) > ua.MAX_SEGMENT_VALUES  # else every value shows and rows need no summing
        top = top[:ua.MAX_SEGMENT_VALUES]
        # rows come back as integer codes (a value's and a variant's index into the sorted
        # lists below), so nothing downstream converts or sorts strings
        labels = sorted({*top, ua.NONE, ua.OTHER})
        variants = sorted(base["variants"])
        p.update(top=top, none=ua.NONE, other=ua.OTHER, labels=labels, variant_keys=variants)
        # the plan's columns per row first (map lookups), then the folded values summed
        cols = [c.name for c in plan.columns]
        select = ua.rollup_select(plan, ua.ROLLUP_SUMS, p)
        rows = f"""
            SELECT toUInt32(indexOf({{variant_keys:Array(String)}}, variant) - 1) AS variant_code, cityHash64(unit_id) AS unit_id,
                   toUInt32(indexOf({{labels:Array(String)}},
                                    if(value = {{none:String}} OR has({{top:Array(String)}}, value), value, {{other:String}})) - 1) AS segment_code,
                   {select}
            FROM unit_segment_stats FINAL
            WHERE experiment = {{experiment:String}} AND dim = {{dim:String}} AND variant IN {{variants:Array(String)}}
              AND requests > 0"""
        if fold:
            sums = ", ".join(f"sum(`{c}`) AS `{c}`" for c in cols)
            sql = f"SELECT variant_code, unit_id, segment_code, {sums} FROM ({rows}) GROUP BY variant_code, unit_id, segment_code"
        else:
            sql = rows
        seg = _columns(client, sql, p)
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


def aggregates_from_rollup(client: Client, spec: ExperimentSpec) -> StoreAggregates:
    """Per-variant (and per-segment) statistics from ``unit_stats`` / ``unit_segment_stats``
    (about one row per unit, and per unit and segment value), read only."""
    plan = ua.plan(spec)
    why = ua.rollup_unsupported(plan, spec, ua.ROLLUP_SUMS)
    if why:
        raise ValueError(f"experiment {spec.key!r}: the per-unit rollup cannot give {why}")
    p: dict[str, Any] = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
    units = _columns(
        client,
        f"SELECT toString(variant) AS variant, cityHash64(unit_id) AS unit_id, {ua.rollup_select(plan, ua.ROLLUP_SUMS, p)} "
        "FROM unit_stats FINAL "
        "WHERE experiment = {experiment:String} AND variant IN {variants:Array(String)} AND requests > 0",
        p,
    )
    ua.attach_pre(plan, units, units["unit_id"], None)  # no request precedes start (rollup_current)
    where = "WHERE experiment = {experiment:String} AND variant IN {variants:Array(String)} AND requests > 0"
    per_variant = client.query(  # the time span per variant
        "SELECT toString(variant), toUnixTimestamp64Milli(min(min_ts)), toUnixTimestamp64Milli(max(max_ts)) "
        f"FROM unit_stats FINAL {where} GROUP BY variant",
        parameters=p,
    ).result_rows
    # the latency histograms per variant: (bucket, count) pairs unnested and summed, several
    # times cheaper than sumMap over ~50-entry arrays per unit
    buckets = _columns(client, " UNION ALL ".join(
        f"SELECT toString(variant) AS variant, '{lat}' AS latency, b AS bucket, sum(n) AS count FROM unit_stats FINAL "
        f"ARRAY JOIN {lat.removesuffix('_ms')}_buckets AS b, {lat.removesuffix('_ms')}_counts AS n {where} GROUP BY variant, b"
        for lat in HISTOGRAM_SOURCES), p)
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
    segments = _rollup_segments(client, spec, plan, units) if plan.segments else None
    return StoreAggregates(stats, _exposures(client, spec, final=False), segments, "rollup", units, histograms)


def aggregates(client: Client, spec: ExperimentSpec) -> StoreAggregates:
    """The fastest exact source: the rollup where it applies and is current, else the raw scan."""
    if rollup_applies(spec) and rollup_current(client, spec):
        return aggregates_from_rollup(client, spec)
    return aggregates_from_raw(client, spec)


def variant_stats(client: Client, spec: ExperimentSpec) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    agg = aggregates(client, spec)
    return agg.stats, agg.exposures


def shadow_pairs(client: Client, spec: ExperimentSpec, *, final: bool = True) -> pr.ShadowPairs | None:
    """The experiment's shadow requests, each with its primary (issue 34), from ``raw_events``;
    None when it has no shadow activity, which one probe finds out (no FINAL, three columns:
    milliseconds), so results without shadows pay that one query. The SQL is
    :func:`ablab.platform.stats.unit_agg.shadow_sql`; the rows are what
    :func:`ablab.platform.stats.paired.shadow_rows` reads."""
    probe = ua.shadow_sql(spec, (), final=final)
    if not client.query(probe.probe, parameters=probe.params).result_rows[0][0]:
        return None
    billing = bool(client.query("SELECT count() FROM raw_events WHERE type = 'cost'").result_rows[0][0])
    sql = ua.shadow_sql(spec, pr.shadow_sources(spec), final=final, billing=billing)
    rows = _columns(client, sql.pairs, sql.params)

    def values(prefix: str) -> dict[str, np.ndarray]:
        return {src: np.asarray(_floats(rows[f"{prefix}{i}"]), dtype=float) for i, src in enumerate(sql.sources)}

    paired = np.asarray(rows["paired"], dtype=bool)
    return pr.ShadowPairs(
        np.asarray(rows["variant"], dtype=object), paired, np.asarray(rows["primary_key"]).astype(np.uint64),
        values("p"), values("s"), pr.requests_from_rows(_columns(client, sql.requests, sql.params)),
    )


def _floats(column: np.ndarray) -> np.ndarray:
    """A nullable numeric column as floats (NULL → NaN)."""
    if column.dtype == object:
        return np.array([np.nan if v is None else float(v) for v in column], dtype=float)
    return column.astype(float)


def _analyze(client: Client, spec: ExperimentSpec, agg: StoreAggregates) -> dict[str, Any]:
    return analyze(spec=spec, stats=agg.stats, exposures=agg.exposures, segments=agg.segments,
                   shadows=shadow_pairs(client, spec))


def results(client: Client, spec: ExperimentSpec) -> dict[str, Any]:
    """``GET /v1/experiments/{key}/results`` from the store."""
    return _analyze(client, spec, aggregates(client, spec))


def results_from_raw(client: Client, spec: ExperimentSpec, *, final: bool = True) -> dict[str, Any]:
    return _analyze(client, spec, aggregates_from_raw(client, spec, final=final))


def results_from_rollup(client: Client, spec: ExperimentSpec) -> dict[str, Any]:
    return _analyze(client, spec, aggregates_from_rollup(client, spec))


def attribution(client: Client, spec: ExperimentSpec) -> dict[str, Any]:
    """``GET /v1/experiments/{key}/attribution`` from the store."""
    from ablab.platform.stats.attribution import attribute

    return attribute(spec=spec, stats=aggregates(client, spec).stats)
