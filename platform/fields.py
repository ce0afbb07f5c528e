"""The field catalogue: every measured field of an event, declared once.

A *field* is a number a producer measures and puts on an event (``e2e_ms``, ``cost_usd``,
a feedback ``score``…). Its declaration says what it is (type, unit, physical bounds,
which events carry it), which way is better, how it is summarised per 10 s window and per
randomization unit, whether an SLO may bound it, and how a dashboard labels it.

Everything else that names a field takes it from here or is checked against it by a test
(``tests/unit/platform/test_fields.py`` for the Flink SQL and the column tuples,
``tests/integration/streaming/test_catalogue.py`` for ``DESCRIBE TABLE`` of a migrated
store): the event models' bounds (``ablab.platform.events.FIELD_BOUNDS`` is a view of
this table), the Flink source, screening and window columns, the ClickHouse tables, the
loader's column tuples, the timeseries maps and the dashboard labels. Adding a field is one
entry here plus the migration and the SQL the checks then ask for.

The results side derives from it too (:func:`unit_columns`, :data:`SLO_FIELDS`,
:data:`LATENCY_FIELDS`, :data:`HISTOGRAM_FIELDS`, :data:`RANK_TESTED`,
:func:`lower_is_better_fields`, :func:`quantile_metric`…): the per-unit columns and metric
definitions of ``ablab.platform.stats.metrics``, the paired (shadow) metrics, ``ablab
analyze``'s columns, the dashboards' labels, metric orders and defaults. The few roles a
field plays by name (:data:`HEADLINE_LATENCY`, :data:`SLA_LATENCY`, :data:`COST_FIELD`) are
named here once and checked against the table at import.
``tests/unit/platform/test_fields_catalogue.py`` adds a field to a copy of this table and
shows each of them pick it up.

Statistics have one naming scheme: ``<field>_<stat>``, the field's full name and the
statistic (``e2e_ms_sum``, ``e2e_ms_sumsq``, ``tpot_ms_n``, ``e2e_ms_p95``), in the window
table (:func:`window_column`), the timeseries metrics and the per-unit rollup
(``e2e_ms_sum``, ``e2e_ms_n``; ``ablab.platform.stats.metrics``). Migration 0012 renamed the
window table's older short names (:data:`LEGACY_WINDOW_NAMES`).

Pure declarations: no I/O, no imports from the streaming or storage layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

DAY_S = 86_400.0
MAX_COST_USD = 1_000_000.0
"""Ceiling of one cost: a request, or one billed resource over its period."""
MAX_TOKENS = 10_000_000

FieldType = Literal["float", "int"]
Direction = Literal["lower", "higher", "none"]
WindowStat = Literal["sum", "sumsq", "n", "p50", "p95", "p99"]
UnitStat = Literal["sum", "n", "sq"]
EventType = Literal["exposure", "inference", "rum", "feedback", "cost"]

WINDOW_QUANTILES: tuple[WindowStat, ...] = ("p50", "p95", "p99")


@dataclass(frozen=True, slots=True)
class Field:
    """One measured field.

    ``window``: statistics the Flink job emits per 10 s window and variant (empty: not
    windowed), named by :func:`window_column`. ``window_count``: the count its mean divides
    by (``n`` = every request; the field's own ``<field>_n`` when it may be absent). ``unit``: per-unit statistics of the rollup (empty: not rolled up).
    ``nullable``: the field may be absent on an event that carries it.
    ``per_unit`` on the results side: ``sum`` and ``n`` make the field a results metric (its
    mean: ``<f>_sum / <f>_n``, or ``/ requests`` without ``n``); ``sq`` (Σ value², the design
    effect of a quantile) also makes its quantiles (:data:`RESULT_QUANTILES`) results metrics
    over a per-variant histogram. ``paired``: compared request by request between a shadow
    and its primary (an inference field). ``otel``: the OpenTelemetry GenAI span attribute
    the gateway sets from it, and the factor from the field's unit to the attribute's.
    ``description``: the one-sentence tooltip and reference text.
    """

    name: str
    type: FieldType
    unit: str
    direction: Direction
    lo: float
    hi: float
    why: str
    events: tuple[EventType, ...]
    label: str
    unit_kind: str  # the dashboard formatter: ms, usd, num, pct
    window: tuple[WindowStat, ...] = ()
    window_count: str = "n"
    per_unit: tuple[UnitStat, ...] = ()
    slo: bool = False
    nullable: bool = False
    late: bool = False  # a late event keeps it (late_events), so its window is exact
    flink: bool = False  # read by the Flink job from the inference topic
    description: str = field(default="")
    paired: bool = False
    otel: tuple[str, float] | None = None

    @property
    def bounds_text(self) -> str:
        return f"{self.lo:,.0f}..{self.hi:,.0f} {self.unit}".rstrip()


_LATENCY = "a request lasts at most a day"
_SUMS: tuple[WindowStat, ...] = ("sum", "sumsq")

FIELDS: Mapping[str, Field] = MappingProxyType({f.name: f for f in (
    Field("e2e_ms", "float", "ms", "lower", 0.0, DAY_S * 1000, _LATENCY, ("inference", "rum"),
          "Latency (mean)", "ms", window=(*_SUMS, *WINDOW_QUANTILES),
          per_unit=("sum", "n", "sq"), slo=True, late=True, flink=True, paired=True,
          description="End-to-end latency: from the request's arrival to its last token (ms)."),
    Field("ttft_ms", "float", "ms", "lower", 0.0, DAY_S * 1000, _LATENCY, ("inference",),
          "TTFT (mean)", "ms", window=(*_SUMS, *WINDOW_QUANTILES),
          per_unit=("sum", "n", "sq"), slo=True, late=True, flink=True, paired=True,
          otel=("gen_ai.client.operation.time_to_first_chunk", 1e-3),
          description="Time to first token: from the request's arrival to its first output token (ms)."),
    Field("tpot_ms", "float", "ms", "lower", 0.0, DAY_S * 1000, "a token takes at most a day", ("inference",),
          "TPOT (mean)", "ms", window=("n", *_SUMS), window_count="tpot_ms_n",
          per_unit=("sum", "n"), slo=True, nullable=True, late=True, flink=True, paired=True,
          description="Time per output token after the first (ms); absent when a request generates one token."),
    Field("cost_usd", "float", "USD", "lower", 0.0, MAX_COST_USD, f"one cost record is at most {MAX_COST_USD:,.0f} USD",
          ("inference", "cost"), "Cost per request", "usd", window=_SUMS,
          per_unit=("sum",), late=True, flink=True, paired=True,
          description="Cost of a request (USD): the worker's estimate, replaced by billing where it arrived."),
    Field("prompt_tokens", "int", "tokens", "none", 0, MAX_TOKENS, "no context holds more than 10 M tokens",
          ("inference",), "Prompt tokens", "num", window=_SUMS, late=True, flink=True, paired=True,
          otel=("gen_ai.usage.input_tokens", 1.0), description="Tokens of the request's prompt."),
    Field("output_tokens", "int", "tokens", "none", 0, MAX_TOKENS, "no request generates more than 10 M tokens",
          ("inference",), "Output tokens", "num", window=_SUMS, late=True, flink=True, paired=True,
          otel=("gen_ai.usage.output_tokens", 1.0), description="Tokens the request generated."),
    Field("device_s", "float", "s", "lower", 0.0, DAY_S, "a request holds a device for at most a day",
          ("inference",), "Device time", "num",
          description="Device-seconds attributed to the request."),
    Field("score", "float", "", "higher", -1e9, 1e9, "a label score is a bounded grade", ("feedback",),
          "Score", "num", nullable=True,
          description="A label's grade of the answer (judge or human), the trace's latest."),
)})
"""Every measured field, in the order the event models and the tables list them."""


def fields_of(event_type: str) -> tuple[Field, ...]:
    """The fields events of ``event_type`` carry."""
    return tuple(f for f in FIELDS.values() if event_type in f.events)


def window_column(name: str, stat: WindowStat) -> str:
    """The window-table column of statistic ``stat`` of field ``name`` (one naming scheme)."""
    f = FIELDS[name]
    if stat not in f.window:
        raise KeyError(f"{name} has no window statistic {stat!r}; it has {', '.join(f.window) or 'none'}")
    return f"{name}_{stat}"


def unit_column(name: str, stat: UnitStat) -> str:
    f = FIELDS[name]
    if stat not in f.per_unit:
        raise KeyError(f"{name} has no per-unit statistic {stat!r}")
    return f"{name}_{stat}"


LEGACY_WINDOW_NAMES: Mapping[str, str] = MappingProxyType({
    **{f"{short}_{stat}": f"{name}_{stat}"
       for short, name in (("e2e", "e2e_ms"), ("ttft", "ttft_ms"))
       for stat in ("sum", "sumsq", "p50", "p95", "p99")},
    **{f"tpot_{stat}": f"tpot_ms_{stat}" for stat in ("n", "sum", "sumsq")},
    **{f"cost_{stat}": f"cost_usd_{stat}" for stat in ("sum", "sumsq")},
})
"""Window-statistic names before migration 0012 → today's. The loader still reads a window
record written by a job started before the upgrade."""

WINDOWED: tuple[Field, ...] = tuple(f for f in FIELDS.values() if f.window)
WINDOW_KEY = ("experiment", "variant", "window_start", "window_end")
WINDOW_COUNTS = ("n", "errors")


def window_value_columns() -> tuple[str, ...]:
    """The window row's statistic columns, in table order: sums (and counts) of every
    windowed field, then its quantiles."""
    sums = [window_column(f.name, s) for f in WINDOWED for s in ("n", "sum", "sumsq") if s in f.window]
    quantiles = [window_column(f.name, q) for f in WINDOWED for q in WINDOW_QUANTILES if q in f.window]
    return (*sums, *quantiles)


WINDOW_COLUMNS: tuple[str, ...] = (*WINDOW_KEY, *WINDOW_COUNTS, *window_value_columns(), "emitted_at")
"""The columns of a window row, as the Flink sink emits them and window_stats stores them."""

FLINK_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.flink)
LATE_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.late)
SLO_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.slo)
INFERENCE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields_of("inference"))
EVENT_FIELDS: tuple[str, ...] = tuple(FIELDS)
"""Fields of raw_events (each field once, whichever events carry it)."""

CLICKHOUSE_TYPES: Mapping[FieldType, str] = MappingProxyType({"float": "Float64", "int": "UInt32"})
FLINK_TYPES: Mapping[FieldType, str] = MappingProxyType({"float": "DOUBLE", "int": "BIGINT"})


def clickhouse_type(name: str) -> str:
    """The raw_events column type of field ``name`` (every field is absent on some event)."""
    return f"Nullable({CLICKHOUSE_TYPES[FIELDS[name].type]})"


def window_types() -> dict[str, tuple[str, str]]:
    """Window value column → (ClickHouse type, Flink type)."""
    out = {}
    for f in WINDOWED:
        for s in f.window:
            count = s == "n"
            out[window_column(f.name, s)] = ("UInt64", "BIGINT") if count else ("Float64", "DOUBLE")
    return out


def labels() -> dict[str, tuple[str, str]]:
    """Dashboard label and unit kind of every field, and of its windowed percentiles."""
    out = {f.name: (f.label, f.unit_kind) for f in FIELDS.values()}
    for f in WINDOWED:
        short = f.label.replace(" (mean)", "")
        for q in WINDOW_QUANTILES:
            if q in f.window:
                out[f"{f.name}_{q}"] = (f"{short} {q}", f.unit_kind)
    return out


def timeseries_mean_columns() -> dict[str, tuple[str, str, str]]:
    """metric → (count, sum, sum of squares) window columns, for every windowed field
    whose mean a window can give."""
    return {
        f.name: (f.window_count, window_column(f.name, "sum"), window_column(f.name, "sumsq"))
        for f in WINDOWED
        if "sum" in f.window and "sumsq" in f.window
    }


def timeseries_quantile_columns() -> dict[str, tuple[str, str]]:
    """metric (``e2e_ms_p95``…) → (window column, count column)."""
    return {
        f"{f.name}_{q}": (window_column(f.name, q), f.window_count)
        for f in WINDOWED
        for q in WINDOW_QUANTILES
        if q in f.window
    }


# --- what each table and sink must hold (checked by the catalogue tests) -----------------

TableKind = Literal["exact", "includes"]


def clickhouse_expected() -> dict[str, tuple[TableKind, dict[str, str]]]:
    """ClickHouse table → (how to compare, column → type) as the catalogue implies.

    ``exact``: the table's statistic columns are exactly these (key and bookkeeping columns
    aside, see :data:`CLICKHOUSE_FIXED`); ``includes``: the table holds at least these
    (other owners add columns, e.g. measures maps on raw_events).
    """
    window = {c: types[0] for c, types in window_types().items()}
    per_unit_fields = [f for f in FIELDS.values() if f.per_unit]
    rollup = {f.name: "Nullable(Float64)" for f in per_unit_fields}
    return {
        "raw_events": ("includes", {name: clickhouse_type(name) for name in EVENT_FIELDS}),
        "window_stats": ("exact", {"n": "UInt64", "errors": "UInt64", **window}),
        "late_events": ("exact", {**{name: "Nullable(Float64)" for name in LATE_FIELDS}, "is_error": "UInt8"}),
        "rollup_events": ("includes", rollup),
        "unit_stats": ("includes", {f"{f.name}_{s}": "Float64" for f in per_unit_fields for s in f.per_unit}),
    }


CLICKHOUSE_FIXED: Mapping[str, frozenset[str]] = MappingProxyType({
    "window_stats": frozenset({*WINDOW_KEY, "emitted_at", "loaded_at"}),
    "late_events": frozenset({"event_id", "type", "ts", "trace_id", "experiment", "variant", "window_start",
                              "watermark", "loaded_at"}),
})
"""Non-statistic columns of the tables compared ``exact``ly."""


def flink_expected() -> dict[str, tuple[TableKind, dict[str, str]]]:
    """Flink table (``streaming/flink/sql``) → (how to compare, column → type)."""
    window = {c: types[1] for c, types in window_types().items()}
    return {
        "inference_events": ("includes", {name: FLINK_TYPES[FIELDS[name].type] for name in FLINK_FIELDS}),
        "inference_window_sink": ("exact", {"n": "BIGINT", "errors": "BIGINT", **window}),
        "late_sink": ("includes", {name: FLINK_TYPES[FIELDS[name].type] for name in LATE_FIELDS}),
    }


FLINK_FIXED: Mapping[str, frozenset[str]] = MappingProxyType({
    "inference_window_sink": frozenset({"kind", *WINDOW_KEY, "emitted_at"}),
})


def mismatches(
    table: str, kind: TableKind, expected: Mapping[str, str], actual: Mapping[str, str],
    fixed: frozenset[str] = frozenset(),
) -> list[str]:
    """How ``actual`` (column → type, as the table or sink declares it) disagrees with the
    catalogue's ``expected``; empty when it agrees. Types compare without spaces or case."""
    def norm(t: str) -> str:
        return "".join(t.split()).lower()

    problems = []
    for column, type_ in expected.items():
        if column not in actual:
            problems.append(f"{table}: missing column {column} {type_} (declared in ablab.platform.fields)")
        elif norm(actual[column]) != norm(type_):
            problems.append(f"{table}.{column}: type {actual[column]}, the catalogue says {type_}")
    if kind == "exact":
        for column in actual:
            if column not in expected and column not in fixed:
                problems.append(f"{table}: column {column} is not in the field catalogue")
    return problems


# --- the results side: per-unit columns, metric sources, roles ---------------------------
#
# ``ablab.platform.stats.metrics`` turns these into metric definitions; the paired analysis,
# ``ablab analyze``, the registry's and the API's defaults and the dashboards read them from
# there or from here. Each is derived from the table above, in its order.

PER_UNIT_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.per_unit)
"""Fields the per-unit rollup sums (``<f>_sum``…, :func:`unit_columns`)."""
LATENCY_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.unit == "ms")
"""Per-request durations: a negative one rejects its event, and paired tests rank them."""
MEAN_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if "sum" in f.per_unit)
"""Fields whose mean per request is a built-in results metric (``<f>_sum`` over ``<f>_n``
where the field may be absent, else over every request)."""
HISTOGRAM_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if "sq" in f.per_unit)
"""Fields whose quantiles are results metrics (one histogram per variant, Σx² per unit)."""
RESULT_QUANTILES: tuple[float, ...] = (0.95, 0.99)
"""The quantiles of each :data:`HISTOGRAM_FIELDS` field that ``/results`` reports."""
RANK_TESTED: tuple[str, ...] = LATENCY_FIELDS
"""Built-in paired metrics that also get a Wilcoxon signed-rank and a sign test: latencies
are skewed, a few slow requests move a mean difference."""
PAIRED_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS.values() if f.paired)
"""Fields compared request by request between a shadow and its primary."""

AT_MOST: tuple[tuple[str, str, str], ...] = (("ttft_ms", "e2e_ms", "ttft_exceeds_e2e"),)
"""(field, bound, reject reason): on one event the field never exceeds the bound (the first
token comes no later than the last). The event models, the edge and ``ablab analyze``
reject an event that breaks it."""

HEADLINE_LATENCY = "e2e_ms"
"""The latency every request reports: the default primary metric, the results page's
headline latency and its count of a variant's requests."""
SLA_LATENCY = "ttft_ms"
"""The latency an SLA bounds by default (its p95: the allocator's constraint, the
editor's first guardrail, the demo spec's)."""
COST_FIELD = "cost_usd"
"""The cost of a request: billing replaces the worker's estimate of it, its sum over
labelled requests divided by correct ones is the cost per correct answer."""
for _role in (HEADLINE_LATENCY, SLA_LATENCY):
    if _role not in LATENCY_FIELDS or _role not in HISTOGRAM_FIELDS:
        raise ValueError(f"{_role} is not a latency with quantiles in the catalogue")
if COST_FIELD not in MEAN_FIELDS or FIELDS[COST_FIELD].unit_kind != "usd":
    raise ValueError(f"{COST_FIELD} is not a rolled-up cost in the catalogue")


def unit_columns() -> tuple[str, ...]:
    """The per-unit statistic columns of every rolled-up field, in catalogue order
    (``e2e_ms_sum, e2e_ms_n, e2e_ms_sq, …, cost_usd_sum``)."""
    return tuple(unit_column(f.name, s) for f in FIELDS.values() for s in f.per_unit)


def labeled_sum_column(name: str) -> str:
    """Σ ``name`` over a unit's labelled requests (the cost per correct answer's numerator)."""
    unit_column(name, "sum")  # a rolled-up field
    return f"labeled_{name}_sum"


def quantile_metric(name: str, q: float) -> str:
    """The name of quantile ``q`` of field ``name`` as a metric (``e2e_ms_p95``), the same in
    ``/results`` and the window table."""
    return f"{name}_p{round(q * 100)}"


SLA_METRIC = quantile_metric(SLA_LATENCY, 0.95)
"""``ttft_ms_p95``: the allocator's default constraint and the first default guardrail."""


def lower_is_better_fields() -> frozenset[str]:
    """Fields whose ``direction`` is ``lower`` (time, money): a custom metric over one is
    lower-is-better unless it says otherwise. ``none`` is neither (token counts)."""
    return frozenset(f.name for f in FIELDS.values() if f.direction == "lower")


def lower_is_better(name: str) -> bool:
    """Whether less of field ``name`` is better; a ``none`` direction counts as lower (fewer
    tokens cost less), which is how the paired analysis colours a difference."""
    return FIELDS[name].direction != "higher"


def otel_attributes() -> dict[str, tuple[str, float]]:
    """field → (OpenTelemetry GenAI span attribute, factor from the field's unit)."""
    return {f.name: f.otel for f in FIELDS.values() if f.otel is not None}


def rum_timeseries_columns() -> dict[str, tuple[str, str, str]]:
    """Client-side (RUM) means per window, joined at query time: metric ``rum_<f>`` → (count,
    sum, sum of squares) columns, for every field a RUM event carries."""
    return {f"rum_{f.name}": ("rum_n", f"rum_{f.name}_sum", f"rum_{f.name}_sumsq") for f in fields_of("rum")}


def rum_labels() -> dict[str, tuple[str, str]]:
    """Dashboard label and unit kind of each RUM metric (:func:`rum_timeseries_columns`)."""
    out = {}
    for metric in rum_timeseries_columns():
        f = FIELDS[metric.removeprefix("rum_")]
        short = f.label.replace(" (mean)", "").lower()
        out[metric] = (f"Client-side {short} (RUM)", f.unit_kind)
    return out


def descriptions() -> dict[str, str]:
    """field → its description (tooltips, reference text)."""
    return {f.name: f.description for f in FIELDS.values() if f.description}
