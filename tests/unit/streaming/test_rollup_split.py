"""The loader's rollup step, its pure part: which rows go to which lookup table, which units
a batch touches, which traces need their unit looked up; the SLO key."""

from datetime import UTC, datetime

from ablab.streaming.loader.rows import RAW_COLUMNS
from ablab.streaming.store.rollup import ROLLUP_EVENT_COLUMNS, ROLLUP_TRACE_COLUMNS, split_batch

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
    assert dict(units) == {"x": {"u1", "u2"}}  # exposures and RUM touch no unit's rollup
    assert lookups == {"t9", "t1"}  # labels and billing: their unit is looked up by trace
