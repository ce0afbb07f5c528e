"""The per-unit rollup (``unit_stats`` and ``unit_segment_stats``, migrations 0006–0013): fed by
the loader, read by results.

Besides the built-in columns, each unit row keeps, per nullable source (the catalogue
fields, ``score``, ``correct``, ``measures.<name>``), Σ value, count, Σ value² and Σ cost in
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
written to ``rollup_slos`` after an experiment is created or changed and by the monitor's
maintenance pass (:meth:`RollupStore.sync`, the port's ``sync_rollup``); every recompute uses
them and stamps ``slo_key``, and the maintenance step recomputes the units whose ``slo_key``
is stale. Results reads never write: one that finds stale units scans ``raw_events`` instead.
All values are bound parameters.

The recompute is a rendering of the per-unit plan (:mod:`ablab.platform.stats.unit_agg`):
its built-in columns (``unit_agg.BUILTIN``) through ``unit_agg.column_sql``, with the one
error rule, ``good`` predicate and validity the raw scan and numpy use. This module also owns
the reading of the rollup tables (:class:`RollupStore`: currency, per-unit rows, histograms,
segment rows), so their layout is known in one place.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ablab.platform import fields
from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.metrics import HISTOGRAM_SOURCES, SLO_METRICS, UNIT_COLUMNS
from ablab.platform.stats.sufficient import histogram_bucket_sql
from ablab.streaming.store.columns import RAW_COLUMNS

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

    from ablab.platform.stats.spec import ExperimentSpec

Columns = dict[str, np.ndarray]

COST = fields.COST_FIELD
SLO_COLUMNS: tuple[str, ...] = SLO_METRICS  # rollup_slos keeps one bound column per SLO field
# the catalogue fields of an inference event, as rollup_events keeps them (Nullable(Float64))
EVENT_FIELDS: tuple[str, ...] = ua.SOURCE_FIELDS
ROLLUP_EVENT_COLUMNS = (
    "experiment", "unit_id", "event_id", "trace_id", "variant", "ts", *EVENT_FIELDS, "is_error", "measures", "dims",
)
ROLLUP_TRACE_COLUMNS = ("trace_id", "type", "event_id", "ts", "experiment", "unit_id", "correct", COST, "score")
# the catalogue fields a request may lack (the cost is always present: its own column)
NULLABLE_SOURCES = tuple(f for f in EVENT_FIELDS if f not in ua.ALWAYS_PRESENT)
_I = {name: i for i, name in enumerate(RAW_COLUMNS)}
# Chunk the unit list of one recompute so its IN-list and join stay small.
_UNITS_PER_RECOMPUTE = 5_000


def histogram_columns(source: str) -> tuple[str, str]:
    """unit_stats' (buckets, counts) columns of a latency's histogram (migration 0006 names
    them by the field's stem, ``<stem>_buckets``)."""
    stem = source.removesuffix("_ms")
    return f"{stem}_buckets", f"{stem}_counts"


# --- the loader side -------------------------------------------------------------------


def split_batch(raw_rows: Iterable[Sequence[Any]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], dict[str, set[str]], set[str]]:
    """``raw_events`` rows → (rollup_events rows, rollup_traces rows, touched units by experiment,
    trace ids of labels/billing whose unit must be looked up)."""
    unit_rows: list[tuple[Any, ...]] = []
    fact_rows: list[tuple[Any, ...]] = []
    units: dict[str, set[str]] = defaultdict(set)
    traces: set[str] = set()
    field_at = [_I[f] for f in EVENT_FIELDS]
    for r in raw_rows:
        kind, trace = r[_I["type"]], r[_I["trace_id"]]
        if kind == "inference":
            exp, unit = r[_I["experiment"]], r[_I["unit_id"]]
            unit_rows.append((
                exp, unit, r[_I["event_id"]], trace, r[_I["variant"]], r[_I["ts"]],
                *(_float(r[i]) for i in field_at), int(ua.is_error(r[_I["error"]])),
                r[_I["measures"]] or {}, r[_I["dims"]] or {},
            ))
            if trace:
                fact_rows.append((trace, kind, r[_I["event_id"]], r[_I["ts"]], exp, unit, None, None, None))
            units[exp].add(unit)
        elif kind in ("feedback", "cost") and trace:
            fact_rows.append((
                trace, kind, r[_I["event_id"]], r[_I["ts"]], "", "",
                r[_I["correct"]] if kind == "feedback" else None, r[_I[COST]] if kind == "cost" else None,
                r[_I["score"]] if kind == "feedback" else None,
            ))
            traces.add(trace)
    return unit_rows, fact_rows, units, traces


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


_LABEL_COLUMNS = f"trace_id, type, event_id, ts, correct, {COST}, score"
_MATCH_SQL = f"""
    INSERT INTO rollup_labels (experiment, unit_id, {_LABEL_COLUMNS})
    SELECT p.experiment, p.unit_id, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.{COST}, f.score
    FROM (SELECT {_LABEL_COLUMNS} FROM rollup_traces  -- copies collapse in rollup_labels
          WHERE type IN ('feedback', 'cost') AND trace_id IN {{traces:Array(String)}}) AS f
    INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id FROM rollup_traces
                WHERE type = 'inference' AND trace_id IN {{traces:Array(String)}}) AS p ON p.trace_id = f.trace_id
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
    ordered = sorted(pairs)
    for i in range(0, len(ordered), _UNITS_PER_RECOMPUTE):
        client.command(_MATCH_SQL, parameters={"traces": ordered[i:i + _UNITS_PER_RECOMPUTE]})
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


# --- the recompute: the per-unit plan's built-in columns over the loaded requests -------


def current_slos(client: Client, experiment: str) -> tuple[str, dict[str, float | None]]:
    """(slo_key, bounds) the experiment's ``good`` is computed under; no row → no SLOs."""
    rows = client.query(
        # the newest row (argMax would skip a NULL bound and keep an older one)
        f"SELECT slo_key, {', '.join(SLO_COLUMNS)} FROM rollup_slos WHERE experiment = {{experiment:String}} "
        "ORDER BY updated_at DESC LIMIT 1",
        parameters={"experiment": experiment},
    ).result_rows
    if not rows:
        return ua.rollup_key({}), dict.fromkeys(SLO_COLUMNS)
    key, *bounds = rows[0]
    return str(key), dict(zip(SLO_COLUMNS, (None if b is None else float(b) for b in bounds)))


def set_slos(client: Client, experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> bool:
    """Record the SLOs ``good`` must use and whether segment rows are kept; True when that
    changed (stale units need a recompute)."""
    key = ua.rollup_key(slos, segments=segments)
    if current_slos(client, experiment)[0] == key:
        return False
    client.insert(
        "rollup_slos",
        [[experiment, key, *(float(slos[c]) if c in slos else None for c in SLO_COLUMNS)]],
        column_names=["experiment", "slo_key", *SLO_COLUMNS],
    )
    return True


# One loader batch (raw insert → lookup inserts → recompute) or one maintenance check at a time
# in this process, so a check never sees a batch half-fed (embedded mode: same process). A
# process-wide lock, not a cache: chDB allows one engine per process.
batch_lock = threading.RLock()


STALE_SQL = f"(slo_key != {{key:String}} OR rollup_version < {ua.ROLLUP_VERSION})"

# The per-request rows of _inner_sql name each source ``v_<source>`` (never a unit column's
# name: ClickHouse would read an aggregate's alias instead), as the plan's columns read them.
_ALIAS: dict[str, str] = {s: f"v_{s}" for s in (*NULLABLE_SOURCES, COST, "error", "correct", "good")}


def _sums_sql() -> str:
    """The unit's columns, from the per-request rows of :func:`_inner_sql` (``valid``: what the
    raw scan counts): the plan's built-in columns, then the per-source maps."""
    builtin = ", ".join(ua.column_sql(c, _ALIAS, "valid") for c in ua.BUILTIN)
    return f"""count(), {builtin},
               sumMapIf(src, valid), sumMapIf(mapApply((k, v) -> (k, 1.0), src), valid),
               sumMapIf(mapApply((k, v) -> (k, v * v), src), valid), sumMapIf(mapApply((k, v) -> (k, {_ALIAS[COST]}), src), valid)"""


def _inner_sql(where: str, bounds: Mapping[str, float | None], params: dict[str, Any], *, segments: bool) -> str:
    """One row per loaded request of the units: its sources (``src``: present nullable
    sources by name, measures as ``measures.<name>``), validity, ``good`` and cost."""
    good = ua.good_sql(bounds, params, prefix="e.", error="(e.is_error = 1)")
    names = [*NULLABLE_SOURCES, "score", "correct"]
    values = [f"toFloat64(ifNull(e.{c}, nan))" for c in NULLABLE_SOURCES] + ["ifNull(l.score, nan)", "ifNull(l.correct, nan)"]
    src = (
        "mapFilter((k, v) -> NOT isNaN(v), mapFromArrays("
        f"arrayConcat([{', '.join(repr(n) for n in names)}], arrayMap(k -> concat('{ua.MEASURE_PREFIX}', k), mapKeys(e.measures))), "
        f"arrayConcat([{', '.join(values)}], mapValues(e.measures))))"
    )
    seg = (", e.dims AS dims, groupUniqArrayArray(mapKeys(e.dims)) OVER (PARTITION BY e.unit_id) AS unit_dims"
           if segments else "")
    sources = ", ".join(f"e.{f} AS {_ALIAS[f]}" for f in NULLABLE_SOURCES)
    buckets = ", ".join(f"toUInt16({histogram_bucket_sql(f'ifNull(e.{h}, -1)')}) AS hb_{h}" for h in HISTOGRAM_SOURCES)
    return f"""
            SELECT toString(e.variant) AS variant, e.unit_id AS unit_id, e.ts AS ts, {sources},
                   {ua.valid_sql("e.")} AS valid, toFloat64(e.is_error) AS {_ALIAS["error"]}, {good} AS {_ALIAS["good"]},
                   toFloat64(ifNull(if(b.has = 1, b.billed, e.{COST}), 0)) AS {_ALIAS[COST]},
                   l.correct AS {_ALIAS["correct"]},
                   {src} AS src,
                   {buckets}{seg}
            FROM (SELECT * FROM rollup_events FINAL WHERE {where}) AS e
            LEFT JOIN (
                SELECT trace_id, sum({COST}) AS billed, toUInt8(1) AS has FROM rollup_labels FINAL
                WHERE {where} AND type = 'cost' AND {COST} IS NOT NULL GROUP BY trace_id
            ) AS b ON b.trace_id = e.trace_id
            LEFT JOIN (  -- the latest label carrying each field (by event time), as the raw scan takes it
                SELECT trace_id,
                       if(countIf(correct IS NOT NULL) > 0, toFloat64(argMaxIf(assumeNotNull(correct), ts, correct IS NOT NULL)), NULL) AS correct,
                       if(countIf(score IS NOT NULL) > 0, argMaxIf(assumeNotNull(score), ts, score IS NOT NULL), NULL) AS score
                FROM rollup_labels FINAL
                WHERE {where} AND type = 'feedback' GROUP BY trace_id
            ) AS l ON l.trace_id = e.trace_id"""


def _recompute_sql(units_given: bool, bounds: Mapping[str, float | None], params: dict[str, Any]) -> tuple[str, str]:
    """(the unit_stats insert, the unit_segment_stats insert) of the units."""
    where = "experiment = {experiment:String}" + (" AND unit_id IN {units:Array(String)}" if units_given else "")
    cols = f"{', '.join(UNIT_COLUMNS)}, {', '.join(ua.ROLLUP_MAPS)}"
    hist_cols = ", ".join(c for h in HISTOGRAM_SOURCES for c in histogram_columns(h))
    hists = ", ".join(f"(sumMapIf([hb_{h}], [toUInt64({_ALIAS[h]} IS NOT NULL)], valid) AS h_{h}).1, h_{h}.2"
                      for h in HISTOGRAM_SOURCES)
    sums = _sums_sql()
    units = f"""
        INSERT INTO unit_stats (experiment, variant, unit_id, events, {cols},
                                {hist_cols}, min_ts, max_ts, slo_key, rollup_version, computed_at)
        SELECT {{experiment:String}}, variant, unit_id, {sums},
               {hists},
               if(countIf(valid) > 0, minIf(ts, valid), min(ts)), if(countIf(valid) > 0, maxIf(ts, valid), max(ts)),
               {{slo_key:String}}, {ua.ROLLUP_VERSION}, now64(6)
        FROM ({_inner_sql(where, bounds, params, segments=False)})
        GROUP BY variant, unit_id
        SETTINGS join_use_nulls = 0
    """
    # each request counts under each dimension its unit's requests carry: its own value, or "(none)"
    segments = f"""
        INSERT INTO unit_segment_stats (experiment, dim, value, variant, unit_id, events, {cols}, slo_key, computed_at)
        SELECT {{experiment:String}}, dv.1, dv.2, variant, unit_id, {sums}, {{slo_key:String}}, now64(6)
        FROM ({_inner_sql(where, bounds, params, segments=True)})
        ARRAY JOIN arrayConcat(arrayZip(mapKeys(dims), mapValues(dims)),
                               arrayMap(k -> (k, '{ua.NONE}'), arrayFilter(k -> NOT mapContains(dims, k), unit_dims))) AS dv
        GROUP BY dv, variant, unit_id
        SETTINGS join_use_nulls = 0
    """
    return units, segments


def recompute_units(client: Client, experiment: str, units: Sequence[str] | None) -> None:
    """Rewrite the ``unit_stats`` rows of ``units`` (None: every unit of the experiment) and,
    for an experiment that declares segments, their ``unit_segment_stats`` rows, from
    ``rollup_events``/``rollup_labels`` under the experiment's current SLOs."""
    key, bounds = current_slos(client, experiment)
    params: dict[str, Any] = {"experiment": experiment, "slo_key": key}
    unit_sql, segment_sql = _recompute_sql(units is not None, bounds, params)
    statements = [unit_sql, segment_sql] if ua.key_keeps_segments(key) else [unit_sql]
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
    from_raw = ", ".join(f"toUInt8{ua.error_sql('error')}" if c == "is_error" else c for c in ROLLUP_EVENT_COLUMNS)
    client.command(
        f"INSERT INTO rollup_events ({', '.join(ROLLUP_EVENT_COLUMNS)}) "
        f"SELECT {from_raw} FROM raw_events FINAL WHERE type = 'inference'{exp}",
        parameters=params,
    )
    traces = (
        f"(type = 'inference'{exp} OR (type IN ('feedback', 'cost') AND trace_id IN "
        f"(SELECT trace_id FROM raw_events WHERE type = 'inference'{exp})))"
        if experiment is not None else "type IN ('inference', 'feedback', 'cost')"
    )
    client.command(
        f"INSERT INTO rollup_traces ({', '.join(ROLLUP_TRACE_COLUMNS)}) "
        "SELECT trace_id, type, event_id, ts, if(type = 'inference', experiment, ''), if(type = 'inference', unit_id, ''), "
        f"if(type = 'feedback', correct, NULL), if(type = 'cost', {COST}, NULL), if(type = 'feedback', score, NULL) "
        f"FROM raw_events FINAL WHERE {traces} AND trace_id != ''",
        parameters=params,
    )
    pointers = "type = 'inference'" + exp
    client.command(
        f"INSERT INTO rollup_labels (experiment, unit_id, {_LABEL_COLUMNS}) "
        f"SELECT p.experiment, p.unit_id, f.trace_id, f.type, f.event_id, f.ts, f.correct, f.{COST}, f.score "
        f"FROM (SELECT {_LABEL_COLUMNS} FROM rollup_traces FINAL "
        "      WHERE type IN ('feedback', 'cost')) AS f "
        f"INNER JOIN (SELECT DISTINCT trace_id, experiment, unit_id FROM rollup_traces WHERE {pointers}) AS p "
        "ON p.trace_id = f.trace_id",
        parameters=params,
    )


# --- the store object: maintenance (writes) and reads of the rollup tables --------------


class RollupStore:
    """The per-unit rollup of one store: its maintenance step (:meth:`sync`) and every read of
    its tables. What it has already verified is remembered here, per store object (the API
    keeps one; the module functions below make a fresh one, which checks everything)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._verified: dict[str, int] = {}  # experiment → rollup_events count found complete
        self._verified_raw: dict[str, tuple[int, int]] = {}  # experiment → (raw, fed) counts compared

    # -- maintenance

    def sync(self, spec: ExperimentSpec) -> dict[str, int]:
        """The maintenance step for one experiment: its SLOs and whether it keeps segment rows
        written for the loader's recomputes, and what the loader could not know repaired (units
        computed under other SLOs, events that reached ``raw_events`` without it). Run after
        create/update and by the monitor's pass, never by a read."""
        if spec.request_randomized:
            return {"slo": 0, "missing": 0}
        return self.ensure_fresh(spec.key, spec.slos, segments=bool(spec.segments))

    def ensure_fresh(self, experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> dict[str, int]:
        """Make the experiment's ``unit_stats`` (and, with ``segments``, ``unit_segment_stats``)
        complete and computed under ``slos``.

        Cheap when nothing is missing (a few counts). Repairs, by recomputing only the affected
        units: units whose SLOs changed, units loaded without a recompute (a recompute lost with
        a crashed process before its replay), and inference events that reached ``raw_events``
        without the loader (copied into the lookup tables first).
        """
        with batch_lock:
            return self._ensure_fresh(experiment, slos, segments)

    def _ensure_fresh(self, experiment: str, slos: Mapping[str, float], segments: bool) -> dict[str, int]:
        client = self.client
        self._backfill_if_behind(experiment)
        set_slos(client, experiment, slos, segments=segments)
        key = ua.rollup_key(slos, segments=segments)
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
        loaded = client.query("SELECT count() FROM rollup_events WHERE experiment = {experiment:String}",
                              parameters=p).result_rows[0][0]
        if self._verified.get(experiment) == loaded:
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
        self._verified[experiment] = int(loaded)
        return repaired

    def _backfill_if_behind(self, experiment: str) -> None:
        client, p = self.client, {"experiment": experiment}
        raw, fed = (int(client.query(sql, parameters=p).result_rows[0][0]) for sql in (
            "SELECT count() FROM raw_events WHERE type = 'inference' AND experiment = {experiment:String}",
            "SELECT count() FROM rollup_events WHERE experiment = {experiment:String}",
        ))
        if raw == fed or self._verified_raw.get(experiment) == (raw, fed):
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
        self._verified_raw[experiment] = (raw, fed)

    # -- reads (results; never write)

    def _columns(self, sql: str, params: Mapping[str, Any]) -> Columns:
        table = self.client.query_arrow(sql, parameters=dict(params))
        return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}

    def current(self, spec: ExperimentSpec) -> bool:
        """True when every ``unit_stats`` row of the experiment was computed under its SLOs and
        the current rollup layout, and no request precedes ``spec.start`` (rollup sums are
        all-time sums)."""
        params: dict[str, Any] = {"experiment": spec.key, "key": ua.rollup_key(spec.slos, segments=bool(spec.segments))}
        early = "0"
        if spec.start:
            params["start_ms"] = ua.start_ms(spec.start)
            early = "toUnixTimestamp64Milli(min_ts) < {start_ms:Int64}"
        stale = self.client.query(
            f"SELECT countIf({STALE_SQL} OR ({early} AND requests > 0)) "
            "FROM unit_stats FINAL WHERE experiment = {experiment:String}",
            parameters=params,
        ).result_rows[0][0]
        return not stale

    _WHERE = "WHERE experiment = {experiment:String} AND variant IN {variants:Array(String)} AND requests > 0"

    def units(self, spec: ExperimentSpec, plan: ua.UnitPlan) -> Columns:
        """The plan's in-period columns per (variant, unit) from ``unit_stats`` (``unit_id``: a
        64-bit hash of the unit, as the raw scan gives it). Call after
        ``unit_agg.rollup_unsupported`` said None."""
        p: dict[str, Any] = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
        return self._columns(
            f"SELECT toString(variant) AS variant, cityHash64(unit_id) AS unit_id, {ua.rollup_select(plan, UNIT_COLUMNS, p)} "
            f"FROM unit_stats FINAL {self._WHERE}", p)

    def spans(self, spec: ExperimentSpec) -> list[tuple[str, int, int]]:
        """(variant, first, last request in epoch ms) of each variant with requests."""
        p = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
        rows = self.client.query(
            "SELECT toString(variant), toUnixTimestamp64Milli(min(min_ts)), toUnixTimestamp64Milli(max(max_ts)) "
            f"FROM unit_stats FINAL {self._WHERE} GROUP BY variant", parameters=p).result_rows
        return [(str(v), int(lo), int(hi)) for v, lo, hi in rows]

    def histogram_buckets(self, spec: ExperimentSpec) -> Columns:
        """(variant, latency, bucket, count) rows of the built-in latency histograms: (bucket,
        count) pairs unnested and summed, several times cheaper than sumMap over ~50-entry
        arrays per unit."""
        p = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
        parts = []
        for lat in HISTOGRAM_SOURCES:
            buckets, counts = histogram_columns(lat)
            parts.append(f"SELECT toString(variant) AS variant, '{lat}' AS latency, b AS bucket, sum(n) AS count "
                         f"FROM unit_stats FINAL ARRAY JOIN {buckets} AS b, {counts} AS n {self._WHERE} GROUP BY variant, b")
        return self._columns(" UNION ALL ".join(parts), p)

    def segment_rows(self, spec: ExperimentSpec, plan: ua.UnitPlan, dim: str) -> tuple[Columns, list[str], list[str]]:
        """Per (variant, unit, segment value) rows of ``dim`` from ``unit_segment_stats``: the top
        values by requests, the rest folded into "(other)". Rows carry integer codes (a value's
        and a variant's index into the returned labels and variants, sorted), so nothing
        downstream converts or sorts strings. Returns (rows, labels, variants)."""
        variants = sorted(v.key for v in spec.variants)
        p: dict[str, Any] = {"experiment": spec.key, "variants": variants, "dim": dim}
        top = [str(r[0]) for r in self.client.query(
            "SELECT value, sum(requests) AS c FROM unit_segment_stats FINAL WHERE experiment = {experiment:String} "
            "AND dim = {dim:String} AND variant IN {variants:Array(String)} AND value != {none:String} "
            f"GROUP BY value HAVING c > 0 ORDER BY c DESC, value LIMIT {ua.MAX_SEGMENT_VALUES + 1}",
            parameters={**p, "none": ua.NONE}).result_rows]
        fold = len(top) > ua.MAX_SEGMENT_VALUES  # else every value shows and rows need no summing
        top = top[:ua.MAX_SEGMENT_VALUES]
        labels = sorted({*top, ua.NONE, ua.OTHER})
        p.update(top=top, none=ua.NONE, other=ua.OTHER, labels=labels, variant_keys=variants)
        # the plan's columns per row first (map lookups), then the folded values summed
        cols = [c.name for c in plan.columns]
        select = ua.rollup_select(plan, UNIT_COLUMNS, p)
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
        return self._columns(sql, p), labels, variants


# --- the module's functions, on a fresh store object ------------------------------------


def sync(client: Client, spec: ExperimentSpec) -> dict[str, int]:
    """:meth:`RollupStore.sync` on ``client`` (verifies everything: no remembered counts)."""
    return RollupStore(client).sync(spec)


def ensure_fresh(client: Client, experiment: str, slos: Mapping[str, float], *, segments: bool = False) -> dict[str, int]:
    """:meth:`RollupStore.ensure_fresh` on ``client`` (verifies everything)."""
    return RollupStore(client).ensure_fresh(experiment, slos, segments=segments)
