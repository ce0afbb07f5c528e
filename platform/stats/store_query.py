"""Results from the ClickHouse store: one GROUP BY per (variant, unit), then the engine.

The SQL returns exactly the per-unit columns of :mod:`.metrics`, plus per-variant
log-bucket histograms (the same bucketing as :func:`histogram_bucket`), unit exposures
and the time span for goodput per second. Values go through clickhouse-connect
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


def unit_aggregates_sql(spec: ExperimentSpec, *, final: bool = True) -> tuple[str, dict[str, Any]]:
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
    unit = "i.trace_id" if spec.request_randomized else "i.unit_id"
    fin = _final(final)
    latencies = ",\n".join(
        f"sum(ifNull(i.{m}, 0)) AS {m}_sum, count(i.{m}) AS {m}_n"
        + (f", sum(ifNull(i.{m}, 0) * ifNull(i.{m}, 0)) AS {m}_sq" if m in HISTOGRAM_SOURCES else "")
        for m in ("e2e_ms", "ttft_ms", "tpot_ms")
    )
    sql = f"""
        SELECT toString(i.variant) AS variant, {unit} AS unit_id,
               toFloat64(count()) AS requests,
               toFloat64(countIf(i.is_error)) AS errors,
               {latencies},
               sum(i.cost) AS cost_usd_sum,
               toFloat64(countIf(l.has = 1)) AS labeled,
               toFloat64(sumIf(l.label, l.has = 1)) AS correct,
               sumIf(i.cost, l.has = 1) AS labeled_cost_usd_sum,
               toFloat64(countIf({' AND '.join(good)})) AS good
        FROM (
            SELECT r.trace_id AS trace_id, r.variant AS variant, r.unit_id AS unit_id,
                   r.e2e_ms AS e2e_ms, r.ttft_ms AS ttft_ms, r.tpot_ms AS tpot_ms,
                   toFloat64(ifNull(if(b.has = 1, b.billed, r.cost_usd), 0)) AS cost,
                   (r.error IS NOT NULL AND r.error != '') AS is_error
            FROM raw_events AS r {fin}
            LEFT JOIN (
                SELECT trace_id, sum(cost_usd) AS billed, toUInt8(1) AS has FROM raw_events {fin}
                WHERE type = 'cost' AND cost_usd IS NOT NULL GROUP BY trace_id
            ) AS b ON b.trace_id = r.trace_id
            WHERE r.type = 'inference' AND r.experiment = {{experiment:String}}
              AND (r.e2e_ms IS NULL OR r.e2e_ms >= 0) AND (r.ttft_ms IS NULL OR r.ttft_ms >= 0)
        ) AS i
        LEFT JOIN (
            SELECT trace_id, toFloat64(ifNull(argMax(correct, ts), 0)) AS label, toUInt8(1) AS has FROM raw_events {fin}
            WHERE type = 'feedback' AND correct IS NOT NULL GROUP BY trace_id
        ) AS l ON l.trace_id = i.trace_id
        GROUP BY variant, unit_id
    """
    return sql, params


def histogram_sql(latency: str, *, final: bool = True) -> str:
    if latency not in HISTOGRAM_SOURCES:
        raise ValueError(f"latency: no histogram for {latency!r}")
    return f"""
        SELECT toString(variant) AS variant, {histogram_bucket_sql(latency)} AS bucket, count() AS n
        FROM raw_events {_final(final)}
        WHERE type = 'inference' AND experiment = {{experiment:String}} AND {latency} IS NOT NULL AND {latency} >= 0
        GROUP BY variant, bucket
    """


def _exposures_sql(final: bool) -> str:
    return f"""
        SELECT toString(variant) AS variant, uniqExact(unit_id) AS units FROM raw_events {_final(final)}
        WHERE type = 'exposure' AND experiment = {{experiment:String}} GROUP BY variant
    """


def _span_sql(final: bool) -> str:
    return f"""
        SELECT toFloat64(dateDiff('millisecond', min(ts), max(ts))) / 1000 AS span_s FROM raw_events {_final(final)}
        WHERE type = 'inference' AND experiment = {{experiment:String}}
    """


def _columns(client: "Client", sql: str, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    table = client.query_arrow(sql, parameters=dict(params))
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


def variant_stats_from_store(client: "Client", spec: ExperimentSpec, *, final: bool = True) -> tuple[dict[str, VariantStats], dict[str, float] | None]:
    sql, params = unit_aggregates_sql(spec, final=final)
    units = _columns(client, sql, params)
    histograms: dict[str, dict[str, HistogramStats]] = {}
    for latency in HISTOGRAM_SOURCES:
        h = _columns(client, histogram_sql(latency, final=final), {"experiment": spec.key})
        for variant in np.unique(h["variant"]) if h["variant"].size else []:
            mask = h["variant"] == variant
            histograms.setdefault(str(variant), {})[latency] = HistogramStats.from_buckets(h["bucket"][mask], h["n"][mask])
    exp = _columns(client, _exposures_sql(final), {"experiment": spec.key})
    exposures = None
    if exp["variant"].size and not spec.request_randomized:
        got = dict(zip(map(str, exp["variant"]), exp["units"].tolist()))
        exposures = {v.key: float(got.get(v.key, 0)) for v in spec.variants}
    span = _columns(client, _span_sql(final), {"experiment": spec.key})["span_s"]
    durations = {v.key: float(span[0]) for v in spec.variants} if span.size and span[0] and span[0] > 0 else None
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped)
    return stats, exposures


def results_from_store(client: "Client", spec: ExperimentSpec, *, final: bool = True) -> dict[str, Any]:
    """The ``GET /v1/experiments/{key}/results`` object, straight from the store."""
    stats, exposures = variant_stats_from_store(client, spec, final=final)
    return analyze(spec=spec, stats=stats, exposures=exposures)
