"""The per-unit rollup (``unit_stats`` and ``unit_segment_stats``, migrations 0006–0013): fed by
the loader, read by results.

Besides the built-in columns, each unit row keeps, per nullable source (the catalogue
fields, ``score``, ``correct``, ``measures.<name>``), Σ value, count, Σ value² and Σ cost_usd in
maps keyed by the source's name, and ``unit_segment_stats`` keeps the same per (unit,
dimension, value) for every dimension the unit's requests carry — so a new measure or
dimension needs no code or migration. Which custom metrics the rollup can serve is stated
once, in :mod:`ablab.platform.stats.unit_agg` (``rollup_unsupported``).

For each batch the loader:

1. inserts the batch's inference events into ``rollup_events`` (ordered by experiment, unit)
   and its inference pointers, labels and billing records into ``rollup_traces`` (ordered by
   trace), and places every label/billing record whose trace's inference pointer is now
   loaded at its unit in ``rollup_labels`` (migrations 0006–0008) — all ReplacingMergeTrees on
   ``event_id``, so a replayed batch collapses;
2. finds the units the batch touched: the inference events' units, plus, for labels and
   billing records, the unit of their trace (looked up by ``trace_id`` in ``rollup_traces``;
   a label that arrives before its inference event is picked up when that event arrives);
3. writes those units' ``unit_stats`` rows (ReplacingMergeTree on ``computed_at``: the newest
   row wins), in one of two ways:

   - **incremental** (a loader that owns every partition, so no other writer touches its
     units): the unit's current row plus what the batch adds — its new requests, and for a
     request loaded earlier whose label or bill arrived now, the request as it is now minus
     as it was. The cost is the batch's, not the unit's history. Before inserting, the loader
     looks up which of the batch's events are already stored: a unit with one (a replay,
     after a crash between the writes and the offset commit) is recomputed instead, so a
     replay is never added twice;
   - **recompute**: the unit's rows from ``rollup_events``/``rollup_labels`` read with
     ``FINAL`` (primary-key ranges of the touched units only). Used for replays, by loaders
     sharing a group, for experiments that keep ``unit_segment_stats`` (a new dimension moves
     every earlier request of the unit into its "(none)" row), and by the maintenance step.

Only after that does it commit the Kafka offsets. A crash at any point replays the batch, and
the replay recomputes the units it touches from the stored events: nothing is added to a
running total twice, and nothing is lost.

``good`` (goodput) depends on the experiment's SLOs, which live in the registry. They are
written to ``rollup_slos`` when an experiment is created or changed and by the monitor's
maintenance pass (:func:`ensure_fresh`, through ``ablab.platform.analytics.results.sync_rollup``);
every recompute uses them and stamps ``slo_key``, and the maintenance step recomputes the
units whose ``slo_key`` is stale. Results reads never write: one that finds stale units
scans ``raw_events`` instead. All values are bound parameters.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ablab.platform.stats.sufficient import histogram_bucket_sql
from ablab.platform.stats.unit_agg import (
    ALWAYS_PRESENT, FIELDS, ROLLUP_MAPS, ROLLUP_SUMS, ROLLUP_VERSION, key_keeps_segments, rollup_key,
)
from ablab.streaming.store.columns import RAW_COLUMNS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ablab.platform.stats.spec import ExperimentSpec

SLO_COLUMNS = ("e2e_ms", "ttft_ms", "tpot_ms")
ROLLUP_EVENT_COLUMNS = (
    "experiment", "unit_id", "event_id", "trace_id", "variant", "ts", "e2e_ms", "ttft_ms", "tpot_ms", "cost_usd", "is_error",
    "prompt_tokens", "output_tokens", "device_s", "measures", "dims",
)
ROLLUP_TRACE_COLUMNS = ("trace_id", "type", "event_id", "ts", "experiment", "unit_id", "correct", "cost_usd", "score")
# the catalogue fields a request may lack (cost_usd is always present: its own column)
NULLABLE_SOURCES = tuple(f for f in FIELDS if f not in ALWAYS_PRESENT)
_I = {name: i for i, name in enumerate(RAW_COLUMNS)}
# Chunk the unit list of one recompute so its IN-list and join stay small.
_UNITS_PER_RECOMPUTE = 5_000


# --- the loader side -------------------------------------------------------------------


def split_batch(raw_rows: Iterable[Sequence[Any]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, set[str]], set[str]]:
    """``raw_events`` rows → (rollup_events rows, rollup_traces rows, touched units by experiment,
    trace ids of labels/billing whose unit must be looked up)."""
    unit_rows: list[tuple[Any, ...]] = []
    fact_rows: list[tuple[Any, ...]] = []
    units: dict[str, set[str]] = defaultdict(set)
    traces: set[str] = set()
    for r in raw_rows:
        kind, trace = r[_I["type"]], r[_I["trace_id"]]
        if kind == "inference":
            exp, unit = r[_I["experiment"]], r[_I["unit_id"]]
            error = r[_I["error"]]
            unit_rows.append((
                exp, unit, r[_I["event_id"]], trace, r[_I["variant"]], r[_I["ts"]],
                r[_I["e2e_ms"]], r[_I["ttft_ms"]], r[_I["tpot_ms"]], r[_I["cost_usd"]], int(bool(error)),
                _float(r[_I["prompt_tokens"]]), _float(r[_I["output_tokens"]]), _float(r[_I["device_s"]]),
                r[_I["measures"]] or {}, r[_I["dims"]] or {},
            ))
            if trace:
                fact_rows.append((trace, kind, r[_I["event_id"]], r[_I["ts"]], exp, unit, None, None, None))
            units[exp].add(unit)
        elif kind in ("feedback", "cost") and trace:
            fact_rows.append((
                trace, kind, r[_I["event_id"]], r[_I["ts"]], "", "",
                r[_I["correct"]] if kind == "feedback" else None, r[_I["cost_usd"]] if kind == "cost" else None,
                r[_I["score"]] if kind == "feedback" else None,
            ))
            traces.add(trace)
    return unit_rows, fact_rows, units, traces


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


_MATCH_SQL = """
    INSERT INTO rollup_labels (experiment, unit_id, trace_id, type, event_id, ts, correct, cost_usd, score)
    SELECT p.experiment, p.unit_id, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.cost_usd, f.score
    FROM (SELECT trace_id, type, event_id, ts, correct, cost_usd, score FROM rollup_traces  -- copies collapse in rollup_labels
          WHERE type IN ('feedback', 'cost') AND trace_id IN {traces:Array(String)}) AS f
    INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id FROM rollup_traces
                WHERE type = 'inference' AND trace_id IN {traces:Array(String)}) AS p ON p.trace_id = f.trace_id
"""


def feed(client: "Client", raw_rows: Sequence[Sequence[Any]], *, may_add: Callable[[], bool] | None = None) -> dict[str, int]:
    """Steps 1–3 of the module docstring for one batch; returns units updated per experiment.

    Call it after the batch's ``raw_events`` insert and before the offset commit. Labels and
    billing records are placed at their unit (``rollup_labels``) as soon as both they and their
    trace's inference pointer are loaded, in whichever batch completes the pair, so a unit's
    update reads primary-key ranges only.

    ``may_add``: asked before the batch and again right before each incremental write; while it
    answers True the batch is added to each unit's row instead of recomputing the unit from
    its whole history (see :func:`_increment`). The caller answers True only while it is the
    sole writer of the units (a loader owning every partition, recently polled). Units with an
    event of the batch already stored (a replay) are recomputed either way.
    """
    unit_rows, fact_rows, units, traces = split_batch(raw_rows)
    replayed = _stored_before(client, unit_rows, fact_rows) if may_add is not None and may_add() else None
    if unit_rows:
        client.insert("rollup_events", unit_rows, column_names=list(ROLLUP_EVENT_COLUMNS))
    if fact_rows:
        client.insert("rollup_traces", fact_rows, column_names=list(ROLLUP_TRACE_COLUMNS))
    # Traces whose label/billing ↔ inference pair this batch may complete: the batch's labels,
    # and those of its inference events whose label was loaded first (usually few, so they
    # are looked up before the join rather than joined wholesale).
    pairs = set(traces)
    inference_traces = sorted({r[3] for r in unit_rows if r[3]} - traces)
    for i in range(0, len(inference_traces), _UNITS_PER_RECOMPUTE):
        pairs.update(row[0] for row in client.query(
            "SELECT DISTINCT trace_id FROM rollup_traces WHERE type IN ('feedback', 'cost') AND trace_id IN {traces:Array(String)}",
            parameters={"traces": inference_traces[i:i + _UNITS_PER_RECOMPUTE]},
        ).result_rows)
    pairs = sorted(pairs)
    for i in range(0, len(pairs), _UNITS_PER_RECOMPUTE):
        client.command(_MATCH_SQL, parameters={"traces": pairs[i:i + _UNITS_PER_RECOMPUTE]})
    # the request each label/bill of the batch belongs to, where it is loaded
    pointers: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    if traces:
        for trace, exp, unit, event in client.query(
            "SELECT DISTINCT trace_id, toString(experiment), unit_id, event_id FROM rollup_traces "
            "WHERE type = 'inference' AND trace_id IN {traces:Array(String)}",
            parameters={"traces": sorted(traces)},
        ).result_rows:
            pointers[trace].add((exp, unit, event))
            units[exp].add(unit)
    if replayed is None:
        for exp, touched in units.items():
            recompute_units(client, exp, sorted(touched))
        return {exp: len(touched) for exp, touched in units.items()}
    return _increment(client, unit_rows, fact_rows, units, pointers, replayed, may_add)


def _stored_before(client: "Client", unit_rows: Sequence[tuple[Any, ...]],
                   fact_rows: Sequence[tuple[Any, ...]]) -> tuple[set[tuple[str, str]], set[str]]:
    """(experiment, unit) pairs with an inference event of the batch already stored, and
    traces with a label/bill of the batch already stored: what a replay delivers again."""
    units: set[tuple[str, str]] = set()
    by_exp: dict[str, tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for r in unit_rows:
        by_exp[r[0]][0].add(r[1])
        by_exp[r[0]][1].add(r[2])
    for exp, (unit_ids, event_ids) in by_exp.items():
        units.update((exp, u) for (u,) in client.query(
            "SELECT DISTINCT unit_id FROM rollup_events WHERE experiment = {experiment:String} "
            "AND unit_id IN {units:Array(String)} AND event_id IN {events:Array(String)}",
            parameters={"experiment": exp, "units": sorted(unit_ids), "events": sorted(event_ids)},
        ).result_rows)
    facts = [r for r in fact_rows if r[1] != "inference"]
    traces: set[str] = set()
    if facts:
        traces = {t for (t,) in client.query(
            "SELECT DISTINCT trace_id FROM rollup_traces WHERE type IN ('feedback', 'cost') "
            "AND trace_id IN {traces:Array(String)} AND event_id IN {events:Array(String)}",
            parameters={"traces": sorted({r[0] for r in facts}), "events": sorted({r[2] for r in facts})},
        ).result_rows}
    return units, traces


def _increment(client: "Client", unit_rows: Sequence[tuple[Any, ...]], fact_rows: Sequence[tuple[Any, ...]],
               units: Mapping[str, set[str]], pointers: Mapping[str, set[tuple[str, str, str]]],
               replayed: tuple[set[tuple[str, str]], set[str]], may_add: Callable[[], bool]) -> dict[str, int]:
    """Add the batch to each touched unit's row; recompute the units a replay touched and
    those of experiments that keep segment rows (a new dimension changes every request's
    "(none)" membership, which is no sum of the batch)."""
    replayed_units, replayed_traces = replayed
    replayed_units = replayed_units | {(exp, unit) for t in replayed_traces for exp, unit, _ in pointers.get(t, ())}
    # per (experiment, unit): the batch's new requests, requests loaded before whose label or
    # bill arrived now, and the traces of both (the labels read stay within them)
    new_events: dict[tuple[str, str], set[str]] = defaultdict(set)
    relabeled: dict[tuple[str, str], set[str]] = defaultdict(set)
    unit_traces: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in unit_rows:
        new_events[(r[0], r[1])].add(r[2])
        unit_traces[(r[0], r[1])].add(r[3])
    batch_traces = {r[3] for r in unit_rows}
    facts = [r for r in fact_rows if r[1] != "inference"]
    for r in facts:
        if r[0] in batch_traces:
            continue  # its request is new in this batch: counted with every label loaded so far
        for exp, unit, event in pointers.get(r[0], ()):
            relabeled[(exp, unit)].add(event)
            unit_traces[(exp, unit)].add(r[0])
    new_facts = sorted({r[2] for r in facts})
    done: dict[str, int] = {}
    for exp, touched in units.items():
        key, bounds = current_slos(client, exp)
        keep_all = key_keeps_segments(key) or not may_add()
        full = sorted(touched) if keep_all else sorted(u for u in touched if (exp, u) in replayed_units)
        if full:
            recompute_units(client, exp, full)
        rest = sorted(set(touched) - set(full))
        slo = {"experiment": exp, "slo_key": key, **{f"slo_{c}": b for c, b in bounds.items()}, "new_facts": new_facts}
        for i in range(0, len(rest), _UNITS_PER_RECOMPUTE):
            chunk = [(exp, u) for u in rest[i:i + _UNITS_PER_RECOMPUTE]]
            params = {
                **slo, "units": [u for _, u in chunk],
                "new_events": sorted(e for k in chunk for e in new_events.get(k, ())),
                "relabeled": sorted(e for k in chunk for e in relabeled.get(k, ())),
                "traces": sorted(t for k in chunk for t in unit_traces.get(k, ())),
            }
            with batch_lock:
                if may_add():
                    client.command(_INCREMENT_SQL, parameters=params)
                else:  # no longer the sole writer (a rebalance, a long stall): recompute
                    recompute_units(client, exp, params["units"])
        done[exp] = len(touched)
    return done


# --- the recompute ---------------------------------------------------------------------


def current_slos(client: "Client", experiment: str) -> tuple[str, dict[str, float | None]]:
    """(slo_key, bounds) the experiment's ``good`` is computed under; no row → no SLOs."""
    rows = client.query(
        # the newest row (argMax would skip a NULL bound and keep an older one)
        "SELECT slo_key, e2e_ms, ttft_ms, tpot_ms FROM rollup_slos WHERE experiment = {experiment:String} "
        "ORDER BY updated_at DESC LIMIT 1",
        parameters={"experiment": experiment},
    ).result_rows
    if not rows:
        return rollup_key({}), dict.fromkeys(SLO_COLUMNS)
    key, *bounds = rows[0]
    return str(key), dict(zip(SLO_COLUMNS, (None if b is None else float(b) for b in bounds)))


def set_slos(client: "Client", experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> bool:
    """Record the SLOs ``good`` must use and whether segment rows are kept; True when that
    changed (stale units need a recompute)."""
    key = rollup_key(slos, segments=segments)
    if current_slos(client, experiment)[0] == key:
        return False
    client.insert(
        "rollup_slos",
        [[experiment, key, *(float(slos[c]) if c in slos else None for c in SLO_COLUMNS)]],
        column_names=["experiment", "slo_key", *SLO_COLUMNS],
    )
    return True


# One loader batch (raw insert → lookup inserts → recompute) or one maintenance check at a time
# in this process, so a check never sees a batch half-fed (embedded mode: same process).
batch_lock = threading.RLock()


STALE_SQL = f"(slo_key != {{key:String}} OR rollup_version < {ROLLUP_VERSION})"

# The unit's columns, from the per-request rows of _inner_sql (valid: what the raw scan counts).
# Every row carries a sign and a base flag. A full recompute has sign 1 and base 1 everywhere.
# An incremental step adds, for a request whose label or bill arrived in the batch, the row as
# it is now (sign 1) and as it was (sign -1), both with base 0: their latencies are NULL and
# their catalogue values 0, so only what a label or a bill changes (cost, labels, score,
# correct) moves, and every count cancels exactly.
_SUMS_SQL = """sum(base),
               toFloat64(sumIf(sign, valid)), toFloat64(sumIf(sign, valid AND is_error)),
               sumIf(ifNull(e2e_ms, 0), valid), toFloat64(countIf(valid AND e2e_ms IS NOT NULL)),
               sumIf(ifNull(e2e_ms, 0) * ifNull(e2e_ms, 0), valid),
               sumIf(ifNull(ttft_ms, 0), valid), toFloat64(countIf(valid AND ttft_ms IS NOT NULL)),
               sumIf(ifNull(ttft_ms, 0) * ifNull(ttft_ms, 0), valid),
               sumIf(ifNull(tpot_ms, 0), valid), toFloat64(countIf(valid AND tpot_ms IS NOT NULL)),
               sumIf(sign * cost, valid),
               toFloat64(sumIf(sign, valid AND has_label)), sumIf(sign * ifNull(label, 0), valid AND has_label),
               sumIf(sign * cost, valid AND has_label),
               toFloat64(sumIf(sign, valid AND good)),
               sumMapIf(mapApply((k, v) -> (k, v * sign), src), valid),
               sumMapIf(mapApply((k, v) -> (k, toFloat64(sign)), src), valid),
               sumMapIf(mapApply((k, v) -> (k, v * v * sign), src), valid),
               sumMapIf(mapApply((k, v) -> (k, cost * sign), src), valid)"""


def _inner_sql(where: str, *, segments: bool, events: str = "", labels: str = "", base: bool = True, sign: int = 1) -> str:
    """One row per loaded request of the units: its sources (``src``: present nullable
    sources by name, measures as ``measures.<name>``), validity, ``good`` and cost.

    ``events`` and ``labels`` narrow which requests and which labels/bills are read (both within
    ``where``); ``base`` and ``sign`` as above ``_SUMS_SQL``."""
    valid = "((e.e2e_ms IS NULL OR e.e2e_ms >= 0) AND (e.ttft_ms IS NULL OR e.ttft_ms >= 0))"
    good = (
        "(e.is_error = 0"
        " AND (isNull({slo_e2e_ms:Nullable(Float64)}) OR (e.e2e_ms IS NOT NULL AND e.e2e_ms <= {slo_e2e_ms:Nullable(Float64)}))"
        " AND (isNull({slo_ttft_ms:Nullable(Float64)}) OR (e.ttft_ms IS NOT NULL AND e.ttft_ms <= {slo_ttft_ms:Nullable(Float64)}))"
        # one output token: no TPOT, cannot break its SLO (as in the raw scan)
        " AND (isNull({slo_tpot_ms:Nullable(Float64)}) OR e.tpot_ms IS NULL OR e.tpot_ms <= {slo_tpot_ms:Nullable(Float64)}))"
    )
    keep = "" if base else " * 0"  # NaN (absent) stays NaN: presence still counts, values cancel
    names = [*NULLABLE_SOURCES, "score", "correct"]
    values = [f"toFloat64(ifNull(e.{c}, nan)){keep}" for c in NULLABLE_SOURCES] + ["ifNull(l.score, nan)", "ifNull(l.label, nan)"]
    measures = "mapValues(e.measures)" if base else "arrayMap(v -> v * 0, mapValues(e.measures))"
    src = (
        "mapFilter((k, v) -> NOT isNaN(v), mapFromArrays("
        f"arrayConcat([{', '.join(repr(n) for n in names)}], arrayMap(k -> concat('measures.', k), mapKeys(e.measures))), "
        f"arrayConcat([{', '.join(values)}], {measures})))"
    )
    latency = {c: f"e.{c}" if base else "CAST(NULL AS Nullable(Float64))" for c in SLO_COLUMNS}
    seg = (", e.dims AS dims, groupUniqArrayArray(mapKeys(e.dims)) OVER (PARTITION BY e.unit_id) AS unit_dims"
           if segments else "")
    ev = f" AND {events}" if events else ""
    lab = f" AND {labels}" if labels else ""
    return f"""
            SELECT toString(e.variant) AS variant, e.unit_id AS unit_id, e.ts AS ts, toInt8({sign}) AS sign,
                   toUInt64({int(base)}) AS base,
                   {latency["e2e_ms"]} AS e2e_ms, {latency["ttft_ms"]} AS ttft_ms, {latency["tpot_ms"]} AS tpot_ms,
                   {valid} AS valid, e.is_error = 1 AS is_error, {good} AS good,
                   toFloat64(ifNull(if(b.has = 1, b.billed, e.cost_usd), 0)) AS cost,
                   l.label IS NOT NULL AS has_label, l.label AS label,
                   {src} AS src,
                   toUInt16({histogram_bucket_sql(f"ifNull({latency['e2e_ms']}, -1)")}) AS hb_e2e,
                   toUInt16({histogram_bucket_sql(f"ifNull({latency['ttft_ms']}, -1)")}) AS hb_ttft{seg}
            FROM (SELECT * FROM rollup_events FINAL WHERE {where}{ev}) AS e
            LEFT JOIN (
                SELECT trace_id, sum(cost_usd) AS billed, toUInt8(1) AS has FROM rollup_labels FINAL
                WHERE {where}{lab} AND type = 'cost' AND cost_usd IS NOT NULL GROUP BY trace_id
            ) AS b ON b.trace_id = e.trace_id
            LEFT JOIN (  -- the latest label carrying each field (by event time), as the raw scan takes it
                SELECT trace_id,
                       if(countIf(correct IS NOT NULL) > 0, toFloat64(argMaxIf(assumeNotNull(correct), ts, correct IS NOT NULL)), NULL) AS label,
                       if(countIf(score IS NOT NULL) > 0, argMaxIf(assumeNotNull(score), ts, score IS NOT NULL), NULL) AS score
                FROM rollup_labels FINAL
                WHERE {where}{lab} AND type = 'feedback' GROUP BY trace_id
            ) AS l ON l.trace_id = e.trace_id"""


_UNIT_COLUMNS = (
    "experiment, variant, unit_id, events, {cols}, e2e_buckets, e2e_counts, ttft_buckets, ttft_counts, "
    "min_ts, max_ts, slo_key, rollup_version, computed_at"
)
_HISTOGRAMS_SQL = """(sumMapIf([hb_e2e], [toUInt64(e2e_ms IS NOT NULL)], valid) AS h_e2e).1, h_e2e.2,
               (sumMapIf([hb_ttft], [toUInt64(ttft_ms IS NOT NULL)], valid) AS h_ttft).1, h_ttft.2,
               if(countIf(valid) > 0, minIf(ts, valid), min(ts)), if(countIf(valid) > 0, maxIf(ts, valid), max(ts))"""


def _recompute_sql(units_given: bool) -> tuple[str, str]:
    """(the unit_stats insert, the unit_segment_stats insert) of the units."""
    where = "experiment = {experiment:String}" + (" AND unit_id IN {units:Array(String)}" if units_given else "")
    cols = f"{', '.join(ROLLUP_SUMS)}, {', '.join(ROLLUP_MAPS)}"
    units = f"""
        INSERT INTO unit_stats ({_UNIT_COLUMNS.format(cols=cols)})
        SELECT {{experiment:String}}, variant, unit_id, {_SUMS_SQL},
               {_HISTOGRAMS_SQL},
               {{slo_key:String}}, {ROLLUP_VERSION}, now64(6)
        FROM ({_inner_sql(where, segments=False)})
        GROUP BY variant, unit_id
        SETTINGS join_use_nulls = 0
    """
    # each request counts under each dimension its unit's requests carry: its own value, or "(none)"
    segments = f"""
        INSERT INTO unit_segment_stats (experiment, dim, value, variant, unit_id, events, {cols}, slo_key, computed_at)
        SELECT {{experiment:String}}, dv.1, dv.2, variant, unit_id, {_SUMS_SQL}, {{slo_key:String}}, now64(6)
        FROM ({_inner_sql(where, segments=True)})
        ARRAY JOIN arrayConcat(arrayZip(mapKeys(dims), mapValues(dims)),
                               arrayMap(k -> (k, '(none)'), arrayFilter(k -> NOT mapContains(dims, k), unit_dims))) AS dv
        GROUP BY dv, variant, unit_id
        SETTINGS join_use_nulls = 0
    """
    return units, segments


def _increment_sql() -> str:
    """The unit_stats insert of one incremental step: each unit's current row plus what the
    batch adds (its new requests, and the change its new labels and bills make to requests
    loaded before). The row keeps its own ``slo_key``: a row computed under old SLOs stays
    stale for the maintenance step to recompute, whatever was added to it."""
    where = "experiment = {experiment:String} AND unit_id IN {units:Array(String)}"
    traces = "trace_id IN {traces:Array(String)}"  # the requests' traces: labels read stay within the batch's
    added = " UNION ALL ".join((
        _inner_sql(where, segments=False, events="event_id IN {new_events:Array(String)}", labels=traces),
        _inner_sql(where, segments=False, events="event_id IN {relabeled:Array(String)}", labels=traces, base=False),
        _inner_sql(where, segments=False, events="event_id IN {relabeled:Array(String)}",
                   labels=f"{traces} AND event_id NOT IN {{new_facts:Array(String)}}", base=False, sign=-1),
    ))
    cols = f"{', '.join(ROLLUP_SUMS)}, {', '.join(ROLLUP_MAPS)}"
    as_map = ", ".join(f"CAST({m}, 'Map(String, Float64)') AS {m}" for m in ROLLUP_MAPS)
    sums = ", ".join(f"sum({c})" for c in ROLLUP_SUMS)
    maps = ", ".join(f"sumMap({m})" for m in ROLLUP_MAPS)
    return f"""
        INSERT INTO unit_stats ({_UNIT_COLUMNS.format(cols=cols)})
        SELECT {{experiment:String}}, variant, unit_id, sum(events), {sums}, {maps},
               (sumMap(e2e_buckets, e2e_counts) AS h_e2e).1, h_e2e.2,
               (sumMap(ttft_buckets, ttft_counts) AS h_ttft).1, h_ttft.2,
               if(sum(requests) > 0, minIf(min_ts, requests > 0), min(min_ts)),
               if(sum(requests) > 0, maxIf(max_ts, requests > 0), max(max_ts)),
               argMin(slo_key, part), argMin(rollup_version, part), now64(6)
        FROM (
            SELECT 0 AS part, toString(variant) AS variant, unit_id, events, {', '.join(ROLLUP_SUMS)}, {as_map},
                   e2e_buckets, e2e_counts, ttft_buckets, ttft_counts, min_ts, max_ts, slo_key, rollup_version
            FROM unit_stats FINAL WHERE {where}
            UNION ALL
            SELECT 1, variant, unit_id, {_SUMS_SQL}, {_HISTOGRAMS_SQL}, {{slo_key:String}}, toUInt8({ROLLUP_VERSION})
            FROM ({added}) GROUP BY variant, unit_id
        )
        GROUP BY variant, unit_id
        SETTINGS join_use_nulls = 0
    """


_INCREMENT_SQL = _increment_sql()


def recompute_units(client: "Client", experiment: str, units: Sequence[str] | None) -> None:
    """Rewrite the ``unit_stats`` rows of ``units`` (None: every unit of the experiment) and,
    for an experiment that declares segments, their ``unit_segment_stats`` rows, from
    ``rollup_events``/``rollup_labels`` under the experiment's current SLOs."""
    key, bounds = current_slos(client, experiment)
    params: dict[str, Any] = {"experiment": experiment, "slo_key": key, **{f"slo_{c}": b for c, b in bounds.items()}}
    unit_sql, segment_sql = _recompute_sql(units is not None)
    statements = [unit_sql, segment_sql] if key_keeps_segments(key) else [unit_sql]
    with batch_lock:  # one recompute at a time: the newest computed_at saw the most events
        if units is None:
            for sql in statements:
                client.command(sql, parameters=params)
            return
        for i in range(0, len(units), _UNITS_PER_RECOMPUTE):
            for sql in statements:
                client.command(sql, parameters={**params, "units": list(units[i:i + _UNITS_PER_RECOMPUTE])})


def backfill_from_raw(client: "Client", experiment: str | None = None) -> None:
    """Copy already-loaded raw events into the lookup tables (what migration 0006 does once),
    for all experiments or one; for events that reached ``raw_events`` without the loader
    (a store filled before 0006, test fixtures, imports). Idempotent."""
    exp = " AND experiment = {experiment:String}" if experiment is not None else ""
    params = {"experiment": experiment} if experiment is not None else {}
    client.command(
        "INSERT INTO rollup_events (experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd, is_error, "
        "prompt_tokens, output_tokens, device_s, measures, dims) "
        "SELECT experiment, unit_id, event_id, trace_id, variant, ts, e2e_ms, ttft_ms, tpot_ms, cost_usd, "
        "toUInt8(error IS NOT NULL AND error != ''), prompt_tokens, output_tokens, device_s, measures, dims "
        f"FROM raw_events FINAL WHERE type = 'inference'{exp}",
        parameters=params,
    )
    traces = (
        f"(type = 'inference'{exp} OR (type IN ('feedback', 'cost') AND trace_id IN "
        f"(SELECT trace_id FROM raw_events WHERE type = 'inference'{exp})))"
        if experiment is not None else "type IN ('inference', 'feedback', 'cost')"
    )
    client.command(
        "INSERT INTO rollup_traces (trace_id, type, event_id, ts, experiment, unit_id, correct, cost_usd, score) "
        "SELECT trace_id, type, event_id, ts, if(type = 'inference', experiment, ''), if(type = 'inference', unit_id, ''), "
        "if(type = 'feedback', correct, NULL), if(type = 'cost', cost_usd, NULL), if(type = 'feedback', score, NULL) "
        f"FROM raw_events FINAL WHERE {traces} AND trace_id != ''",
        parameters=params,
    )
    pointers = "type = 'inference'" + exp
    client.command(
        "INSERT INTO rollup_labels (experiment, unit_id, trace_id, type, event_id, ts, correct, cost_usd, score) "
        "SELECT p.experiment, p.unit_id, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.cost_usd, f.score "
        "FROM (SELECT trace_id, type, event_id, ts, correct, cost_usd, score FROM rollup_traces FINAL "
        "      WHERE type IN ('feedback', 'cost')) AS f "
        f"INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id FROM rollup_traces WHERE {pointers}) AS p "
        "ON p.trace_id = f.trace_id",
        parameters=params,
    )


# --- completeness ----------------------------------------------------------------------

_verified: dict[str, int] = {}
_verified_raw: dict[str, tuple[int, int]] = {}


def sync(client: "Client", spec: "ExperimentSpec") -> dict[str, int]:
    """The maintenance step for one experiment: its SLOs and whether it
    keeps segment rows written for the loader's recomputes, and what the loader could not know
    repaired (units computed under other SLOs, events that reached ``raw_events`` without it).
    Run on create/update and by the monitor's pass, never by a read."""
    if spec.request_randomized:
        return {"slo": 0, "missing": 0}
    return ensure_fresh(client, spec.key, spec.slos, segments=bool(spec.segments))


def ensure_fresh(client: "Client", experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> dict[str, int]:
    """Make the experiment's ``unit_stats`` (and, with ``segments``, ``unit_segment_stats``)
    complete and computed under ``slos``.

    Cheap when nothing is missing (a few counts). Repairs, by recomputing only the affected
    units: units whose SLOs changed, units loaded without a recompute (a recompute lost with
    a crashed process before its replay), and inference events that reached ``raw_events``
    without the loader (copied into the lookup tables first).
    """
    with batch_lock:
        return _ensure_fresh(client, experiment, slos, segments)


def _ensure_fresh(client: "Client", experiment: str, slos: Mapping[str, float], segments: bool) -> dict[str, int]:
    _backfill_if_behind(client, experiment)
    set_slos(client, experiment, slos, segments=segments)
    key = rollup_key(slos, segments=segments)
    repaired = {"slo": 0, "missing": 0}
    p = {"experiment": experiment, "key": key}
    counted, n_stale = client.query(
        f"SELECT sum(events), countIf({STALE_SQL}) FROM unit_stats FINAL WHERE experiment = {{experiment:String}}",
        parameters=p).result_rows[0]
    if n_stale:
        stale = [r[0] for r in client.query(
            f"SELECT unit_id FROM unit_stats FINAL WHERE experiment = {{experiment:String}} AND {STALE_SQL}",
            parameters=p).result_rows]
        recompute_units(client, experiment, sorted(set(stale)))
        repaired["slo"] = len(set(stale))
    # every rollup_events row is counted in some unit_stats row (duplicates before a merge make
    # the unmerged count larger; a value already verified is not checked again)
    loaded = client.query("SELECT count() FROM rollup_events WHERE experiment = {experiment:String}", parameters=p).result_rows[0][0]
    if _verified.get(experiment) == loaded:
        return repaired
    counted = counted or 0
    if int(counted) != int(loaded):
        missing = [r[0] for r in client.query(
            """SELECT e.unit_id FROM (SELECT unit_id, count() AS n FROM rollup_events FINAL WHERE experiment = {experiment:String}
                                      GROUP BY unit_id) AS e
               LEFT JOIN (SELECT unit_id, sum(events) AS n FROM unit_stats FINAL WHERE experiment = {experiment:String}
                          GROUP BY unit_id) AS s ON s.unit_id = e.unit_id
               WHERE e.n != s.n SETTINGS join_use_nulls = 0""",
            parameters=p).result_rows]
        if missing:
            total = client.query("SELECT uniqExact(unit_id) FROM rollup_events WHERE experiment = {experiment:String}",
                                 parameters=p).result_rows[0][0]
            recompute_units(client, experiment, None if len(missing) == total else sorted(missing))
            repaired["missing"] = len(missing)
    _verified[experiment] = int(loaded)
    return repaired


def _backfill_if_behind(client: "Client", experiment: str) -> None:
    p = {"experiment": experiment}
    raw, fed = (int(client.query(sql, parameters=p).result_rows[0][0]) for sql in (
        "SELECT count() FROM raw_events WHERE type = 'inference' AND experiment = {experiment:String}",
        "SELECT count() FROM rollup_events WHERE experiment = {experiment:String}",
    ))
    if raw == fed or _verified_raw.get(experiment) == (raw, fed):
        return
    # unmerged duplicates can differ between the two tables: compare exact counts once
    raw_exact, fed_exact = (int(client.query(sql, parameters=p).result_rows[0][0]) for sql in (
        "SELECT count() FROM raw_events FINAL WHERE type = 'inference' AND experiment = {experiment:String}",
        "SELECT count() FROM rollup_events FINAL WHERE experiment = {experiment:String}",
    ))
    if raw_exact != fed_exact:
        backfill_from_raw(client, experiment)
        fed = int(client.query("SELECT count() FROM rollup_events WHERE experiment = {experiment:String}",
                               parameters=p).result_rows[0][0])
    _verified_raw[experiment] = (raw, fed)
