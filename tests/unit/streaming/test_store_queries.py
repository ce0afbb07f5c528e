"""The parameterized queries on the real ClickHouse engine (chDB in memory), with rows
routed exactly as the loader routes them, each inserted twice (a redelivery)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ablab.platform.analytics.results import aggregates_from_raw
from ablab.platform.stats.spec import parse_spec
from ablab.streaming.loader.rows import TABLE_COLUMNS, Routed, route
from ablab.streaming.store import apply_ddl, queries
from ablab.streaming.store.reads import StoreReads

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def _ts(seconds: float) -> str:
    return (BASE + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _inference(i: int, *, seconds: float, variant: str, unit: str, e2e: float, error: str | None = None) -> dict:
    return {"v": 1, "type": "inference", "event_id": f"e{i}", "ts": _ts(seconds), "trace_id": f"t{i}",
            "experiment": "x", "variant": variant, "unit_id": unit, "ttft_ms": 1.0, "e2e_ms": e2e,
            "tpot_ms": None, "prompt_tokens": 3, "output_tokens": 1, "device_s": 0.5, "cost_usd": 0.25,
            "price_version": "p", "strategy": "s", "error": error}


@pytest.fixture
def client(memory_db):
    apply_ddl(memory_db)
    return memory_db


def _load(client, records: list[tuple[str, dict]]) -> None:
    rows: dict[str, list] = {}
    for offset, (topic, value) in enumerate(records):
        routed = route(topic=topic, value=json.dumps(value).encode(), partition=0, offset=offset,
                       windows_topic="w")
        assert isinstance(routed, Routed), routed
        rows.setdefault(routed.table, []).append(routed.row)
    for table, batch in rows.items():
        for _ in range(2):  # redelivered: must count once
            client.insert(table, batch, column_names=list(TABLE_COLUMNS[table]))


def test_per_unit_aggregates_count_each_event_once_and_attribute_late_labels(client):
    events = [
        _inference(0, seconds=1, variant="a", unit="u1", e2e=10.0),
        _inference(1, seconds=2, variant="a", unit="u1", e2e=20.0, error="timeout"),
        _inference(2, seconds=12, variant="b", unit="u2", e2e=30.0),
    ]
    labels = [  # minutes late; t0 relabelled later: the latest label wins
        {"v": 1, "type": "feedback", "event_id": "f0", "ts": _ts(300), "trace_id": "t0", "correct": 0, "source": "auto"},
        {"v": 1, "type": "feedback", "event_id": "f1", "ts": _ts(400), "trace_id": "t0", "correct": 1, "source": "human"},
        {"v": 1, "type": "feedback", "event_id": "f2", "ts": _ts(500), "trace_id": "t2", "correct": 0, "source": "human"},
    ]
    _load(client, [("i", e) for e in events] + [("f", f) for f in labels])
    # per unit, through the per-unit plan's raw scan (the one per-unit aggregation)
    spec = parse_spec({"key": "x", "unit": "user", "control": "a",
                       "variants": [{"key": "a", "weight": 0.5}, {"key": "b", "weight": 0.5}]})
    units = aggregates_from_raw(StoreReads(client), spec).units
    names = dict(client.query("SELECT DISTINCT cityHash64(unit_id), unit_id FROM raw_events").result_rows)
    rows = {(str(v), names[int(u)]): {k: units[k][i] for k in units} for i, (v, u) in enumerate(zip(units["variant"], units["unit_id"]))}
    assert rows[("a", "u1")]["requests"] == 2 and rows[("a", "u1")]["errors"] == 1
    assert rows[("a", "u1")]["e2e_ms_sum"] == 30.0 and rows[("a", "u1")]["e2e_ms_sq"] == 500.0
    assert (rows[("a", "u1")]["labeled"], rows[("a", "u1")]["correct"]) == (1, 1)
    assert (rows[("b", "u2")]["labeled"], rows[("b", "u2")]["correct"]) == (1, 0)
    assert rows[("b", "u2")]["tpot_ms_n"] == 0 and rows[("b", "u2")]["cost_usd_sum"] == 0.25
    assert aggregates_from_raw(StoreReads(client), replace(spec, key="other")).units["requests"].size == 0

    windows = {(r["variant"], r["window_start"].second): (r["labeled"], r["correct"])
               for r in queries.feedback_by_window(client, experiment="x")}
    assert windows == {("a", 0): (1, 1), ("b", 10): (1, 0)}  # the requests' windows, not the labels'


def test_window_rows_and_reconciliation(client):
    window = {"kind": "inference", "experiment": "x", "variant": "a", "window_start": _ts(0), "window_end": _ts(10),
              "n": 2, "errors": 0, "tpot_ms_n": 0, "emitted_at": _ts(12)}
    for name in TABLE_COLUMNS["window_stats"]:
        window.setdefault(name, 1.5)
    # RUM is attributed by trace_id to its request's window and variant, however late it
    # arrives (t0 at 300 s, two minutes after its window). t9's request is late (not in n)
    # but its window exists, so its RUM counts there too, as labels do; "nobody" matches no request.
    rum = [{"v": 1, "type": "rum", "event_id": f"r{i}", "ts": _ts(at), "trace_id": trace, "e2e_ms": e2e}
           for i, (trace, at, e2e) in enumerate([("t0", 300, 9.0), ("t1", 4, 3.0), ("t9", 5, 6.0), ("nobody", 1, 99.0)])]
    late = {"kind": "late", "event_type": "inference", "event_id": "e9", "trace_id": "t9", "experiment": "x",
            "variant": "a", "ts": _ts(3), "watermark": _ts(60), "e2e_ms": 7.0, "ttft_ms": 2.0, "tpot_ms": 4.0,
            "cost_usd": 0.5, "prompt_tokens": 3, "output_tokens": 2, "is_error": 1}
    # every event of window 20-30 s came late: the window exists from its late rows alone
    only_late = {**late, "event_id": "e8", "trace_id": "t8", "ts": _ts(25), "e2e_ms": 11.0, "is_error": 0}
    events = [_inference(i, seconds=i + 1, variant="a", unit="u", e2e=5.0) for i in range(2)]
    events.append(_inference(9, seconds=3, variant="a", unit="u", e2e=7.0))
    events.append(_inference(8, seconds=25, variant="a", unit="u", e2e=11.0))
    _load(client, [("w", window), ("w", late), ("w", only_late)] + [("i", e) for e in events] + [("r", e) for e in rum])

    rows = queries.window_rows(client, experiment="x")
    assert len(rows) == 2
    # the late event is folded into its own window: n, sums and errors include it, late_n says so
    assert rows[0]["n"] == 3 and rows[0]["late_n"] == 1 and rows[0]["errors"] == 1 and rows[0]["rum_n"] == 3
    assert (rows[0]["e2e_ms_sum"], rows[0]["ttft_ms_sum"], rows[0]["tpot_ms_n"], rows[0]["tpot_ms_sum"]) == (8.5, 3.5, 1, 5.5)
    assert (rows[0]["e2e_ms_sumsq"], rows[0]["cost_usd_sum"], rows[0]["output_tokens_sum"]) == (50.5, 2.0, 3.5)
    assert rows[0]["e2e_ms_p95"] == 1.5  # percentiles stay the on-time events' (they do not merge)
    assert (rows[1]["n"], rows[1]["late_n"], rows[1]["e2e_ms_sum"]) == (1, 1, 11.0) and math.isnan(rows[1]["e2e_ms_p95"])
    assert (rows[0]["rum_e2e_ms_sum"], rows[0]["rum_e2e_ms_sumsq"]) == (18.0, 126.0)
    assert rows[0]["rum_e2e_ms_p95"] == pytest.approx(8.7)  # linear interpolation of 3, 6, 9
    assert rows[0]["labeled"] is None  # no labels yet
    assert queries.window_rows(client, experiment="x", start=BASE + timedelta(seconds=30)) == []
    assert queries.reconciliation(client, experiment="x") == {"raw": 4, "windowed": 2, "late": 2, "balanced": True}
    assert [r["event_id"] for r in queries.late_events(client, experiment="x")] == ["e9", "e8"]


def test_user_input_is_bound_not_formatted(client):
    _load(client, [("i", _inference(0, seconds=1, variant="a", unit="u", e2e=1.0))])
    hostile = "x' OR 1=1 --"
    assert queries.feedback_by_window(client, experiment=hostile) == []
    assert queries.window_rows(client, experiment=hostile) == []
    assert queries.reconciliation(client, experiment=hostile)["raw"] == 0
