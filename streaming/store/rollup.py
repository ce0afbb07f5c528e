"""The per-unit rollup (``unit_stats`` and ``unit_segment_stats``, migrations 0006–0013): fed by
the loader, read by results.

Besides the built-in columns, each unit row keeps, per nullable source (the catalogue
fields, ``score``, ``correct``, ``measures.<name>``), Σ value, count, Σ value² and Σ cost_usd in
maps keyed by the source's name, and ``unit_segment_stats`` keeps the same per (unit,
dimension, value) for every dimension the unit's requests carry — so a new measure or
dimension needs no code or migration. Which custom metrics the rollup can serve is stated
once, in :mod:`ablab.platform.stats.unit_agg` (``rollup_unsupported``).

Idempotence comes from recomputation, not accumulation. For each batch the loader:

1. inserts the batch's inference events into ``rollup_events`` (ordered by experiment, unit)
   and its inference pointers, labels and billing records into ``rollup_traces`` (ordered by
   trace), and places every label/billing record whose trace's inference pointer is now
   loaded at its unit in ``rollup_labels`` (migrations 0006–0008) — all ReplacingMergeTrees on
   ``event_id``, so a replayed batch collapses;
2. finds the units the batch touched: the inference events' units, plus, for labels and
   billing records, the unit of their trace (looked up by ``trace_id`` in ``rollup_traces``;
   a label that arrives before its inference event is picked up when that event arrives);
3. recomputes those units' ``unit_stats`` and ``unit_segment_stats`` rows from ``rollup_events``/``rollup_labels`` read with
   ``FINAL`` (primary-key ranges of the touched units only) and
   inserts them (ReplacingMergeTree on ``computed_at``: the newest computation wins).

Only after that does it commit the Kafka offsets. A crash at any point replays the batch,
which rewrites the same rows and the same unit values: nothing is added to a running
total, so nothing is double-counted or lost.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ablab.platform.stats.sufficient import histogram_bucket_sql
from ablab.platform.stats.unit_agg import (
    ALWAYS_PRESENT,
    FIELDS,
    ROLLUP_MAPS,
    ROLLUP_SUMS,
    ROLLUP_VERSION,
    key_keeps_segments,
    rollup_key,
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


def feed(client: Client, raw_rows: Sequence[Sequence[Any]]) -> dict[str, int]:
    """Steps 1–3 of the module docstring for one batch; returns units recomputed per experiment.

    Call it after the batch's ``raw_events`` insert and before the offset commit. A loader
    that defers the recompute over several batches calls :func:`place` per batch and
    :func:`recompute_touched` once, before its commit.
    """
    return recompute_touched(client, place(client, raw_rows))


def place(client: Client, raw_rows: Sequence[Sequence[Any]]) -> dict[str, set[str]]:
    """Steps 1–2 of the module docstring for one batch: the lookup rows written, labels and
    billing records placed at their unit; returns the units touched, by experiment.

    Labels and billing records are placed at their unit (``rollup_labels``) as soon as both
    they and their trace's inference pointer are loaded, in whichever batch completes the
    pair, so a unit's recompute reads primary-key ranges only.
    """
    unit_rows, fact_rows, units, traces = split_batch(raw_rows)
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
    if traces:
        found = client.query(
            "SELECT DISTINCT toString(experiment), unit_id FROM rollup_traces "
            "WHERE type = 'inference' AND trace_id IN {traces:Array(String)}",
            parameters={"traces": sorted(traces)},
        ).result_rows
        for exp, unit in found:
            units[exp].add(unit)
    return dict(units)


def recompute_touched(client: Client, units: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Step 3 for the units :func:`place` returned (of one batch or several); returns units
    recomputed per experiment."""
    done = {}
    for exp, touched in units.items():
        ordered = sorted(set(touched))
        if ordered:
            recompute_units(client, exp, ordered)
            done[exp] = len(ordered)
    return done


# --- the recompute ---------------------------------------------------------------------


def current_slos(client: Client, experiment: str) -> tuple[str, dict[str, float | None]]:
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


def set_slos(client: Client, experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> bool:
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

# the unit's columns, from the per-request rows of _inner_sql (valid: what the raw scan counts)
_SUMS_SQL = """count(),
               toFloat64(countIf(valid)), toFloat64(countIf(valid AND is_error)),
               sumIf(ifNull(e2e_ms, 0), valid), toFloat64(countIf(valid AND e2e_ms IS NOT NULL)),
               sumIf(ifNull(e2e_ms, 0) * ifNull(e2e_ms, 0), valid),
               sumIf(ifNull(ttft_ms, 0), valid), toFloat64(countIf(valid AND ttft_ms IS NOT NULL)),
               sumIf(ifNull(ttft_ms, 0) * ifNull(ttft_ms, 0), valid),
               sumIf(ifNull(tpot_ms, 0), valid), toFloat64(countIf(valid AND tpot_ms IS NOT NULL)),
               sumIf(cost, valid),
               toFloat64(countIf(valid AND has_label)), sumIf(ifNull(label, 0), valid AND has_label),
               sumIf(cost, valid AND has_label),
               toFloat64(countIf(valid AND good)),
               sumMapIf(src, valid), sumMapIf(mapApply((k, v) -> (k, 1.0), src), valid),
               sumMapIf(mapApply((k, v) -> (k, v * v), src), valid), sumMapIf(mapApply((k, v) -> (k, cost), src), valid)"""


def _inner_sql(where: str, *, segments: bool) -> str:
    """One row per loaded request of the units: its sources (``src``: present nullable
    sources by name, measures as ``measures.<name>``), validity, ``good`` and cost."""
    valid = "((e.e2e_ms IS NULL OR e.e2e_ms >= 0) AND (e.ttft_ms IS NULL OR e.ttft_ms >= 0))"
    good = (
        "(e.is_error = 0"
        " AND (isNull({slo_e2e_ms:Nullable(Float64)}) OR (e.e2e_ms IS NOT NULL AND e.e2e_ms <= {slo_e2e_ms:Nullable(Float64)}))"
        " AND (isNull({slo_ttft_ms:Nullable(Float64)}) OR (e.ttft_ms IS NOT NULL AND e.ttft_ms <= {slo_ttft_ms:Nullable(Float64)}))"
        # one output token: no TPOT, cannot break its SLO (as in the raw scan)
        " AND (isNull({slo_tpot_ms:Nullable(Float64)}) OR e.tpot_ms IS NULL OR e.tpot_ms <= {slo_tpot_ms:Nullable(Float64)}))"
    )
    names = [*NULLABLE_SOURCES, "score", "correct"]
    values = [f"toFloat64(ifNull(e.{c}, nan))" for c in NULLABLE_SOURCES] + ["ifNull(l.score, nan)", "ifNull(l.label, nan)"]
    src = (
        "mapFilter((k, v) -> NOT isNaN(v), mapFromArrays("
        f"arrayConcat([{', '.join(repr(n) for n in names)}], arrayMap(k -> concat('measures.', k), mapKeys(e.measures))), "
        f"arrayConcat([{', '.join(values)}], mapValues(e.measures))))"
    )
    seg = (", e.dims AS dims, groupUniqArrayArray(mapKeys(e.dims)) OVER (PARTITION BY e.unit_id) AS unit_dims"
           if segments else "")
    return f"""
            SELECT toString(e.variant) AS variant, e.unit_id AS unit_id, e.ts AS ts,
                   e.e2e_ms AS e2e_ms, e.ttft_ms AS ttft_ms, e.tpot_ms AS tpot_ms,
                   {valid} AS valid, e.is_error = 1 AS is_error, {good} AS good,
                   toFloat64(ifNull(if(b.has = 1, b.billed, e.cost_usd), 0)) AS cost,
                   l.label IS NOT NULL AS has_label, l.label AS label,
                   {src} AS src,
                   toUInt16({histogram_bucket_sql("ifNull(e.e2e_ms, -1)")}) AS hb_e2e,
                   toUInt16({histogram_bucket_sql("ifNull(e.ttft_ms, -1)")}) AS hb_ttft{seg}
            FROM (SELECT * FROM rollup_events FINAL WHERE {where}) AS e
            LEFT JOIN (
                SELECT trace_id, sum(cost_usd) AS billed, toUInt8(1) AS has FROM rollup_labels FINAL
                WHERE {where} AND type = 'cost' AND cost_usd IS NOT NULL GROUP BY trace_id
            ) AS b ON b.trace_id = e.trace_id
            LEFT JOIN (  -- the latest label carrying each field (by event time), as the raw scan takes it
                SELECT trace_id,
                       if(countIf(correct IS NOT NULL) > 0, toFloat64(argMaxIf(assumeNotNull(correct), ts, correct IS NOT NULL)), NULL) AS label,
                       if(countIf(score IS NOT NULL) > 0, argMaxIf(assumeNotNull(score), ts, score IS NOT NULL), NULL) AS score
                FROM rollup_labels FINAL
                WHERE {where} AND type = 'feedback' GROUP BY trace_id
            ) AS l ON l.trace_id = e.trace_id"""


def _recompute_sql(units_given: bool) -> tuple[str, str]:
    """(the unit_stats insert, the unit_segment_stats insert) of the units."""
    where = "experiment = {experiment:String}" + (" AND unit_id IN {units:Array(String)}" if units_given else "")
    cols = f"{', '.join(ROLLUP_SUMS)}, {', '.join(ROLLUP_MAPS)}"
    units = f"""
        INSERT INTO unit_stats (experiment, variant, unit_id, events, {cols},
                                e2e_buckets, e2e_counts, ttft_buckets, ttft_counts, min_ts, max_ts, slo_key, rollup_version, computed_at)
        SELECT {{experiment:String}}, variant, unit_id, {_SUMS_SQL},
               (sumMapIf([hb_e2e], [toUInt64(e2e_ms IS NOT NULL)], valid) AS h_e2e).1, h_e2e.2,
               (sumMapIf([hb_ttft], [toUInt64(ttft_ms IS NOT NULL)], valid) AS h_ttft).1, h_ttft.2,
               if(countIf(valid) > 0, minIf(ts, valid), min(ts)), if(countIf(valid) > 0, maxIf(ts, valid), max(ts)),
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


def recompute_units(client: Client, experiment: str, units: Sequence[str] | None) -> None:
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


def backfill_from_raw(client: Client, experiment: str | None = None) -> None:
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


def sync(client: Client, spec: ExperimentSpec) -> dict[str, int]:
    """The maintenance step for one experiment: its SLOs and whether it
    keeps segment rows written for the loader's recomputes, and what the loader could not know
    repaired (units computed under other SLOs, events that reached ``raw_events`` without it).
    Run on create/update and by the monitor's pass, never by a read."""
    if spec.request_randomized:
        return {"slo": 0, "missing": 0}
    return ensure_fresh(client, spec.key, spec.slos, segments=bool(spec.segments))


def ensure_fresh(client: Client, experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> dict[str, int]:
    """Make the experiment's ``unit_stats`` (and, with ``segments``, ``unit_segment_stats``)
    complete and computed under ``slos``.

    Cheap when nothing is missing (a few counts). Repairs, by recomputing only the affected
    units: units whose SLOs changed, units loaded without a recompute (a recompute lost with
    a crashed process before its replay), and inference events that reached ``raw_events``
    without the loader (copied into the lookup tables first).
    """
    with batch_lock:
        return _ensure_fresh(client, experiment, slos, segments)


def _ensure_fresh(client: Client, experiment: str, slos: Mapping[str, float], segments: bool) -> dict[str, int]:
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


def _backfill_if_behind(client: Client, experiment: str) -> None:
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
