"""The per-unit aggregation, declared once: which per-unit columns an experiment needs and
how each is computed from the experiment's requests.

:func:`plan` turns an :class:`~.spec.ExperimentSpec` into a :class:`UnitPlan` — the built-in
columns of :data:`.metrics.UNIT_COLUMNS`, every custom metric's :func:`.metrics.custom_columns`
(pre-period and covariate columns included), the histograms of quantile metrics and the
segment dimensions (:data:`BUILTIN`: the built-in columns, defined from the field catalogue).
Three renderings of the same plan exist, so the store, its rollup and ``ablab analyze``
cannot drift:

- :func:`store_sql` — the raw scan, ClickHouse text over ``raw_events`` (values are bound
  parameters; a measure or dimension name is a parameter, never spliced into the text);
- the rollup recompute (``ablab.streaming.store.rollup``) — :data:`BUILTIN` through
  :func:`column_sql` over the loader's lookup tables, stored per unit, and read back by
  :func:`rollup_select` for the plans :func:`rollup_unsupported` accepts (the rule, stated
  once, is above it);
- :func:`per_unit_numpy` / :func:`histograms_numpy` — ``np.bincount`` over request arrays.

All read a request through its *sources* (one float per request, NaN/NULL when absent):

- the inference event's catalogue fields (:data:`SOURCE_FIELDS`, ``ablab.platform.fields``);
- the cost field (``fields.COST_FIELD``): the trace's billed cost where billing arrived, else
  the worker's estimate, else 0 (always present);
- ``measures.<name>``: the event's measure of that name, absent when it carried none;
- ``score`` / ``correct``: the trace's latest label carrying that field (by event time);
- ``error``: 1 when the request failed (:data:`ERROR_RULE`), else 0 (always present);
- ``good``: 1 when the request met every SLO of the experiment and did not fail
  (:func:`good_sql` / :func:`good_numpy`: a field the catalogue marks ``nullable`` cannot
  break its SLO by being absent; any other must be present and within the bound).

A request is *valid* (:func:`valid_sql`) when it has a trace and a unit and no latency
(``fields.LATENCY_FIELDS``) is negative. The three renderings — the raw scan, the rollup
recompute (``ablab.streaming.store.rollup``, over :data:`BUILTIN` with :func:`column_sql`)
and numpy — take the error rule, ``good`` and validity from here.

A column is ``count`` (requests where its ``requires`` sources are present), ``sum`` or
``sumsq`` (Σ source / Σ source² over requests where the source and ``requires`` are
present). In-period requests (``spec.start <= ts < spec.end``, each bound only when the spec
has it) make the rows; pre-period requests (``ts < spec.start``) are summed per unit, whatever
their variant, and attached to the unit's rows (:func:`attach_pre`), as CUPED's covariate.
Requests at or after ``spec.end`` (``analysis.end``, or a ship: every later unit gets the
shipped variant) are no part of the analysis.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ablab.platform import fields

from .custom_metric import CustomMetric, custom_columns
from .metrics import (
    DIM_PREFIX,
    HISTOGRAM_SOURCES,
    MEASURE_PREFIX,
    SLO_METRICS,
    UNIT_COLUMNS,
)
from .sufficient import HIST_BUCKETS, HistogramStats, histogram_bucket, histogram_bucket_sql

Array = NDArray[Any]  # one value per request, unit or group (floats, codes, labels)
SOURCE_FIELDS: tuple[str, ...] = fields.INFERENCE_FIELDS
COST = fields.COST_FIELD
LABELS: tuple[str, ...] = ("score", "correct")
DERIVED: tuple[str, ...] = ("error", "good")
ERROR_RULE = "a request failed when its `error` is present and not empty (a boolean column: when true)"
MAX_SEGMENT_VALUES = 20
OTHER, NONE = "(other)", "(none)"

Op = Literal["count", "sum", "sumsq"]


@dataclass(frozen=True, slots=True)
class UnitColumn:
    name: str
    op: Op
    source: str | None = None  # count: None
    requires: tuple[str, ...] = ()

    @property
    def summed(self) -> str:
        """The source a ``sum``/``sumsq`` column adds up."""
        if self.source is None:
            raise ValueError(f"column {self.name} ({self.op}) sums no source")
        return self.source


@dataclass(frozen=True, slots=True)
class Histogram:
    key: str  # built-in: the latency; custom quantile: the metric's name
    source: str
    count_column: str  # in-period column counting the requests that have the source


@dataclass(frozen=True, slots=True)
class UnitPlan:
    columns: tuple[UnitColumn, ...]  # in-period, one row per (variant, unit[, segment value])
    pre_columns: tuple[UnitColumn, ...]  # pre-period, per unit
    histograms: tuple[Histogram, ...]
    segments: tuple[str, ...]  # dimension names (without "dims.")
    slos: Mapping[str, float]

    @property
    def sources(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for c in (*self.columns, *self.pre_columns):
            for s in (c.source, *c.requires):
                if s:
                    seen[s] = None
        for h in self.histograms:
            seen[h.source] = None
        return tuple(seen)


def check_source(source: str) -> None:
    if source in SOURCE_FIELDS or source in LABELS or source in DERIVED:
        return
    if source.startswith(MEASURE_PREFIX) and len(source) > len(MEASURE_PREFIX):
        return
    raise ValueError(f"unknown source {source!r}: a field ({', '.join(SOURCE_FIELDS)}), measures.<name>, score, correct or error")


def _field_column(name: str, stat: fields.UnitStat, prefix: str = "") -> UnitColumn:
    column = prefix + fields.unit_column(name, stat)
    if stat == "n":
        return UnitColumn(column, "count", requires=(name,))
    return UnitColumn(column, "sumsq" if stat == "sq" else "sum", name)


def _builtin() -> tuple[UnitColumn, ...]:
    """The built-in per-unit columns (:data:`.metrics.UNIT_COLUMNS`), defined from the catalogue:
    every rolled-up field's ``per_unit`` statistics, then labels, labelled cost and ``good``."""
    cols = [UnitColumn("requests", "count"), UnitColumn("errors", "sum", "error")]
    cols += [_field_column(f.name, stat) for f in fields.FIELDS.values() for stat in f.per_unit]
    cols += [
        UnitColumn("labeled", "count", requires=("correct",)),
        UnitColumn("correct", "sum", "correct"),
        UnitColumn(fields.labeled_sum_column(COST), "sum", COST, ("correct",)),
        UnitColumn("good", "sum", "good"),
    ]
    return tuple(cols)


BUILTIN: tuple[UnitColumn, ...] = _builtin()
"""Every plan's built-in columns; the per-unit rollup stores them by name."""
if tuple(c.name for c in BUILTIN) != UNIT_COLUMNS:  # two derivations of one catalogue
    raise AssertionError(f"unit_agg.BUILTIN {[c.name for c in BUILTIN]} != metrics.UNIT_COLUMNS {UNIT_COLUMNS}")


def _builtin_pre() -> list[UnitColumn]:
    """CUPED's pre-period covariates: requests and each rolled-up field's sum and count."""
    cols = [UnitColumn("pre_requests", "count")]
    cols += [_field_column(f.name, stat, "pre_") for f in fields.FIELDS.values() for stat in f.per_unit if stat != "sq"]
    return cols


def _named(source: str | None, m: CustomMetric, role: str) -> str:
    if not source:
        raise ValueError(f"custom metric {m.name!r}: no {role}")
    return source


def _xy(x: str, y: str, m: CustomMetric, source: str | None = None) -> list[UnitColumn]:
    if m.kind == "ratio" and source is None:
        num, den = _named(m.numerator, m, "numerator"), _named(m.denominator, m, "denominator")
        return [UnitColumn(x, "sum", num, (num, den)), UnitColumn(y, "sum", den, (num, den))]
    src = _named(source or m.column, m, "column")
    return [UnitColumn(x, "sum", src), UnitColumn(y, "count", requires=(src,))]


def custom_plan(m: CustomMetric) -> tuple[list[UnitColumn], list[UnitColumn], list[Histogram]]:
    """(in-period columns, pre-period columns, histograms) of one custom metric."""
    for s in m.sources:
        check_source(s)
    names = custom_columns(m)
    cols = _xy(names["x"], names["y"], m)
    pre, hist = [], []
    if "sq" in names:
        column = _named(m.column, m, "column")
        cols.append(UnitColumn(names["sq"], "sumsq", column))
        hist.append(Histogram(m.name, column, names["y"]))
    if "pre_x" in names:
        pre = _xy(names["pre_x"], names["pre_y"], m)
    if "cov_x" in names:
        cols += _xy(names["cov_x"], names["cov_y"], m, source=m.covariate)
    return cols, pre, hist


def plan(spec: Any) -> UnitPlan:
    cols, pre = list(BUILTIN), (_builtin_pre() if spec.cuped and spec.start else [])
    hists = [Histogram(lat, lat, f"{lat}_n") for lat in HISTOGRAM_SOURCES]
    for m in getattr(spec, "custom", ()) or ():
        c, p, h = custom_plan(m)
        cols += c
        pre += p
        hists += h
    segments = []
    for seg in getattr(spec, "segments", ()) or ():
        if not seg.startswith(DIM_PREFIX) or len(seg) == len(DIM_PREFIX):
            raise ValueError(f"segments: {seg!r} is not dims.<name>")
        segments.append(seg[len(DIM_PREFIX):])
    for name in spec.slos:
        if name not in SLO_METRICS:
            raise ValueError(f"slos.{name}: not an SLO metric")
    return UnitPlan(tuple(cols), tuple(pre), tuple(hists), tuple(segments), dict(spec.slos))


# --- the numpy rendering ---------------------------------------------------------------


def _present(values: Mapping[str, Array], source: str) -> Array:
    return ~np.isnan(values[source])


def column_numpy(col: UnitColumn, values: Mapping[str, Array], rows: Array, inverse: Array, k: int) -> Array:
    """One column over the request positions ``rows`` grouped by ``inverse``."""
    cond = np.ones(rows.size, dtype=bool)
    for r in col.requires:
        cond &= _present(values, r)[rows]
    if col.op == "count":
        return np.bincount(inverse, weights=cond.astype(float), minlength=k)
    x = values[col.summed][rows]
    ok = cond & ~np.isnan(x)
    x0 = np.where(ok, x, 0.0)
    return np.bincount(inverse, weights=x0 * x0 if col.op == "sumsq" else x0, minlength=k)


def good_numpy(error: Array, values: Mapping[str, Array], slos: Mapping[str, float]) -> Array:
    """``good`` per request: no error and every SLO met (:func:`slo_may_be_absent`)."""
    good = error == 0
    for name, bound in slos.items():
        x = values[name]
        good &= (np.isnan(x) | (x <= bound)) if slo_may_be_absent(name) else (~np.isnan(x) & (x <= bound))
    out: Array = good.astype(float)
    return out


def valid_numpy(values: Mapping[str, Array]) -> Array:
    """:func:`valid_sql`'s latency rule per request (trace and unit are checked where they are coded)."""
    ok: Array | None = None
    for name in fields.LATENCY_FIELDS:
        x = values[name]
        this = np.isnan(x) | (x >= 0)
        ok = this if ok is None else ok & this
    assert ok is not None, "the catalogue has latencies"
    return ok


def group(*keys: Array) -> tuple[Array, Array, int]:
    """Dense group ids of the rows' key tuples (non-negative ints): (inverse, first row per group, k)."""
    if not keys[0].size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0
    key = np.zeros(keys[0].size, dtype=np.int64)
    for part in keys:
        key = key * (int(part.max()) + 1) + part
    if int(key.max()) < 50_000_000:  # a dense relabelling beats a sort when codes are small
        occupied = np.bincount(key) > 0
        inverse = (np.cumsum(occupied) - 1)[key]
        k = int(occupied.sum())
    else:
        _, inverse = np.unique(key, return_inverse=True)
        k = int(inverse.max()) + 1
    first = np.full(k, inverse.size, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(inverse.size))
    return inverse, first, k


def per_unit_numpy(p: UnitPlan, values: Mapping[str, Array], rows: Array, *keys: Array) -> dict[str, Array]:
    """The plan's in-period columns over request positions ``rows``, grouped by ``keys``
    (arrays over ``rows``); ``_first`` holds each group's first position in ``rows``."""
    inverse, first, k = group(*keys)
    out = {c.name: column_numpy(c, values, rows, inverse, k) for c in p.columns}
    out["_first"] = first
    return out


def pre_numpy(p: UnitPlan, values: Mapping[str, Array], rows: Array, unit: Array) -> dict[str, Array]:
    """Pre-period columns per unit code (``unit`` over ``rows``): ``unit`` key + columns."""
    inverse, first, k = group(unit)
    out = {c.name: column_numpy(c, values, rows, inverse, k) for c in p.pre_columns}
    out["unit"] = unit[first]
    return out


def attach_pre(p: UnitPlan, units: dict[str, Array], unit_key: Array, pre: Mapping[str, Array] | None) -> None:
    """Pre-period columns onto per-unit rows (in place), matched by unit key; 0 without any."""
    if not p.pre_columns:
        return
    n = unit_key.size
    if pre is None or not pre["unit"].size:
        for c in p.pre_columns:
            units[c.name] = np.zeros(n)
        return
    order = np.argsort(pre["unit"], kind="stable")
    keys = np.asarray(pre["unit"])[order]
    pos = np.clip(np.searchsorted(keys, unit_key), 0, keys.size - 1)
    hit = keys[pos] == unit_key
    for c in p.pre_columns:
        units[c.name] = np.where(hit, np.asarray(pre[c.name], dtype=float)[order][pos], 0.0)


def histograms_numpy(p: UnitPlan, values: Mapping[str, Array], rows: Array, var: Array,
                     labels: Array) -> dict[str, dict[str, HistogramStats]]:
    """Per-variant histograms (variant label → key → histogram); ``var`` codes over ``rows``."""
    k = max(labels.size, 1)
    out: dict[str, dict[str, HistogramStats]] = {str(v): {} for v in labels}
    for h in p.histograms:
        x = values[h.source][rows]
        ok = ~np.isnan(x)
        flat = var[ok] * HIST_BUCKETS + histogram_bucket(x[ok])
        counts = np.bincount(flat, minlength=k * HIST_BUCKETS).reshape(k, HIST_BUCKETS)
        for i, variant in enumerate(labels):
            out[str(variant)][h.key] = HistogramStats(counts[i].astype(np.int64))
    return out


def top_values(values: Array, present: Array) -> list[str]:
    """The dimension's top :data:`MAX_SEGMENT_VALUES` values by requests (ties: by value)."""
    got, counts = np.unique(values[present].astype(str), return_counts=True)
    order = sorted(range(got.size), key=lambda i: (-counts[i], got[i]))
    return [str(got[i]) for i in order[:MAX_SEGMENT_VALUES]]


def fold_values(values: Array, present: Array, top: list[str]) -> Array:
    """Each request's segment label: its value if among ``top``, else "(other)"; "(none)" without one."""
    text = values.astype(str)
    out = np.where(np.isin(text, np.asarray(top, dtype=str)), text, OTHER).astype(object)
    out[~present] = NONE
    return out


# --- the SQL rendering -----------------------------------------------------------------


def _sql_source(source: str, params: dict[str, Any]) -> str:
    if source == COST:
        return f"toFloat64(ifNull({_BILLED_COST}, 0))"
    if source in SOURCE_FIELDS:
        return f"toFloat64(r.{source})" if fields.FIELDS[source].type == "int" else f"r.{source}"
    if source in LABELS:
        return f"l.{source}"
    if source == "error":
        return f"toFloat64({ERROR_SQL})"
    if source == "good":
        return "toFloat64(r.good)"
    if source.startswith(MEASURE_PREFIX):
        name = f"m{len(params)}"
        params[name] = source[len(MEASURE_PREFIX):]
        return f"if(mapContains(r.measures, {{{name}:String}}), r.measures[{{{name}:String}}], NULL)"
    raise ValueError(f"unknown source {source!r}")


def error_sql(column: str = "r.error") -> str:
    """:data:`ERROR_RULE` over the event's ``error`` text (the raw scan, the rollup's ``is_error``)."""
    return f"({column} IS NOT NULL AND {column} != '')"


def is_error(value: Any) -> bool:
    """:data:`ERROR_RULE` for one event's ``error`` value (the loader's rollup rows)."""
    return value is not None and value != "" and value is not False


ERROR_SQL = error_sql()


def slo_may_be_absent(name: str) -> bool:
    """Whether a request without field ``name`` meets its SLO: yes for a field the catalogue
    marks ``nullable`` (one output token has no TPOT), no for any other."""
    return fields.FIELDS[name].nullable


def good_sql(slos: Mapping[str, float | None], params: dict[str, Any], *, prefix: str = "r.", error: str = ERROR_SQL) -> str:
    """``good`` as ClickHouse text: not ``error`` and every SLO met; bounds are bound
    parameters (``slo_<field>``), a None bound is no SLO. The raw scan and the rollup
    recompute both render it."""
    good = [f"NOT {error}"]
    for name, bound in slos.items():
        if bound is None:
            continue
        if name not in SLO_METRICS:
            raise ValueError(f"slos.{name}: not an SLO metric")
        params[f"slo_{name}"] = float(bound)
        col, limit = f"{prefix}{name}", f"{{slo_{name}:Float64}}"
        if slo_may_be_absent(name):
            good.append(f"({col} IS NULL OR {col} <= {limit})")
        else:
            good.append(f"({col} IS NOT NULL AND {col} <= {limit})")
    return " AND ".join(good)


def valid_sql(prefix: str = "r.") -> str:
    """The latency half of a valid request: no latency negative (an absent one is fine)."""
    return " AND ".join(f"({prefix}{n} IS NULL OR {prefix}{n} >= 0)" for n in fields.LATENCY_FIELDS)


def column_sql(col: UnitColumn, alias: Mapping[str, str], period: str) -> str:
    """One plan column as a ClickHouse aggregate over per-request rows whose sources are
    ``alias[source]``, counting rows where ``period`` holds (the raw scan: the period; the
    rollup recompute: validity)."""
    cond = [period, *(f"{alias[r]} IS NOT NULL" for r in col.requires)]
    if col.op == "count":
        return f"toFloat64(countIf({' AND '.join(cond)})) AS `{col.name}`"
    v = f"ifNull({alias[col.summed]}, 0)"
    expr = f"{v} * {v}" if col.op == "sumsq" else v
    return f"toFloat64(sumIf({expr}, {' AND '.join(cond)})) AS `{col.name}`"


_BILLED_COST = f"if(b.has = 1, b.billed, r.{COST})"  # in _sql_source's cost; without billing: the event's own


def _always_read(slos: Mapping[str, Any]) -> list[str]:
    """The fields every scan reads: the latencies (validity, ``good``) and the cost (billing)."""
    return [*fields.LATENCY_FIELDS, *(s for s in slos if s not in fields.LATENCY_FIELDS), COST]


def _billing_join(fin: str) -> str:
    """Σ billed cost per trace (``b``), joined to the request rows ``r``."""
    return f"""LEFT JOIN (
                SELECT cityHash64(trace_id) AS t, sum({COST}) AS billed, toUInt8(1) AS has FROM raw_events {fin}
                WHERE type = 'cost' AND {COST} IS NOT NULL GROUP BY t
            ) AS b ON b.t = cityHash64(r.trace_id)"""


def _label_join(fin: str) -> str:
    """The trace's latest label per field (``l.correct``, ``l.score``), joined to the request rows ``r``."""
    return f"""LEFT JOIN (
                SELECT cityHash64(trace_id) AS t,
                       if(countIf(correct IS NOT NULL) > 0, toFloat64(argMaxIf(assumeNotNull(correct), ts, correct IS NOT NULL)), NULL) AS correct,
                       if(countIf(score IS NOT NULL) > 0, argMaxIf(assumeNotNull(score), ts, score IS NOT NULL), NULL) AS score
                FROM raw_events {fin} WHERE type = 'feedback' GROUP BY t
            ) AS l ON l.t = cityHash64(r.trace_id)"""


@dataclass(frozen=True, slots=True)
class StoreSQL:
    main: str  # per-unit rows, per-segment rows and histograms (GROUPING SETS), in-period
    pre: str | None  # pre-period columns per unit
    params: dict[str, Any]
    sets: dict[str, int]  # "units", "seg:<dim>", "hist:<key>" → grouping() code
    top_values: str | None  # the top values of each segment dimension (needs {dims:Array(String)})


def store_sql(p: UnitPlan, spec: Any, *, final: bool = True, billing: bool = True,
              top: Mapping[str, list[str]] | None = None) -> StoreSQL:
    """The plan as ClickHouse text over ``raw_events``. ``top``: each segment dimension's
    top values (from the ``top_values`` query); the main query folds the rest into "(other)"."""
    fin = "FINAL" if final else ""
    params: dict[str, Any] = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
    alias: dict[str, str] = {}
    exprs = []
    for i, s in enumerate(p.sources):
        alias[s] = f"s{i}"
        exprs.append(f"{_sql_source(s, params)} AS s{i}")
    unit = "r.trace_id" if spec.request_randomized else "r.unit_id"
    good = good_sql(p.slos, params)
    in_period, pre_period = period_sql(spec, params)
    seg_exprs, seg_keys = [], []
    for j, dim in enumerate(p.segments):
        params[f"dim{j}"] = dim
        params[f"top{j}"] = list((top or {}).get(dim, []))
        d = f"{{dim{j}:String}}"
        seg_exprs.append(
            f"if(mapContains(r.dims, {d}), if(has({{top{j}:Array(String)}}, r.dims[{d}]), r.dims[{d}], '{OTHER}'), '{NONE}') AS g{j}"
        )
        seg_keys.append(f"i.g{j}")
    hist_exprs, hist_keys = [], []
    for j, h in enumerate(p.histograms):
        hist_exprs.append(f"toUInt16({histogram_bucket_sql(f'ifNull({alias[h.source]}, -1)')}) AS h{j}")
        hist_keys.append(f"i.h{j}")
    keys = ["i.u", *seg_keys, *hist_keys]
    sets_sql = ["(variant, i.u)"] + [f"(variant, i.u, {g})" for g in seg_keys] + [f"(variant, {h})" for h in hist_keys]
    width = len(keys)
    sets = {"units": (1 << (width - 1)) - 1}
    for j, dim in enumerate(p.segments):
        sets[f"seg:{dim}"] = ((1 << width) - 1) & ~(1 << (width - 1)) & ~(1 << (width - 2 - j))
    for j, h in enumerate(p.histograms):
        sets[f"hist:{h.key}"] = ((1 << width) - 1) & ~(1 << (width - 2 - len(seg_keys) - j))
    inner_alias = {s: f"i.{a}" for s, a in alias.items()}
    columns = ",\n               ".join(column_sql(c, inner_alias, "1") for c in p.columns)
    billing_join = _billing_join(fin) if billing else ""
    if not billing:
        exprs = [e.replace(_BILLED_COST, f"r.{COST}") for e in exprs]
    label_join = _label_join(fin) if any(s in LABELS for s in p.sources) else ""
    # pre-period requests count per unit whatever their variant (even none)
    valid = f"""r.type = 'inference' AND r.experiment = {{experiment:String}}
              AND r.trace_id != '' AND {unit} != '' AND {valid_sql()}"""
    where = f"{valid} AND r.variant IN {{variants:Array(String)}}"

    # only the columns the plan reads (a FINAL scan reads every column it is given)
    needed = ["ts", "variant", "unit_id", "trace_id", *_always_read(p.slos), "error"]
    needed += [f for f in SOURCE_FIELDS if f in p.sources and f not in needed]
    needed += ["measures"] if any(x.startswith(MEASURE_PREFIX) for x in p.sources) else []
    needed += ["dims"] if p.segments else []
    read = ", ".join(f"r.{c} AS {c}" for c in needed)

    def scan(period: str, extra: list[str]) -> str:
        cols = ", ".join([*exprs, *extra])
        cond = f"{where} AND {period}" if period != pre_period else f"{valid} AND {period}"
        return f"""SELECT r.variant AS variant, cityHash64({unit}) AS u, r.ts AS ts, {cols}
            FROM (SELECT {read}, {good} AS good FROM raw_events AS r {fin} WHERE {cond}) AS r
            {billing_join}
            {label_join}"""

    grouping = f"grouping({', '.join(keys)})"
    main = f"""
        SELECT toString(i.variant) AS variant, i.u AS unit_id, {', '.join(k + ' AS ' + k[2:] for k in keys[1:]) + ',' if keys[1:] else ''}
               {grouping} AS grouping_set,
               {columns},
               toFloat64(dateDiff('millisecond', min(i.ts), max(i.ts))) / 1000 AS span_s
        FROM ({scan(in_period, [*seg_exprs, *hist_exprs])}) AS i
        GROUP BY GROUPING SETS ({', '.join(sets_sql)})
        SETTINGS force_grouping_standard_compatibility = 1, join_use_nulls = 1
    """
    pre = None
    if p.pre_columns:
        pre_cols = ",\n               ".join(column_sql(c, inner_alias, "1") for c in p.pre_columns)
        pre = f"""
        SELECT i.u AS unit, {pre_cols}
        FROM ({scan(pre_period, [])}) AS i GROUP BY i.u SETTINGS join_use_nulls = 1
        """
    top_sql = None
    if p.segments:
        top_sql = f"""
        SELECT k, v, count() AS c FROM (
            SELECT r.dims AS dims FROM raw_events AS r {fin}
            WHERE {where} AND {in_period}
        ) ARRAY JOIN mapKeys(dims) AS k, mapValues(dims) AS v
        WHERE has({{dims:Array(String)}}, k)
        GROUP BY k, v ORDER BY k, c DESC, v LIMIT {MAX_SEGMENT_VALUES} BY k
        """
        params["dims"] = list(p.segments)
    return StoreSQL(main, pre, params, sets, top_sql)


# --- shadow requests and their primaries (issue 34; the pure analysis: .paired) -----------


@dataclass(frozen=True, slots=True)
class ShadowSQL:
    probe: str  # any shadow activity (a shadow event, or a primary chosen for one)? No FINAL: a cheap check
    pairs: str  # one row per shadow request: variant, paired, primary_key, p{i} / s{i} per source
    requests: str  # per variant: requests, chosen, sent, dropped
    params: dict[str, Any]
    sources: tuple[str, ...]  # p{i} / s{i} is sources[i]


def shadow_sql(spec: Any, sources: tuple[str, ...], *, final: bool = True, billing: bool = True) -> ShadowSQL:
    """The paired analysis's rows as ClickHouse text over ``raw_events``: each shadow request
    (``type = 'shadow'``) with the in-period request of a variant whose ``trace_id`` is its
    ``shadow_of`` (none: ``paired`` 0, the primary's values NULL), the same validity rules,
    period and sources (:func:`_sql_source`: billing replaces the estimate, the trace's latest
    label per field) as :func:`store_sql`, so ``ablab analyze`` (numpy) cannot drift from it.
    Every value is a bound parameter."""
    fin = "FINAL" if final else ""
    params: dict[str, Any] = {"experiment": spec.key, "variants": [v.key for v in spec.variants]}
    exprs = [f"{_sql_source(src, params)} AS s{i}" for i, src in enumerate(sources)]
    if not billing:
        exprs = [e.replace(_BILLED_COST, f"r.{COST}") for e in exprs]
    good = good_sql(spec.slos, params)
    unit = "r.trace_id" if spec.request_randomized else "r.unit_id"
    in_period, _ = period_sql(spec, params)
    valid = f"""r.experiment = {{experiment:String}} AND r.variant IN {{variants:Array(String)}}
              AND r.trace_id != '' AND {unit} != '' AND {in_period} AND {valid_sql()}"""
    # the primaries worth reading: those some shadow names (a superset without FINAL is as good a filter)
    shadows_of = "SELECT shadow_of FROM raw_events WHERE type = 'shadow' AND experiment = {experiment:String}"
    read = ["event_id", "ts", "variant", "unit_id", "trace_id", "shadow_of", *_always_read(spec.slos), "error"]
    read += [f for f in SOURCE_FIELDS if f in sources and f not in read]
    read += ["measures"] if any(x.startswith(MEASURE_PREFIX) for x in sources) else []
    billing_join = _billing_join(fin) if billing else ""
    label_join = _label_join(fin) if any(x in LABELS for x in sources) else ""

    def scan(kind: str, extra: str) -> str:
        # one row per trace_id (the earliest), as ablab analyze keeps one request per trace
        return f"""SELECT r.trace_id AS trace_id, r.variant AS variant, r.shadow_of AS shadow_of,
                   cityHash64(r.trace_id) AS k, {', '.join(exprs)}
            FROM (SELECT {', '.join(f'r.{c} AS {c}' for c in read)}, {good} AS good FROM raw_events AS r {fin}
                  WHERE r.type = '{kind}' AND {valid}{extra}
                  ORDER BY trace_id, ts, event_id LIMIT 1 BY trace_id) AS r
            {billing_join}
            {label_join}"""

    picks = ", ".join([*(f"p.s{i} AS p{i}" for i in range(len(sources))), *(f"s.s{i} AS s{i}" for i in range(len(sources)))])
    pairs = f"""
        SELECT toString(if(p.trace_id IS NULL, s.variant, p.variant)) AS variant,
               toUInt8(p.trace_id IS NOT NULL) AS paired, ifNull(p.k, 0) AS primary_key, {picks}
        FROM ({scan('shadow', " AND r.shadow_of != ''")}) AS s
        LEFT JOIN ({scan('inference', f' AND r.trace_id IN ({shadows_of})')}) AS p ON p.trace_id = s.shadow_of
        SETTINGS join_use_nulls = 1
    """
    requests = f"""
        SELECT toString(r.variant) AS variant, toUInt64(count()) AS requests,
               toUInt64(countIf(r.shadow IN ('sent', 'dropped'))) AS chosen,
               toUInt64(countIf(r.shadow = 'sent')) AS sent, toUInt64(countIf(r.shadow = 'dropped')) AS dropped
        FROM raw_events AS r {fin}
        WHERE r.type = 'inference' AND {valid}
        GROUP BY r.variant
    """
    probe = """
        SELECT count() FROM (SELECT 1 FROM raw_events WHERE type IN ('inference', 'shadow')
            AND experiment = {experiment:String} AND (type = 'shadow' OR shadow IN ('sent', 'dropped')) LIMIT 1)
    """
    return ShadowSQL(probe, pairs, requests, params, tuple(sources))


def start_ms(text: str, name: str = "start") -> int:
    """``spec.start`` (ISO-8601; UTC when it names no zone) in epoch milliseconds."""
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(str(text).replace(" ", "T"))
    except ValueError:
        raise ValueError(f"{name}: not an ISO-8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(round(moment.timestamp() * 1000))


def end_ms(text: str) -> int:
    """``spec.end`` (ISO-8601, exclusive) in epoch milliseconds, rounded as :func:`start_ms`."""
    return start_ms(text, "end")


def period_sql(spec: Any, params: dict[str, Any]) -> tuple[str, str]:
    """(in-period, pre-period) conditions on ``r.ts`` for the spec's window, in epoch
    milliseconds as the offline path compares them; binds ``start_ms`` / ``end_ms``."""
    bounds, pre_period = [], "0"
    if spec.start:
        params["start_ms"] = start_ms(spec.start)
        bounds.append("toUnixTimestamp64Milli(r.ts) >= {start_ms:Int64}")
        pre_period = "toUnixTimestamp64Milli(r.ts) < {start_ms:Int64}"
    if getattr(spec, "end", None):
        params["end_ms"] = end_ms(spec.end)
        bounds.append("toUnixTimestamp64Milli(r.ts) < {end_ms:Int64}")
    return " AND ".join(bounds) or "1", pre_period


# --- the rollup rendering (unit_stats / unit_segment_stats, migrations 0006–0013) -------
#
# The rule, in one place: the per-unit rollup keeps, per unit (and per unit and segment
# value), the built-in columns and, for every *nullable* source (a latency or other catalogue
# field, score, correct, measures.<name>), Σ value, the count of requests with a value, Σ value²
# and Σ cost over those requests. The cost field and ``error`` are present on every request
# (Σ: the cost's unit sum, errors; count: requests). So a column reads the rollup when it needs at
# most one nullable source, except Σ of a nullable source over requests where another
# nullable source is present (a ratio of two nullable sources, e.g. output_tokens /
# prompt_tokens) and Σ error where a nullable source is present. Histograms of custom
# quantile metrics are not kept, nor request-randomized experiments; in-period sums equal
# all-time sums only when no request precedes ``spec.start`` (checked on the store). What the
# rollup cannot give keeps the raw scan (:func:`store_sql`).

ALWAYS_PRESENT = {COST: fields.unit_column(COST, "sum"), "error": "errors"}

# The rollup's layout, the one contract between its writer and its reader (both in
# ablab.streaming.store.rollup): the built-in per-unit sums stored by name (BUILTIN, i.e.
# metrics.UNIT_COLUMNS), the per-source maps, and the layout version (rows computed under an
# older one are recomputed before they are read).
ROLLUP_MAPS = ("src_sum", "src_n", "src_sq", "src_cost")  # keyed by source: Σ value, count, Σ value², Σ cost
ROLLUP_VERSION = 2  # 2: validity is every latency's (the tpot rule joined the raw scan's)
_SEGMENTS_MARK = "+segments"


def rollup_key(slos: Mapping[str, float], *, segments: bool = False) -> str:
    """What a unit's rollup rows were computed under (their ``slo_key``): the experiment's SLOs
    (``good`` depends on them) and whether its segment rows are kept (only experiments that
    declare segments pay for them). Rows under another key are stale."""
    for name in slos:
        if name not in SLO_METRICS:
            raise ValueError(f"slos.{name}: not an SLO metric ({', '.join(SLO_METRICS)})")
    key = json.dumps({k: float(slos[k]) for k in sorted(slos)}, separators=(",", ":"))
    return key + _SEGMENTS_MARK if segments else key


def key_keeps_segments(key: str) -> bool:
    """Whether rollup rows computed under ``key`` (:func:`rollup_key`) include segment rows."""
    return key.endswith(_SEGMENTS_MARK)


def rollup_column(col: UnitColumn, params: dict[str, Any], prefix: str = "") -> str | None:
    """SQL for one plan column over a rollup row's columns (``prefix`` + name), or None when
    the rollup cannot give it exactly. Map keys are bound parameters."""
    nullable = sorted({s for s in (col.source, *col.requires) if s and s not in ALWAYS_PRESENT})

    def key(source: str) -> str:
        name = f"k{len(params)}"
        params[name] = source
        return f"{{{name}:String}}"

    if col.op == "count":
        if not nullable:
            return f"{prefix}requests"
        return f"{prefix}src_n[{key(nullable[0])}]" if len(nullable) == 1 else None
    if col.source in ALWAYS_PRESENT:
        if not nullable:
            return f"{prefix}{ALWAYS_PRESENT[col.source]}"  # error² = error
        if col.op == "sum" and col.source == COST and len(nullable) == 1:
            return f"{prefix}src_cost[{key(nullable[0])}]"
        return None
    if nullable != [col.source]:
        return None
    return f"{prefix}{'src_sq' if col.op == 'sumsq' else 'src_sum'}[{key(col.summed)}]"


def rollup_unsupported(p: UnitPlan, spec: Any, builtin: tuple[str, ...] = UNIT_COLUMNS) -> str | None:
    """Why the rollup cannot serve this plan (None: it can, given no pre-``start`` requests).
    ``builtin``: the columns the rollup stores by name."""
    if getattr(spec, "end", None):
        return "an analysis end (the rollup holds all-time sums; requests after the end would count)"
    if spec.request_randomized:
        return "request-randomized (each request is its own unit)"
    for h in p.histograms:
        if h.key not in HISTOGRAM_SOURCES:
            return f"histogram of {h.key} (a quantile of a custom source)"
    scratch: dict[str, Any] = {}
    for c in (*p.columns, *p.pre_columns):
        if c.name not in builtin and rollup_column(c, scratch) is None:
            return f"column {c.name} (needs two nullable sources on the same request)"
    return None


def rollup_select(p: UnitPlan, builtin: tuple[str, ...], params: dict[str, Any], prefix: str = "") -> str:
    """The plan's in-period columns over rollup rows (call after :func:`rollup_unsupported`);
    ``builtin``: the columns the rollup stores by name (``UNIT_COLUMNS``)."""
    out = []
    for c in p.columns:
        expr = f"{prefix}{c.name}" if c.name in builtin else rollup_column(c, params, prefix)
        out.append(f"toFloat64({expr}) AS `{c.name}`")
    return ", ".join(out)
