"""Parameterized read queries over the ClickHouse store (for the stats engine and the API).

Every value from a caller goes through clickhouse-connect ``parameters=`` (server-side
``{name:Type}`` binding); nothing is formatted into SQL. Tables are ReplacingMergeTrees,
so reads use ``FINAL``: a redelivered or replayed row is counted once even before merges.

Trace attribution: a label or a RUM event (client-side latency) is joined to its
request's inference event by ``trace_id`` and counted in *that* event's variant and 10 s
window, however late it arrived. When a request has several labels, the latest (by event
time) wins; every RUM event of a request counts (duplicates, by event_id, once).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ablab.platform.fields import (
    HEADLINE_LATENCY,
    WINDOW_QUANTILES,
    WINDOWED,
    fields_of,
    window_column,
    window_value_columns,
)

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

# Latest label per trace (correct may be null when only a score was given).
_LABELS = """
    SELECT trace_id,
           argMax(correct, ts) AS label_correct,
           argMax(score, ts)   AS label_score
    FROM raw_events FINAL
    WHERE type = 'feedback' AND correct IS NOT NULL
    GROUP BY trace_id
"""

# The fields a RUM event carries (client-side latency), per RUM event (raw_events FINAL: one
# row per event_id); /timeseries shows each as rum_<field>_sum, _sumsq and _p95.
RUM_FIELDS: tuple[str, ...] = tuple(f.name for f in fields_of("rum"))
_RUM = f"""
    SELECT trace_id, {', '.join(RUM_FIELDS)}
    FROM raw_events FINAL
    WHERE type = 'rum'
"""

# The requests: what attribution by trace_id needs (their variant and window).
_INFERENCE = """
    SELECT trace_id, variant, unit_id, ts
    FROM raw_events FINAL
    WHERE type = 'inference' AND experiment = {experiment:String}
"""


# The requests of the windows window_rows reads: the same range, so the RUM and label joins
# do not scan the experiment's whole history for a short time series.
_INFERENCE_IN_RANGE = _INFERENCE + """
      AND toStartOfInterval(ts, INTERVAL 10 SECOND) >= {start:DateTime64(3, 'UTC')}
      AND toStartOfInterval(ts, INTERVAL 10 SECOND) < {end:DateTime64(3, 'UTC')}
"""


def _rows(client: Client, sql: str, parameters: dict[str, Any]) -> list[dict[str, Any]]:
    result = client.query(sql, parameters=parameters)
    return [dict(zip(result.column_names, row)) for row in result.result_rows]


def feedback_by_window(client: Client, *, experiment: str) -> list[dict[str, Any]]:
    """Labels per (variant, window of the original request)."""
    sql = f"""
        SELECT i.variant AS variant,
               toStartOfInterval(i.ts, INTERVAL 10 SECOND) AS window_start,
               count() AS labeled, sum(l.label_correct) AS correct
        FROM ({_INFERENCE}) AS i
        INNER JOIN ({_LABELS}) AS l ON l.trace_id = i.trace_id
        GROUP BY variant, window_start
        ORDER BY window_start, variant
    """
    return _rows(client, sql, {"experiment": experiment})


# A window's on-time row (Flink's window_stats) plus the late inference events of the same
# window, added up: counts and sums add exactly, so a window ends up exact however late its
# events came (the late-data policy in streaming/flink/job.py). Window percentiles do not
# merge: they stay those of the on-time events (NaN when every event of the window was late).
def _windows_with_late_sql() -> str:
    """The window query, its columns generated from the field catalogue (one naming scheme:
    :func:`ablab.platform.fields.window_column`)."""
    outer, on_time, late = [], [], []
    for f in WINDOWED:
        col = f.name
        for stat in f.window:
            name = window_column(f.name, stat)
            on_time.append(name)
            if stat in WINDOW_QUANTILES:
                outer.append(f"if(countIf(on_time) > 0, anyIf({name}, on_time), nan) AS {name}")
                late.append("nan")
                continue
            outer.append(f"sum({name}) AS {name}")
            value = f"assumeNotNull({col})"
            late.append({
                "n": f"countIf({col} IS NOT NULL)",
                "sum": f"sumIf({value}, {col} IS NOT NULL)",
                "sumsq": f"sumIf({value} * {value}, {col} IS NOT NULL)",
            }[stat])
    return f"""
    SELECT experiment, variant, window_start, max(window_end) AS window_end,
           sum(n) AS n, sum(late_n) AS late_n, sum(errors) AS errors,
           {", ".join(outer)},
           max(emitted_at) AS emitted_at, max(loaded_at) AS loaded_at
    FROM (
        SELECT toString(experiment) AS experiment, toString(variant) AS variant, window_start, window_end,
               n, toUInt64(0) AS late_n, errors, {", ".join(on_time)}, emitted_at, loaded_at, 1 AS on_time
        FROM window_stats FINAL
        WHERE experiment = {{experiment:String}}
          AND window_start >= {{start:DateTime64(3, 'UTC')}} AND window_start < {{end:DateTime64(3, 'UTC')}}
        UNION ALL
        SELECT toString(experiment), toString(variant), window_start, window_start + INTERVAL 10 SECOND,
               count(), count(), countIf(is_error = 1), {", ".join(late)}, max(loaded_at), max(loaded_at), 0
        FROM late_events FINAL
        WHERE type = 'inference' AND experiment = {{experiment:String}}
          AND window_start >= {{start:DateTime64(3, 'UTC')}} AND window_start < {{end:DateTime64(3, 'UTC')}}
        GROUP BY experiment, variant, window_start
    )
    GROUP BY experiment, variant, window_start
"""


_WINDOWS_WITH_LATE = _windows_with_late_sql()


_WINDOW_VALUES = ", ".join(f"w.{c} AS {c}" for c in window_value_columns())
_RUM_STATS = ", ".join(
    f"sum(c.{f}) AS {f}_sum, sum(c.{f} * c.{f}) AS {f}_sumsq, quantileExactInclusive(0.95)(c.{f}) AS {f}_p95" for f in RUM_FIELDS
)
_RUM_OUT = ", ".join(f"r.{f}_{s} AS rum_{f}_{s}" for f in RUM_FIELDS for s in ("sum", "sumsq", "p95"))


def window_rows(
    client: Client, *, experiment: str, start: datetime | None = None, end: datetime | None = None,
) -> list[dict[str, Any]]:
    """The 10 s windows of an experiment (for ``/timeseries``), oldest first: Flink's window
    row with the window's late events folded in (``late_n`` of its ``n`` arrived late), the
    RUM columns (``rum_*``) and the labels attributed to each window (``labeled``, ``correct``)."""
    sql = f"""
        SELECT w.experiment AS experiment, w.variant AS variant, w.window_start AS window_start,
               w.window_end AS window_end, w.n AS n, w.late_n AS late_n, w.errors AS errors,
               {_WINDOW_VALUES},
               r.n AS rum_n, {_RUM_OUT},
               f.labeled AS labeled, f.correct AS correct,
               w.emitted_at AS emitted_at, w.loaded_at AS loaded_at
        FROM ({_WINDOWS_WITH_LATE}) AS w
        LEFT JOIN (
            SELECT i.variant AS variant, toStartOfInterval(i.ts, INTERVAL 10 SECOND) AS window_start,
                   count() AS n, {_RUM_STATS}
            FROM ({_INFERENCE_IN_RANGE}) AS i INNER JOIN ({_RUM}) AS c ON c.trace_id = i.trace_id
            GROUP BY variant, window_start
        ) AS r ON r.variant = w.variant AND r.window_start = w.window_start
        LEFT JOIN (
            SELECT i.variant AS variant, toStartOfInterval(i.ts, INTERVAL 10 SECOND) AS window_start,
                   count() AS labeled, sum(l.label_correct) AS correct
            FROM ({_INFERENCE_IN_RANGE}) AS i INNER JOIN ({_LABELS}) AS l ON l.trace_id = i.trace_id
            GROUP BY variant, window_start
        ) AS f ON f.variant = w.variant AND f.window_start = w.window_start
        ORDER BY window_start, variant
        SETTINGS join_use_nulls = 1
    """
    return _rows(client, sql, {
        "experiment": experiment,
        "start": start or datetime(1970, 1, 1),
        "end": end or datetime(2200, 1, 1),
    })


def late_events(client: Client, *, experiment: str) -> list[dict[str, Any]]:
    sql = f"""
        SELECT event_id, type, ts, trace_id, variant, window_start, watermark, {HEADLINE_LATENCY}
        FROM late_events FINAL WHERE experiment = {{experiment:String}} ORDER BY ts, event_id
    """
    return _rows(client, sql, {"experiment": experiment})


def reconciliation(client: Client, *, experiment: str) -> dict[str, Any]:
    """raw inference events = Σ window n + late inference events (the late-data policy).

    ``balanced`` is true when the identity holds exactly.
    """
    sql = """
        SELECT
            (SELECT count() FROM raw_events FINAL WHERE type = 'inference' AND experiment = {experiment:String}) AS raw,
            (SELECT sum(n) FROM window_stats FINAL WHERE experiment = {experiment:String}) AS windowed,
            (SELECT count() FROM late_events FINAL WHERE type = 'inference' AND experiment = {experiment:String}) AS late
    """
    row = _rows(client, sql, {"experiment": experiment})[0]
    raw, windowed, late = int(row["raw"]), int(row["windowed"] or 0), int(row["late"])
    return {"raw": raw, "windowed": windowed, "late": late, "balanced": raw == windowed + late}


def dead_letter_counts(client: Client) -> dict[str, int]:
    """Refused records per offending field."""
    result = client.query("SELECT field, count() FROM dead_letters FINAL GROUP BY field ORDER BY field")
    return {field: int(count) for field, count in result.result_rows}
