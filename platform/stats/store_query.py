"""Results from the ClickHouse store: one GROUP BY per (variant, unit), then the engine.

One scan returns exactly the per-unit columns of :mod:`.metrics` and the per-variant
log-bucket histograms (the same bucketing as :func:`histogram_bucket`) through GROUPING
SETS; a second, tiny query counts exposed units. Values go through clickhouse-connect
``parameters=`` binding; SLO column names come from a fixed whitelist. The client is
passed in (the API owns it; chDB allows one owner per data directory).

Feedback rows carry no experiment, so labels are the latest per ``trace_id`` over all
feedback, kept by the join to this experiment's inference events. Billing ``cost``
events replace the worker's estimate for their trace, as in :mod:`.offline`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .aggregates import VariantStats, variant_stats_from_units
from .engine import analyze
from .metrics import HISTOGRAM_SOURCES, SLO_METRICS
from .spec import ExperimentSpec
from .sufficient import HistogramStats, histogram_bucket_sql

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client


def _final(final: bool) -> str:
    return "FINAL" if final else ""


# Which grouping set a row belongs to, with standard GROUPING semantics (bit = 1 when the
# argument is *not* a key of the row's set): per unit, e2e histogram, ttft histogram.
_SET_UNITS, _SET_HIST = 0b011, {"e2e_ms": 0b101, "ttft_ms": 0b110}
_SETTINGS = " SETTINGS force_grouping_standard_compatibility = 1"


def results_sql(spec: ExperimentSpec, *, final: bool = True, billing: bool = True) -> tuple[str, dict[str, Any]]:
    """One scan: per-unit aggregates and both latency histograms via GROUPING SETS.

    Keys are 64-bit hashes (unit, trace), so grouping and the label join hash integers,
    not strings; collisions are negligible at 2^-64 per pair.
    """
    params: dict[str, Any] = {"experiment": spec.key}
    good = ["NOT i.is_error"]
    for name, bound in spec.slos.items():
        if name not in SLO_METRICS:
            raise ValueError(f"slos.{name}: not an SLO metric")
        params[f"slo_{name}"] = float(bound)
        if name == "tpot_ms":  # one output token: no TPOT, cannot break its SLO
            good.append(f"(i.tpot_ms IS NULL OR i.tpot_ms <= {{slo_{name}:Float64}})")
        else:
            good.append(f"(i.{name} IS NOT NULL AND i.{name} <= {{slo_{name}:Float64}})")
    unit = "r.trace_id" if spec.request_randomized else "r.unit_id"
    fin = _final(final)
    latencies = ",\n".join(
        f"sum(ifNull(i.{m}, 0)) AS {m}_sum, toFloat64(count(i.{m})) AS {m}_n"
        + (f", sum(ifNull(i.{m}, 0) * ifNull(i.{m}, 0)) AS {m}_sq" if m in HISTOGRAM_SOURCES else "")
        for m in ("e2e_ms", "ttft_ms", "tpot_ms")
    )
    if billing:
        cost = "toFloat64(ifNull(if(b.has = 1, b.billed, r.cost_usd), 0))"
        billing_join = f"""LEFT JOIN (
                SELECT cityHash64(trace_id) AS t, sum(cost_usd) AS billed, toUInt8(1) AS has FROM raw_events {fin}
                WHERE type = 'cost' AND cost_usd IS NOT NULL GROUP BY t
            ) AS b ON b.t = cityHash64(r.trace_id)"""
    else:
        cost, billing_join = "toFloat64(ifNull(r.cost_usd, 0))", ""
    sql = f"""
        SELECT toString(i.variant) AS variant, i.u AS unit_id, i.hb_e2e AS hb_e2e, i.hb_ttft AS hb_ttft,
               grouping(i.u, i.hb_e2e, i.hb_ttft) AS grouping_set,
               toFloat64(count()) AS requests,
               toFloat64(countIf(i.is_error)) AS errors,
               {latencies},
               sum(i.cost) AS cost_usd_sum,
               toFloat64(countIf(l.has = 1)) AS labeled,
               toFloat64(sumIf(l.label, l.has = 1)) AS correct,
               sumIf(i.cost, l.has = 1) AS labeled_cost_usd_sum,
               toFloat64(countIf({' AND '.join(good)})) AS good,
               toFloat64(dateDiff('millisecond', min(i.ts), max(i.ts))) / 1000 AS span_s
        FROM (
            SELECT cityHash64(r.trace_id) AS t, r.variant AS variant, cityHash64({unit}) AS u, r.ts AS ts,
                   r.e2e_ms AS e2e_ms, r.ttft_ms AS ttft_ms, r.tpot_ms AS tpot_ms,
                   {histogram_bucket_sql("ifNull(r.e2e_ms, -1)")} AS hb_e2e,
                   {histogram_bucket_sql("ifNull(r.ttft_ms, -1)")} AS hb_ttft,
                   {cost} AS cost,
                   (r.error IS NOT NULL AND r.error != '') AS is_error
            FROM raw_events AS r {fin}
            {billing_join}
            WHERE r.type = 'inference' AND r.experiment = {{experiment:String}}
              AND (r.e2e_ms IS NULL OR r.e2e_ms >= 0) AND (r.ttft_ms IS NULL OR r.ttft_ms >= 0)
        ) AS i
        LEFT JOIN (
            SELECT cityHash64(trace_id) AS t, toFloat64(ifNull(argMax(correct, ts), 0)) AS label, toUInt8(1) AS has
            FROM raw_events {fin}
            WHERE type = 'feedback' AND correct IS NOT NULL GROUP BY t
        ) AS l ON l.t = i.t
        GROUP BY GROUPING SETS ((variant, i.u), (variant, i.hb_e2e), (variant, i.hb_ttft))
    """
    return sql, params


def _exposures_sql(final: bool) -> str:
    return f"""
        SELECT toString(variant) AS variant, uniqExact(unit_id) AS units FROM raw_events {_final(final)}
        WHERE type = 'exposure' AND experiment = {{experiment:String}} GROUP BY variant
    """


def _columns(client: "Client", sql: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    table = client.query_arrow(sql, parameters=dict(params))
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def variant_stats_from_store(
    client: "Client", spec: ExperimentSpec, *, final: bool = True
) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    # the billing join only when there is billing (a primary-key range check, milliseconds)
    billing = bool(client.query("SELECT count() FROM raw_events WHERE type = 'cost'").result_rows[0][0])
    sql, params = results_sql(spec, final=final, billing=billing)
    rows = _columns(client, sql + _SETTINGS, params)
    sets = rows["grouping_set"]
    per_unit = sets == _SET_UNITS
    units = {k: v[per_unit] for k, v in rows.items()}
    histograms: dict[str, dict[str, HistogramStats]] = {}
    for latency, code in _SET_HIST.items():
        mask = sets == code
        buckets = rows["hb_e2e" if latency == "e2e_ms" else "hb_ttft"]
        counts = rows[f"{latency}_n"]
        for variant in np.unique(rows["variant"][mask]):
            m = mask & (rows["variant"] == variant)
            histograms.setdefault(str(variant), {})[latency] = HistogramStats.from_buckets(buckets[m], counts[m])
    exp = _columns(client, _exposures_sql(final), {"experiment": spec.key})
    exposures = None
    if exp["variant"].size and not spec.request_randomized:
        got = dict(zip(map(str, exp["variant"]), exp["units"].tolist()))
        exposures = {v.key: float(got.get(v.key, 0)) for v in spec.variants}
    # the histogram sets span each variant; the widest is the experiment's span
    span = float(rows["span_s"][~per_unit].max()) if (~per_unit).any() else 0.0
    durations = {v.key: span for v in spec.variants} if span > 0 else None
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped)
    return stats, exposures


def results_from_store(client: "Client", spec: ExperimentSpec, *, final: bool = True) -> dict[str, Any]:
    """The ``GET /v1/experiments/{key}/results`` object, straight from the store."""
    stats, exposures = variant_stats_from_store(client, spec, final=final)
    return analyze(spec=spec, stats=stats, exposures=exposures)


def attribution_from_store(client: "Client", spec: ExperimentSpec, *, final: bool = True) -> dict[str, Any]:
    """The ``GET /v1/experiments/{key}/attribution`` object, straight from the store."""
    from .attribution import attribute

    stats, _ = variant_stats_from_store(client, spec, final=final)
    return attribute(spec=spec, stats=stats)


# --- the per-unit rollup (migration 0006, fed by the loader; see ablab.streaming.store.rollup) ---


def rollup_applies(spec: ExperimentSpec) -> bool:
    """The rollup holds one row per randomization unit; a request-randomized experiment
    analyses each request as its unit, which the per-unit sums cannot give: raw scan."""
    return not spec.request_randomized


def variant_stats_from_rollup(
    client: "Client", spec: ExperimentSpec, *, refresh: bool = True
) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    """Per-variant statistics from ``unit_stats`` (about one row per unit).

    ``refresh`` first repairs what the loader could not know: units computed under other
    SLOs than ``spec.slos``, units loaded without a recompute (see ``rollup.ensure_fresh``).
    """
    from ablab.streaming.store.rollup import ROLLUP_SUMS, ensure_fresh

    if not rollup_applies(spec):
        raise ValueError(f"experiment {spec.key!r} is request-randomized; the per-unit rollup does not apply")
    if refresh:
        ensure_fresh(client, spec.key, spec.slos)
    p = {"experiment": spec.key}
    units = _columns(
        client,
        f"SELECT toString(variant) AS variant, unit_id, {', '.join(ROLLUP_SUMS)} FROM unit_stats FINAL "
        "WHERE experiment = {experiment:String} AND requests > 0",
        p,
    )
    per_variant = client.query(  # histograms and time span per variant, one pass
        "SELECT toString(variant), (sumMap(e2e_buckets, e2e_counts) AS he).1, he.2, "
        "(sumMap(ttft_buckets, ttft_counts) AS ht).1, ht.2, toUnixTimestamp64Milli(min(min_ts)), "
        "toUnixTimestamp64Milli(max(max_ts)) "
        "FROM unit_stats FINAL WHERE experiment = {experiment:String} AND requests > 0 GROUP BY variant",
        parameters=p,
    ).result_rows
    histograms: dict[str, dict[str, HistogramStats]] = {}
    for variant, e2e_b, e2e_c, ttft_b, ttft_c, _, _ in per_variant:
        histograms[str(variant)] = {
            "e2e_ms": HistogramStats.from_buckets(np.asarray(e2e_b), np.asarray(e2e_c)),
            "ttft_ms": HistogramStats.from_buckets(np.asarray(ttft_b), np.asarray(ttft_c)),
        }
    # the experiment's span (goodput per second), as the raw scan and the offline path take it
    span = (max(r[6] for r in per_variant) - min(r[5] for r in per_variant)) / 1000 if per_variant else 0.0
    exp = _columns(client, _exposures_sql(False), p)
    exposures = None
    if exp["variant"].size:
        got = dict(zip(map(str, exp["variant"]), exp["units"].tolist()))
        exposures = {v.key: float(got.get(v.key, 0)) for v in spec.variants}
    durations = {v.key: span for v in spec.variants} if span > 0 else None
    return variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped), exposures


def results_from_rollup(client: "Client", spec: ExperimentSpec) -> dict[str, Any]:
    stats, exposures = variant_stats_from_rollup(client, spec)
    return analyze(spec=spec, stats=stats, exposures=exposures)


def variant_stats(client: "Client", spec: ExperimentSpec) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    """The fastest exact source: the rollup for unit-randomized experiments, else the raw scan."""
    if rollup_applies(spec):
        return variant_stats_from_rollup(client, spec)
    return variant_stats_from_store(client, spec)


def results(client: "Client", spec: ExperimentSpec) -> dict[str, Any]:
    """``GET /v1/experiments/{key}/results`` from the store (rollup where it applies)."""
    stats, exposures = variant_stats(client, spec)
    return analyze(spec=spec, stats=stats, exposures=exposures)


def attribution(client: "Client", spec: ExperimentSpec) -> dict[str, Any]:
    """``GET /v1/experiments/{key}/attribution`` from the store (rollup where it applies)."""
    from .attribution import attribute

    stats, _ = variant_stats(client, spec)
    return attribute(spec=spec, stats=stats)
