"""Offline analysis of an event file: read, validate, aggregate per unit, run the engine.

This is the only module here that reads files. The aggregation works on Arrow columns
and numpy codes (dictionary-encoded strings, ``np.unique`` group keys, ``np.bincount``
sums) and yields the same per-unit columns a ClickHouse ``GROUP BY experiment, variant,
unit_id`` would, so the engine and the JSON are the same as the results API's.

Rules (so nothing is lost or double-counted):
- an inference event counts once per ``trace_id`` (later duplicates are counted, dropped);
- the latest label per ``trace_id`` wins; labels whose trace is absent are counted;
- billing ``cost`` events replace the worker's cost estimate for their trace (summed);
- malformed rows are rejected with a reason, counted, and returned for dead-lettering.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .aggregates import VariantStats, variant_stats_from_units
from .engine import analyze
from .metrics import HISTOGRAM_SOURCES
from .spec import ExperimentSpec
from .sufficient import HIST_BUCKETS, HistogramStats, histogram_bucket

EVENT_TYPES = ("exposure", "inference", "rum", "feedback", "cost")
LATENCIES = ("e2e_ms", "ttft_ms", "tpot_ms")
REJECT_REASONS = ("", "unknown_type", "missing_trace_or_unit", "negative_latency", "unknown_variant", "bad_feedback")
_REASON = {name: i for i, name in enumerate(REJECT_REASONS)}
# not trace_id: nearly unique, its per-batch dictionaries cost more to unify (1.2 s) than one hash pass
_ID_COLUMNS = ("type", "experiment", "variant", "unit_id")
COLUMNS = ("type", "ts", "trace_id", "experiment", "variant", "unit_id", *LATENCIES, "cost_usd", "error", "correct")


@dataclass(eq=False)
class OfflineAggregates:
    units: dict[str, np.ndarray]
    stats: dict[str, VariantStats]
    exposures: dict[str, float] | None
    data_quality: dict[str, Any]
    rejected: pa.Table | None = None  # malformed rows plus a reject_reason column, for dead-lettering


def read_events(path: str | Path) -> pa.Table:
    """Parquet (``.parquet``/``.pq``) or JSON Lines (anything else) as an Arrow table."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"EVENTS: {path} does not exist")
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        names = set(schema.names)
        # ids decoded straight to dictionary arrays: no million Python-visible strings, and
        # _encode skips a second hashing pass (0.5 s of the 1 M-row run)
        ids = [c for c in _ID_COLUMNS if c in names and pa.types.is_string(schema.field(c).type)]
        return pq.read_table(path, columns=[c for c in COLUMNS if c in names], read_dictionary=ids)
    import pyarrow.json as pj

    try:
        return pj.read_json(path)
    except pa.ArrowInvalid:  # mixed-type columns defeat Arrow's inference; pandas is lenient
        import pandas as pd

        return _to_table(pd.read_json(path, lines=True, dtype=False))


def _to_table(events: Any) -> pa.Table:
    """An Arrow table from a table or a pandas frame (pandas is imported only by callers that use it)."""
    if isinstance(events, pa.Table):
        return events
    keep = [c for c in COLUMNS if c in events.columns]
    frame = events[keep].copy()
    for c in ("trace_id", "experiment", "variant", "unit_id", "type", "error"):
        if c in frame.columns and frame[c].dtype == object:
            frame[c] = frame[c].where(frame[c].isna(), frame[c].astype(str))
    return pa.Table.from_pandas(frame, preserve_index=False)


def _encode(table: pa.Table, name: str, *, labels: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Dictionary codes (−1 = null/absent) and the labels they index (skipped for ids:
    a million Python strings cost more than the whole aggregation)."""
    if name not in table.column_names:
        return np.full(table.num_rows, -1, dtype=np.int64), np.array([], dtype=object)
    chunked = table[name]
    if pa.types.is_dictionary(chunked.type):
        enc = chunked.unify_dictionaries().combine_chunks()
        codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        # codes index distinct values only when every entry is used once (counts of units rely on it)
        used = np.bincount(codes[codes >= 0], minlength=len(enc.dictionary))
        if used.size == len(enc.dictionary) and used.all() and pc.count_distinct(enc.dictionary).as_py() == len(enc.dictionary):
            dictionary = enc.dictionary.to_numpy(zero_copy_only=False) if labels else np.empty(len(enc.dictionary), dtype=object)
            return codes, dictionary
        chunked = pc.cast(chunked, pa.string())
    col = chunked.combine_chunks()
    if not pa.types.is_string(col.type) and not pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.string())
    enc = col.dictionary_encode()
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    dictionary = enc.dictionary.to_numpy(zero_copy_only=False) if labels else np.empty(len(enc.dictionary), dtype=object)
    return codes, dictionary


def _float(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table[name]
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        import pandas as pd

        return pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(dtype=float)
    return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)


def _timestamps_ms(table: pa.Table) -> np.ndarray:
    """Event time in epoch ms (NaN when absent or unparseable)."""
    if "ts" not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table["ts"]
    target = pa.timestamp("ms", tz="UTC")
    try:
        ts = pc.cast(col, target, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        import pandas as pd

        parsed = pd.to_datetime(col.to_pandas(), utc=True, errors="coerce", format="ISO8601")
        ts = pc.cast(pa.array(parsed), target, safe=False)
    return pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False).astype(float)


def _epoch_ms(text: str) -> float:
    try:
        moment = datetime.fromisoformat(str(text).replace(" ", "T"))
    except ValueError:
        raise ValueError(f"start: not an ISO-8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp() * 1000.0


def _is_error(table: pa.Table) -> np.ndarray:
    if "error" not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    col = table["error"]
    if pa.types.is_boolean(col.type):
        return pc.fill_null(col, False).to_numpy(zero_copy_only=False)
    if pa.types.is_null(col.type):
        return np.zeros(table.num_rows, dtype=bool)
    s = pc.cast(col, pa.string())
    benign = pc.is_in(s, value_set=pa.array(["", "false", "False", "0", "None"]))
    flagged = pc.and_(pc.is_valid(s), pc.invert(benign))
    return pc.fill_null(flagged, False).to_numpy(zero_copy_only=False)


def _first_of(codes: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Positions of the first row of each distinct non-negative code (in ``order`` if given)."""
    seq = codes if order is None else codes[order]
    if not seq.size:
        return np.array([], dtype=np.int64)
    first = np.full(int(seq.max()) + 1, seq.size, dtype=np.int64)
    np.minimum.at(first, seq, np.arange(seq.size))
    first = np.sort(first[first < seq.size])
    return first if order is None else order[first]


def aggregate_events(events: Any, spec: ExperimentSpec) -> OfflineAggregates:
    table = _to_table(events)
    n = table.num_rows
    if "type" not in table.column_names:
        raise ValueError("EVENTS: no 'type' column; expected events in the CONTRACTS shape")
    quality: dict[str, Any] = {"events": int(n)}
    reasons = np.zeros(n, dtype=np.int8)  # index into REJECT_REASONS; 0 = accepted

    type_codes, type_labels = _encode(table, "type")

    def of_type(name: str) -> np.ndarray:
        hits = np.flatnonzero(type_labels == name)
        return type_codes == (hits[0] if hits.size else -2)

    exp_codes, exp_labels = _encode(table, "experiment")
    own = np.isin(exp_labels, [spec.key])
    other = (exp_codes >= 0) & ~own[np.maximum(exp_codes, 0)] if exp_labels.size else np.zeros(n, dtype=bool)
    quality["other_experiments"] = int(other.sum())
    mine = ~other
    known_type = np.isin(type_labels, EVENT_TYPES)
    type_ok = (type_codes >= 0) & known_type[np.maximum(type_codes, 0)] if type_labels.size else np.zeros(n, dtype=bool)
    reasons[mine & ~type_ok] = _REASON["unknown_type"]

    # the two id columns are the costliest step (hashing ~1 M strings each); Arrow
    # releases the GIL, so encode them side by side
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        trace_job = pool.submit(_encode, table, "trace_id", labels=False)
        unit_codes, _ = _encode(table, "unit_id", labels=False)
        trace, _ = trace_job.result()
    var_codes, var_labels = _encode(table, "variant")
    ts = _timestamps_ms(table)
    lat = {name: _float(table, name) for name in LATENCIES}

    inf = mine & of_type("inference")
    reasons[inf & ((trace < 0) | (unit_codes < 0))] = _REASON["missing_trace_or_unit"]
    negative = np.zeros(n, dtype=bool)
    for v in lat.values():
        negative |= v < 0
    reasons[inf & negative & (reasons == 0)] = _REASON["negative_latency"]
    inf &= reasons == 0
    start_ms = _epoch_ms(spec.start) if spec.start else None
    pre = inf & (ts < start_ms) if start_ms is not None else np.zeros(n, dtype=bool)
    inf &= ~pre
    known = np.isin(var_labels, [v.key for v in spec.variants])
    var_ok = (var_codes >= 0) & known[np.maximum(var_codes, 0)] if var_labels.size else np.zeros(n, dtype=bool)
    reasons[inf & ~var_ok] = _REASON["unknown_variant"]
    inf &= var_ok
    inf_rows = np.flatnonzero(inf)
    keep = inf_rows[_first_of(trace[inf_rows])]
    quality["duplicate_inference"] = int(inf_rows.size - keep.size)

    # labels: the latest per trace wins; billing cost per trace replaces the estimate
    n_trace = int(trace.max()) + 1 if n else 0
    correct_all = _float(table, "correct")
    fb = mine & of_type("feedback")
    reasons[fb & ((trace < 0) | ~((correct_all == 0) | (correct_all == 1)))] = _REASON["bad_feedback"]
    fb_rows = np.flatnonzero(fb & (reasons == 0))
    # newest first (ties: the later row first), then the first row seen per trace
    newest_first = np.lexsort((-np.arange(fb_rows.size), -np.nan_to_num(ts[fb_rows], nan=-np.inf)))
    latest = fb_rows[_first_of(trace[fb_rows], newest_first)]
    label_by_trace = np.full(n_trace, np.nan)
    label_by_trace[trace[latest]] = correct_all[latest]
    cost_all = _float(table, "cost_usd")
    billed_rows = np.flatnonzero(mine & of_type("cost") & (trace >= 0) & ~np.isnan(cost_all))
    billed = np.bincount(trace[billed_rows], weights=cost_all[billed_rows], minlength=n_trace)
    has_bill = np.bincount(trace[billed_rows], minlength=n_trace) > 0
    has_inf = np.zeros(n_trace, dtype=bool)
    has_inf[trace[keep]] = True
    quality["orphan_feedback"] = int((~has_inf[trace[latest]]).sum())

    err = _is_error(table)
    units = _per_unit(spec, keep, trace, unit_codes, var_codes, var_labels, lat, err, cost_all, billed, has_bill, label_by_trace)
    quality["units_in_multiple_variants"] = units.pop("_multi")
    quality["pre_period_events"] = int(pre.sum())
    if pre.any() and spec.cuped:
        _join_pre_period(units, np.flatnonzero(pre), unit_codes, lat, cost_all)

    histograms = _histograms(keep, var_codes, var_labels, lat)
    span = (np.nanmax(ts[keep]) - np.nanmin(ts[keep])) / 1000.0 if keep.size and np.isfinite(ts[keep]).any() else 0.0
    durations = {v.key: float(span) for v in spec.variants} if span > 0 else None
    exposures = _exposures(spec, mine & of_type("exposure"), unit_codes, var_codes, var_labels)
    bad = np.flatnonzero(reasons != 0)
    rejected = None
    if bad.size:
        rejected = table.take(pa.array(bad)).append_column(
            "reject_reason", pa.array(np.array(REJECT_REASONS, dtype=object)[reasons[bad]].tolist(), pa.string())
        )
    counts = np.bincount(reasons[bad], minlength=len(REJECT_REASONS))
    quality["rejected"] = {REJECT_REASONS[i]: int(c) for i, c in enumerate(counts) if i and c}
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped)
    return OfflineAggregates(units, stats, exposures, quality, rejected)


def _per_unit(spec, keep, trace, unit_codes, var_codes, var_labels, lat, err, cost_all, billed, has_bill, label_by_trace):
    t = trace[keep]
    group_unit = t if spec.request_randomized else unit_codes[keep]
    v = var_codes[keep]
    key = v * (int(group_unit.max()) + 1 if group_unit.size else 1) + group_unit
    # dense relabelling instead of a sort: codes are small integers
    occupied = np.bincount(key) > 0 if key.size else np.zeros(0, dtype=bool)
    remap = np.cumsum(occupied) - 1
    inverse = remap[key]
    k = int(occupied.sum())
    first = np.full(k, inverse.size, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(inverse.size))  # first row of each group, by group id

    def s(x: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=x, minlength=k)

    cost = np.where(has_bill[t], billed[t], np.nan_to_num(cost_all[keep]))
    label = label_by_trace[t]
    labeled = ~np.isnan(label)
    e = err[keep]
    good = ~e
    out: dict[str, Any] = {
        "variant": var_labels[v[first]],
        "unit_id": group_unit[first],
        "requests": np.bincount(inverse, minlength=k).astype(float),
        "errors": s(e.astype(float)),
        "cost_usd_sum": s(cost),
        "labeled": s(labeled.astype(float)),
        "correct": s(np.where(labeled, label, 0.0)),
        "labeled_cost_usd_sum": s(np.where(labeled, cost, 0.0)),
    }
    for name in LATENCIES:
        x = lat[name][keep]
        present = ~np.isnan(x)
        x0 = np.where(present, x, 0.0)
        out[f"{name}_sum"] = s(x0)
        out[f"{name}_n"] = s(present.astype(float))
        if name in HISTOGRAM_SOURCES:
            out[f"{name}_sq"] = s(x0 * x0)
        bound = spec.slos.get(name)
        if bound is not None:  # a missing TPOT (a single output token) cannot break its SLO
            good &= (x <= bound) if name != "tpot_ms" else (~present | (x <= bound))
    out["good"] = s(good.astype(float))
    out["_multi"] = int((np.bincount(out["unit_id"]) > 1).sum()) if k else 0
    return out


def _join_pre_period(units, pre_rows, unit_codes, lat, cost_all) -> None:
    """Pre-period per-unit sums as ``pre_<col>`` covariates for CUPED (in place)."""
    size = int(max(unit_codes.max(), units["unit_id"].max() if units["unit_id"].size else 0)) + 1
    u = unit_codes[pre_rows]

    def by_unit(x: np.ndarray) -> np.ndarray:
        return np.bincount(u, weights=x, minlength=size)[units["unit_id"]]

    units["pre_requests"] = by_unit(np.ones(pre_rows.size))
    units["pre_cost_usd_sum"] = by_unit(np.nan_to_num(cost_all[pre_rows]))
    for name in LATENCIES:
        x = lat[name][pre_rows]
        units[f"pre_{name}_sum"] = by_unit(np.nan_to_num(x))
        units[f"pre_{name}_n"] = by_unit((~np.isnan(x)).astype(float))


def _histograms(keep, var_codes, var_labels, lat) -> dict[str, dict[str, HistogramStats]]:
    k = max(var_labels.size, 1)
    out: dict[str, dict[str, HistogramStats]] = {str(v): {} for v in var_labels}
    codes = var_codes[keep]
    for name in HISTOGRAM_SOURCES:
        x = lat[name][keep]
        ok = ~np.isnan(x)
        flat = codes[ok] * HIST_BUCKETS + histogram_bucket(x[ok])
        counts = np.bincount(flat, minlength=k * HIST_BUCKETS).reshape(k, HIST_BUCKETS)
        for i, variant in enumerate(var_labels):
            out[str(variant)][name] = HistogramStats(counts[i].astype(np.int64))
    return out


def _exposures(spec, rows_mask, unit_codes, var_codes, var_labels) -> dict[str, float] | None:
    rows = np.flatnonzero(rows_mask & (unit_codes >= 0) & (var_codes >= 0))
    if spec.request_randomized or not rows.size:
        return None
    pairs = np.unique(var_codes[rows] * (int(unit_codes.max()) + 1) + unit_codes[rows])
    per_variant = np.bincount(pairs // (int(unit_codes.max()) + 1), minlength=var_labels.size)
    counts = dict(zip(map(str, var_labels), per_variant.tolist()))
    return {v.key: float(counts.get(v.key, 0)) for v in spec.variants}


def analyze_events(events: Any, spec: ExperimentSpec) -> tuple[dict[str, Any], OfflineAggregates]:
    agg = aggregate_events(events, spec)
    result = analyze(spec=spec, stats=agg.stats, exposures=agg.exposures, extra={"data_quality": agg.data_quality})
    return result, agg
