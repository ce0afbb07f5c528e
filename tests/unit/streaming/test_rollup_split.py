"""The loader's rollup step, its pure part: which rows go to which lookup table, which (unit,
hour) rows a batch touches, which traces need their unit looked up; the hour of a request."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ablab.streaming.loader.rows import RAW_COLUMNS
from ablab.streaming.store.rollup import HOUR_SQL, ROLLUP_EVENT_COLUMNS, ROLLUP_TRACE_COLUMNS, hour_of, split_batch

TS = datetime(2026, 12, 1, tzinfo=UTC)


def _row(**values):
    base = dict.fromkeys(RAW_COLUMNS, None)
    base.update(event_id="e", type="inference", ts=TS, trace_id="", experiment="", variant="", unit_id="")
    base.update(values)
    return tuple(base[c] for c in RAW_COLUMNS)


def test_split_batch_routes_rows_and_finds_touched_units():
    rows = [
        _row(event_id="i1", trace_id="t1", experiment="x", variant="a", unit_id="u1", e2e_ms=10.0, error=None),
        _row(event_id="i2", trace_id="t2", experiment="x", variant="b", unit_id="u2", e2e_ms=12.0, error="timeout"),
        _row(event_id="f1", type="feedback", trace_id="t9", correct=1),
        _row(event_id="c1", type="cost", trace_id="t1", cost_usd=0.5),
        _row(event_id="x1", type="exposure", experiment="x", variant="a", unit_id="u3"),
        _row(event_id="r1", type="rum", trace_id="t1", e2e_ms=11.0),
    ]
    events, traces, units, lookups = split_batch(rows)
    assert [dict(zip(ROLLUP_EVENT_COLUMNS, r))["is_error"] for r in events] == [0, 1]
    assert {dict(zip(ROLLUP_EVENT_COLUMNS, r))["unit_id"] for r in events} == {"u1", "u2"}
    facts = [dict(zip(ROLLUP_TRACE_COLUMNS, r)) for r in traces]
    assert [(f["type"], f["trace_id"]) for f in facts] == [("inference", "t1"), ("inference", "t2"), ("feedback", "t9"), ("cost", "t1")]
    assert facts[2]["correct"] == 1 and facts[2]["cost_usd"] is None
    assert facts[3]["cost_usd"] == 0.5 and facts[3]["correct"] is None
    assert facts[0]["experiment"] == "x" and facts[0]["unit_id"] == "u1"
    hour = hour_of(TS)
    assert dict(units) == {"x": {("u1", hour), ("u2", hour)}}  # exposures and RUM touch no unit's rollup
    assert lookups == {"t9", "t1"}  # labels and billing: their unit is looked up by trace


def test_hour_of_rounds_down_and_reads_naive_times_as_utc():
    assert hour_of(datetime(1970, 1, 1, 0, 59, 59, 999000, tzinfo=UTC)) == 0
    assert hour_of(datetime(1970, 1, 1, 1, tzinfo=UTC)) == 1
    assert hour_of(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)) == -1  # down, not toward zero
    assert hour_of(datetime(2026, 12, 1, 10, 30)) == hour_of(datetime(2026, 12, 1, 10, 30, tzinfo=UTC))
    east = datetime(2026, 12, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))  # 10:30 UTC
    assert hour_of(east) == hour_of(datetime(2026, 12, 1, 10, 0, tzinfo=UTC))


@pytest.mark.parametrize("ts", [
    datetime(1900, 1, 1, 0, 30, tzinfo=UTC), datetime(1969, 12, 31, 23, 0, 0, 1000, tzinfo=UTC),
    datetime(1970, 1, 1, tzinfo=UTC), datetime(2026, 12, 1, 10, 59, 59, 999000, tzinfo=UTC),
    datetime(2106, 2, 7, 6, 30, tzinfo=UTC), datetime(2299, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
])
def test_hour_of_is_the_stores_hour(memory_db, ts):
    """The loader's (unit, hour) pairs must name the rows the store keys by its own hour."""
    store = memory_db.query(f"SELECT {HOUR_SQL.format(ts='t')} FROM (SELECT {{ts:DateTime64(3, 'UTC')}} AS t)",
                            parameters={"ts": ts}).result_rows[0][0]
    assert store == hour_of(ts)
