"""Offline analysis of events (an Arrow table or pandas frame): validate, aggregate per unit,
run the engine. Pure: reading a file is :mod:`ablab.platform.analytics.event_files`.

The aggregation works on Arrow columns and numpy codes (dictionary-encoded strings, dense
group keys, ``np.bincount`` sums) and renders the one per-unit specification of
:mod:`.unit_agg` — the same the store's SQL renders — so the engine and the JSON are the
same as the results API's.

Rules (so nothing is lost or double-counted):
- an inference event counts once per ``trace_id`` (later duplicates are counted, dropped);
- the latest label per ``trace_id`` wins, per field (``correct``, ``score``); a feedback event
  may carry either or both; labels whose trace is absent are counted;
- billing ``cost`` events replace the worker's cost estimate for their trace (summed);
- malformed rows are rejected with a reason, counted, and returned for dead-lettering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from ablab.platform import fields
from ablab.platform.fields import fields_of

from . import paired as pr
from . import unit_agg as ua
from .aggregates import VariantStats, segment_stats_from_units, variant_stats_from_units
from .engine import analyze_results
from .metrics import DIM_PREFIX, MEASURE_PREFIX
from .result_models import PolicyBreakdown, Results
from .spec import ExperimentSpec

Array = NDArray[Any]  # one value per event row, unit or code
EVENT_TYPES = ("exposure", "inference", "rum", "feedback", "cost")
LATENCIES = fields.LATENCY_FIELDS
REJECT_REASONS = ("", "unknown_type", "missing_trace_or_unit", "negative_latency", "unknown_variant", "bad_feedback",
                  "out_of_bounds", *(reason for _, _, reason in fields.AT_MOST))
_REASON = {name: i for i, name in enumerate(REJECT_REASONS)}
# not trace_id: nearly unique, its per-batch dictionaries cost more to unify (1.2 s) than one hash pass
ID_COLUMNS = ("type", "experiment", "variant", "unit_id")
COLUMNS = (
    "type", "ts", "trace_id", "experiment", "variant", "unit_id", *fields.EVENT_FIELDS, "error", "correct",
    "measures", "dims", "shadow_of", "shadow", "arm", "propensity", "policy_version", "max_tokens",
)
"""The event columns an analysis reads (every catalogue field); others are left unread."""


@dataclass(eq=False)
class OfflineAggregates:
    units: dict[str, Array]
    stats: dict[str, VariantStats]
    exposures: dict[str, float] | None
    data_quality: dict[str, Any]
    rejected: pa.Table | None = None  # malformed rows plus a reject_reason column, for dead-lettering
    segments: dict[str, dict[str, dict[str, VariantStats]]] | None = None  # dimension → value → variant → stats
    histograms: dict[str, dict[str, Any]] | None = None  # variant → key → HistogramStats
    shadows: pr.ShadowPairs | None = None  # shadow requests and their primaries (issue 34); None: none


def wanted(name: str) -> bool:
    """A column the analysis reads (flat ``measures.<name>``/``dims.<name>`` columns included)."""
    return name in COLUMNS or name.startswith((MEASURE_PREFIX, DIM_PREFIX))


def to_table(events: Any) -> pa.Table:
    """An Arrow table from a table or a pandas frame (pandas is imported only by callers that use it)."""
    if isinstance(events, pa.Table):
        return events
    keep = [c for c in events.columns if wanted(c)]
    frame = events[keep].copy()
    for c in ("trace_id", "experiment", "variant", "unit_id", "type", "error", "shadow_of", "shadow"):
        if c in frame.columns and frame[c].dtype == object:
            frame[c] = frame[c].where(frame[c].isna(), frame[c].astype(str))
    return pa.Table.from_pandas(frame, preserve_index=False)


def _encode(table: pa.Table, name: str, *, labels: bool = True) -> tuple[Array, Array]:
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


def _out_of_bounds(table: pa.Table, event_type: str) -> Array:
    """Rows where a field that ``event_type`` events carry is present and outside its
    catalogue bounds (``ablab.platform.fields``), infinities included."""
    bad = np.zeros(table.num_rows, dtype=bool)
    for f in fields_of(event_type):
        values = _float(table, f.name)
        with np.errstate(invalid="ignore"):
            bad |= ~np.isnan(values) & ((values < f.lo) | (values > f.hi))
    return bad


def _float(table: pa.Table, name: str) -> Array:
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table[name]
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        import pandas as pd

        parsed: Array = pd.to_numeric(col.to_pandas(), errors="coerce").to_numpy(dtype=float)
        return parsed
    out: Array = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    return out


def _timestamps_ms(table: pa.Table) -> Array:
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
    ms: Array = pc.cast(ts, pa.int64()).to_numpy(zero_copy_only=False).astype(float)
    return ms


def _is_error(table: pa.Table) -> Array:
    """:data:`.unit_agg.ERROR_RULE`: ``error`` present and not empty (booleans: true)."""
    if "error" not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    col = table["error"]
    if pa.types.is_boolean(col.type):
        flags: Array = pc.fill_null(col, False).to_numpy(zero_copy_only=False)
        return flags
    if pa.types.is_null(col.type):
        return np.zeros(table.num_rows, dtype=bool)
    s = pc.cast(col, pa.string())
    flagged: Array = pc.fill_null(pc.and_(pc.is_valid(s), pc.not_equal(s, "")), False).to_numpy(zero_copy_only=False)
    return flagged


def nested_column(table: pa.Table, column: str, key: str) -> pa.Array | None:
    """``column.key`` of a struct or map column (or a flat ``column.key`` column), or None:
    how ``measures.<name>`` and ``dims.<name>`` are read from any event table."""
    flat = f"{column}.{key}"
    if flat in table.column_names:
        return table[flat].combine_chunks()
    if column not in table.column_names:
        return None
    col = table[column].combine_chunks()
    if pa.types.is_struct(col.type):
        idx = col.type.get_field_index(key)
        if idx < 0:
            return None
        child = pc.struct_field(col, [idx])
        return pc.if_else(pc.is_valid(col), child, pa.scalar(None, child.type))
    if pa.types.is_map(col.type):
        return pc.map_lookup(col, pa.scalar(key, col.type.key_type), "first")
    return None


def _measure(table: pa.Table, name: str) -> Array:
    col = nested_column(table, "measures", name)
    if col is None or pa.types.is_null(col.type):
        return np.full(table.num_rows, np.nan)
    out: Array = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False).astype(float)
    return out


def _dim(table: pa.Table, name: str) -> tuple[Array, Array]:
    """(values as str, present) of ``dims.<name>``."""
    col = nested_column(table, "dims", name)
    if col is None or pa.types.is_null(col.type):
        return np.full(table.num_rows, "", dtype=object), np.zeros(table.num_rows, dtype=bool)
    col = pc.cast(col, pa.string())
    present = pc.fill_null(pc.and_(pc.is_valid(col), pc.not_equal(col, "")), False).to_numpy(zero_copy_only=False)
    return pc.fill_null(col, "").to_numpy(zero_copy_only=False), present


def _first_of(codes: Array, order: Array | None = None) -> Array:
    """Positions of the first row of each distinct non-negative code (in ``order`` if given)."""
    seq = codes if order is None else codes[order]
    if not seq.size:
        return np.array([], dtype=np.int64)
    first = np.full(int(seq.max()) + 1, seq.size, dtype=np.int64)
    np.minimum.at(first, seq, np.arange(seq.size))
    first = np.sort(first[first < seq.size])
    return first if order is None else order[first]


def aggregate_events(events: Any, spec: ExperimentSpec) -> OfflineAggregates:
    table = to_table(events)
    n = table.num_rows
    if "type" not in table.column_names:
        raise ValueError("EVENTS: no 'type' column; expected events in the CONTRACTS shape")
    quality: dict[str, Any] = {"events": int(n)}
    reasons = np.zeros(n, dtype=np.int8)  # index into REJECT_REASONS; 0 = accepted

    type_codes, type_labels = _encode(table, "type")

    def of_type(name: str) -> Array:
        hits = np.flatnonzero(type_labels == name)
        rows: Array = type_codes == (hits[0] if hits.size else -2)
        return rows

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

    # a shadow request (shadow_of set) is validated as any request, then compared with its
    # primary (issue 34), never counted in a variant
    shadow_of, _ = _encode(table, "shadow_of", labels=False)
    inf = mine & of_type("inference")
    reasons[inf & ((trace < 0) | (unit_codes < 0))] = _REASON["missing_trace_or_unit"]
    negative = np.zeros(n, dtype=bool)
    for v in lat.values():
        negative |= v < 0
    reasons[inf & negative & (reasons == 0)] = _REASON["negative_latency"]
    # The edge's and the loader's rules, vectorised: every catalogue bound, inclusive and
    # compared as IEEE doubles (-0.0 is in range; infinities and the largest double are
    # not), and no first token after the last. A file holding what the edge refused is then
    # analysed as the live pipeline stored it.
    reasons[inf & _out_of_bounds(table, "inference") & (reasons == 0)] = _REASON["out_of_bounds"]
    for name, bound, reason in fields.AT_MOST:
        first, last = (lat[c] if c in lat else _float(table, c) for c in (name, bound))
        reasons[inf & (first > last) & (reasons == 0)] = _REASON[reason]
    inf &= reasons == 0
    shd = inf & (shadow_of >= 0)
    inf &= shadow_of < 0
    # pre-period requests (CUPED's covariate) count per unit whatever their variant, even none
    early = (ts < ua.start_ms(spec.start)) if spec.start else np.zeros(n, dtype=bool)
    # at or after the analysis end (analysis.end, or a ship) nothing is the experiment's, as in the store's scan
    late = (ts >= ua.end_ms(spec.end)) if spec.end else np.zeros(n, dtype=bool)
    if spec.end:  # requests and exposures left out; a label still counts for its request, whenever it came
        quality["after_end_events"] = int((mine & late & (of_type("inference") | of_type("exposure"))).sum())
    pre = inf & early
    inf &= ~pre & ~late
    shd &= ~early & ~late  # a pre-period shadow is compared with nothing
    known = np.isin(var_labels, [v.key for v in spec.variants])
    var_ok = (var_codes >= 0) & known[np.maximum(var_codes, 0)] if var_labels.size else np.zeros(n, dtype=bool)
    reasons[(inf | shd) & ~var_ok] = _REASON["unknown_variant"]
    inf &= var_ok
    shd &= var_ok
    inf_rows = np.flatnonzero(inf)
    keep = inf_rows[_first_of(trace[inf_rows])]
    shd_all = np.flatnonzero(shd)
    shadow_rows = shd_all[_first_of(trace[shd_all])]
    quality["duplicate_inference"] = int(inf_rows.size - keep.size + shd_all.size - shadow_rows.size)
    pre_all = np.flatnonzero(pre)
    pre_rows = pre_all[_first_of(trace[pre_all])]
    deduped = np.concatenate([keep, pre_rows])

    # labels: the latest per trace and field wins; billing cost per trace replaces the estimate
    n_trace = int(trace.max()) + 1 if n else 0
    correct_all, score_all = _float(table, "correct"), _float(table, "score")
    fb = mine & of_type("feedback")
    bad_label = (
        (trace < 0)
        | ~(np.isnan(correct_all) | (correct_all == 0) | (correct_all == 1))
        | (np.isnan(correct_all) & np.isnan(score_all))
        | np.isinf(score_all)
        | _out_of_bounds(table, "feedback")
    )
    reasons[fb & bad_label] = _REASON["bad_feedback"]
    fb_rows = np.flatnonzero(fb & (reasons == 0))
    has_inf = np.zeros(n_trace, dtype=bool)
    has_inf[trace[deduped]] = True
    has_inf[trace[shadow_rows]] = True  # a shadow's own labels grade the shadow (issue 34)
    by_trace: dict[str, Array] = {}
    orphans = np.zeros(0, dtype=np.int64)
    for name, col in (("correct", correct_all), ("score", score_all)):
        rows = fb_rows[~np.isnan(col[fb_rows])]
        # newest first (ties: the later row first), then the first row seen per trace
        newest_first = np.lexsort((-np.arange(rows.size), -np.nan_to_num(ts[rows], nan=-np.inf)))
        latest = rows[_first_of(trace[rows], newest_first)]
        by_trace[name] = np.full(n_trace, np.nan)
        by_trace[name][trace[latest]] = col[latest]
        orphans = np.union1d(orphans, trace[latest][~has_inf[trace[latest]]])
    quality["orphan_feedback"] = int(orphans.size)
    cost_all = _float(table, fields.COST_FIELD)
    billed_rows = np.flatnonzero(mine & of_type("cost") & (trace >= 0) & ~np.isnan(cost_all))
    billed = np.bincount(trace[billed_rows], weights=cost_all[billed_rows], minlength=n_trace)
    has_bill = np.bincount(trace[billed_rows], minlength=n_trace) > 0

    plan = ua.plan(spec)
    shadow_kind = _encode(table, "shadow")  # on a primary: sent | dropped when chosen for a shadow
    chosen_codes = np.flatnonzero(np.isin(shadow_kind[1], ["sent", "dropped"]))
    any_shadow = bool(shadow_rows.size) or bool(np.isin(shadow_kind[0][keep], chosen_codes).any())
    sources = (*plan.sources, *pr.shadow_sources(spec)) if any_shadow else plan.sources
    values = _sources(sources, table, trace, lat, cost_all, billed, has_bill, by_trace, spec)
    unit = trace if spec.request_randomized else unit_codes
    units = _units(plan, values, keep, var_codes, var_labels, unit)
    units["_unit"] = unit[keep][units.pop("_first")] if keep.size else np.zeros(0, dtype=np.int64)
    quality["units_in_multiple_variants"] = int((np.bincount(units["_unit"]) > 1).sum()) if units["_unit"].size else 0
    quality["pre_period_events"] = int(pre_rows.size)
    pre = ua.pre_numpy(plan, values, pre_rows, unit[pre_rows]) if plan.pre_columns else None
    ua.attach_pre(plan, units, units["_unit"], pre)
    units["unit_id"] = units.pop("_unit")

    histograms = ua.histograms_numpy(plan, values, keep, var_codes[keep], var_labels)
    span = (np.nanmax(ts[keep]) - np.nanmin(ts[keep])) / 1000.0 if keep.size and np.isfinite(ts[keep]).any() else 0.0
    durations = {v.key: float(span) for v in spec.variants} if span > 0 else None
    exposures = _exposures(spec, mine & of_type("exposure") & ~late, unit_codes, var_codes, var_labels)
    segments = _segments(plan, table, values, keep, var_codes, var_labels, unit, pre, spec) if plan.segments else None
    bad = np.flatnonzero(reasons != 0)
    rejected = None
    if bad.size:
        rejected = table.take(pa.array(bad)).append_column(
            "reject_reason", pa.array(np.array(REJECT_REASONS, dtype=object)[reasons[bad]].tolist(), pa.string())
        )
    counts = np.bincount(reasons[bad], minlength=len(REJECT_REASONS))
    quality["rejected"] = {REJECT_REASONS[i]: int(c) for i, c in enumerate(counts) if i and c}
    stats = variant_stats_from_units(units, histograms=histograms, durations=durations, cuped=spec.cuped, custom=spec.custom)
    shadows = None
    if any_shadow:
        shadows = _shadow_pairs(spec, table, values, keep, shadow_rows, var_codes, var_labels, shadow_kind)
    return OfflineAggregates(units, stats, exposures, quality, rejected, segments, histograms, shadows)


def _shadow_pairs(
    spec: ExperimentSpec, table: pa.Table, values: Mapping[str, Array], keep: Array, shadow_rows: Array,
    var_codes: Array, var_labels: Array, shadow_kind: tuple[Array, Array],
) -> pr.ShadowPairs:
    """Each kept shadow request with its primary: the kept in-period request whose
    ``trace_id`` is the shadow's ``shadow_of`` (:class:`.paired.ShadowPairs`)."""
    sources = pr.shadow_sources(spec)
    if shadow_rows.size:
        traces = pc.cast(table["trace_id"].take(pa.array(keep)), pa.string())
        wanted_traces = pc.cast(table["shadow_of"].take(pa.array(shadow_rows)), pa.string())
        found = pc.fill_null(pc.index_in(wanted_traces, value_set=traces), -1).to_numpy(zero_copy_only=False)
    else:
        found = np.zeros(0, dtype=np.int64)
    found = np.asarray(found, dtype=np.int64)
    paired = found >= 0
    primary_rows = np.where(paired, keep[np.maximum(found, 0)] if keep.size else 0, -1)
    own = var_labels[var_codes[shadow_rows]] if shadow_rows.size else np.array([], dtype=object)
    theirs = var_labels[var_codes[np.maximum(primary_rows, 0)]] if shadow_rows.size else own
    variant = np.where(paired, theirs, own).astype(object)

    def side(rows: Array, ok: Array) -> dict[str, Array]:
        return {s: np.where(ok, values[s][np.maximum(rows, 0)], np.nan) if rows.size else np.zeros(0) for s in sources}

    requests: dict[str, dict[str, int]] = {}
    kind_codes, kind_labels = shadow_kind
    kinds = kind_codes[keep]
    kept_variants = var_codes[keep]
    for i, label in enumerate(var_labels):
        mine = kept_variants == i
        if not mine.any():
            continue
        counts = {"requests": int(mine.sum())}
        for name in ("sent", "dropped"):
            hit = np.flatnonzero(kind_labels == name)
            counts[name] = int((mine & (kinds == hit[0])).sum()) if hit.size else 0
        counts["chosen"] = counts["sent"] + counts["dropped"]
        requests[str(label)] = counts
    return pr.ShadowPairs(variant, paired, primary_rows, side(primary_rows, paired),
                          side(shadow_rows, np.ones(shadow_rows.size, dtype=bool)), requests)


def _sources(
    sources: Sequence[str], table: pa.Table, trace: Array, lat: Mapping[str, Array], cost_all: Array, billed: Array,
    has_bill: Array, by_trace: Mapping[str, Array], spec: ExperimentSpec,
) -> dict[str, Array]:
    """Every source read (the plan's, and the paired analysis's), one float per event row (NaN: absent)."""
    t = np.maximum(trace, 0)
    traced = trace >= 0
    values: dict[str, Array] = dict(lat)
    for name in fields.INFERENCE_FIELDS:
        if name in sources and name not in values and name != fields.COST_FIELD:
            values[name] = _float(table, name)
    values[fields.COST_FIELD] = np.where(traced & has_bill[t], billed[t], np.nan_to_num(cost_all)) if trace.size else cost_all
    for name in ua.LABELS:
        values[name] = np.where(traced, by_trace[name][t], np.nan) if trace.size else np.full(0, np.nan)
    err = _is_error(table)
    values["error"] = err.astype(float)
    values["good"] = ua.good_numpy(err, values, spec.slos)
    for s in dict.fromkeys(sources):
        if s.startswith(MEASURE_PREFIX):
            values[s] = _measure(table, s[len(MEASURE_PREFIX):])
    return values


def _units(
    plan: ua.UnitPlan, values: Mapping[str, Array], rows: Array, var_codes: Array, var_labels: Array, unit: Array,
    *extra: Array,
) -> dict[str, Array]:
    out = ua.per_unit_numpy(plan, values, rows, var_codes[rows], unit[rows], *extra)
    out["variant"] = var_labels[var_codes[rows][out["_first"]]] if rows.size else np.array([], dtype=object)
    return out


def _segments(
    plan: ua.UnitPlan, table: pa.Table, values: Mapping[str, Array], keep: Array, var_codes: Array, var_labels: Array,
    unit: Array, pre: Mapping[str, Array] | None, spec: ExperimentSpec,
) -> dict[str, dict[str, dict[str, VariantStats]]]:
    """dimension → value → variant → stats: per-unit rows of each value (top 20, "(other)", "(none)")."""
    out: dict[str, dict[str, dict[str, VariantStats]]] = {}
    for dim in plan.segments:
        text, present = _dim(table, dim)
        top = ua.top_values(text[keep], present[keep])
        labels = ua.fold_values(text[keep], present[keep], top)
        seg_labels, seg_codes = np.unique(labels.astype(str), return_inverse=True)
        full = np.zeros(table.num_rows, dtype=np.int64)
        full[keep] = seg_codes
        rows = _units(plan, values, keep, var_codes, var_labels, unit, full[keep])
        first = rows.pop("_first")
        rows["segment"] = seg_labels[full[keep][first]]
        rows["_unit"] = unit[keep][first]
        ua.attach_pre(plan, rows, rows["_unit"], pre)
        rows["unit_id"] = rows.pop("_unit")
        out[DIM_PREFIX + dim] = segment_stats_from_units(rows, cuped=spec.cuped, custom=spec.custom)
    return out


def _exposures(
    spec: ExperimentSpec, rows_mask: Array, unit_codes: Array, var_codes: Array, var_labels: Array,
) -> dict[str, float] | None:
    rows = np.flatnonzero(rows_mask & (unit_codes >= 0) & (var_codes >= 0))
    if spec.request_randomized or not rows.size:
        return None
    pairs = np.unique(var_codes[rows] * (int(unit_codes.max()) + 1) + unit_codes[rows])
    per_variant = np.bincount(pairs // (int(unit_codes.max()) + 1), minlength=var_labels.size)
    counts = dict(zip(map(str, var_labels), per_variant.tolist()))
    return {v.key: float(counts.get(v.key, 0)) for v in spec.variants}


def analyze_events(events: Any, spec: ExperimentSpec, *,
                   policies: list[PolicyBreakdown] | None = None) -> tuple[Results, OfflineAggregates]:
    """The engine's results over an event file, and what was aggregated. ``policies``: the
    policy variants' breakdowns, which the policy package computes (it reads this package, so
    ``ablab analyze`` joins them one layer up: :mod:`ablab.platform.analytics.offline`)."""
    agg = aggregate_events(events, spec)
    extra: dict[str, Any] = {"data_quality": agg.data_quality}
    if policies is not None:
        extra["policies"] = policies
    result = analyze_results(spec=spec, stats=agg.stats, exposures=agg.exposures, extra=extra,
                             segments=agg.segments, shadows=agg.shadows)
    return result, agg

