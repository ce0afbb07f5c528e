"""The rollup's two levels on the real engine (chDB, in memory): a batch rewrites only the
(unit, hour) rows it touched, each unit is the sum of its hours, a late label lands in its
request's hour, and an hour computed under other SLOs leaves its unit stale until the
maintenance step recomputes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ablab.platform.stats.unit_agg import rollup_key
from ablab.streaming.loader.rows import RAW_COLUMNS
from ablab.streaming.store import apply_ddl, rollup

T0 = datetime(2026, 12, 1, 10, 15, tzinfo=UTC)


@pytest.fixture
def store(memory_db):
    apply_ddl(memory_db)
    return memory_db


def _request(exp: str, event_id: str, ts: datetime, e2e_ms: float, unit: str = "u1") -> tuple:
    row = dict.fromkeys(RAW_COLUMNS, None)
    row.update(event_id=event_id, type="inference", ts=ts, trace_id=f"t-{event_id}", experiment=exp, variant="a",
               unit_id=unit, e2e_ms=e2e_ms, ttft_ms=10.0, cost_usd=0.001, measures={}, dims={})
    return tuple(row[c] for c in RAW_COLUMNS)


def _label(event_id: str, ts: datetime, correct: int) -> tuple:
    row = dict.fromkeys(RAW_COLUMNS, None)
    row.update(event_id=f"f-{event_id}", type="feedback", ts=ts, trace_id=f"t-{event_id}", experiment="", variant="",
               unit_id="", correct=correct, measures={}, dims={})
    return tuple(row[c] for c in RAW_COLUMNS)


def _unit(store, exp: str) -> dict:
    names = ["requests", "e2e_ms_sum", "labeled", "correct", "good", "slo_key", "min_ts", "max_ts"]
    rows = store.query(f"SELECT {', '.join(names)} FROM unit_stats FINAL WHERE experiment = {{e:String}}",
                       parameters={"e": exp}).result_rows
    assert len(rows) == 1
    return dict(zip(names, rows[0]))


def _hours(store, exp: str) -> dict[int, tuple]:
    rows = store.query("SELECT hour, requests, labeled, computed_at FROM unit_hour_stats FINAL "
                       "WHERE experiment = {e:String} ORDER BY hour", parameters={"e": exp}).result_rows
    return {h: rest for h, *rest in rows}


def test_a_unit_is_the_sum_of_its_hours_and_a_late_label_rewrites_only_its_requests_hour(store):
    later = T0 + timedelta(hours=1)
    rollup.feed(store, [_request("hx", "r1", T0, 100.0), _request("hx", "r2", later, 300.0)])
    hours = _hours(store, "hx")
    assert sorted(hours) == [rollup.hour_of(T0), rollup.hour_of(later)] and all(h[0] == 1 for h in hours.values())
    unit = _unit(store, "hx")
    assert (unit["requests"], unit["e2e_ms_sum"], unit["labeled"]) == (2, 400.0, 0)
    assert unit["min_ts"].replace(tzinfo=UTC) == T0 and unit["max_ts"].replace(tzinfo=UTC) == later

    # two hours later the label of the first request arrives: only its request's hour is rewritten
    done = rollup.feed(store, [_label("r1", T0 + timedelta(hours=3), 1)])
    assert done == {"hx": 1}
    after = _hours(store, "hx")
    assert after[rollup.hour_of(T0)][1] == 1 and after[rollup.hour_of(T0)][2] > hours[rollup.hour_of(T0)][2]
    assert after[rollup.hour_of(later)] == hours[rollup.hour_of(later)]  # untouched
    unit = _unit(store, "hx")
    assert (unit["requests"], unit["e2e_ms_sum"], unit["labeled"], unit["correct"]) == (2, 400.0, 1, 1)


def test_an_hour_computed_under_other_slos_leaves_its_unit_stale_until_maintenance(store):
    later = T0 + timedelta(hours=1)
    assert rollup.ensure_fresh(store, "hs", {"e2e_ms": 200.0}) == {"slo": 0, "missing": 0}
    rollup.feed(store, [_request("hs", "r1", T0, 100.0), _request("hs", "r2", later, 300.0)])
    assert _unit(store, "hs")["good"] == 1

    rollup.set_slos(store, "hs", {"e2e_ms": 500.0})  # the SLOs change; the maintenance step has not run
    rollup.feed(store, [_request("hs", "r3", later + timedelta(minutes=5), 250.0)])  # touches the later hour only
    unit = _unit(store, "hs")
    assert unit["requests"] == 3 and unit["slo_key"] == ""  # the earlier hour's `good` is under the old SLOs

    assert rollup.ensure_fresh(store, "hs", {"e2e_ms": 500.0}) == {"slo": 1, "missing": 0}
    unit = _unit(store, "hs")
    assert unit["good"] == 3 and unit["slo_key"] == rollup_key({"e2e_ms": 500.0})
