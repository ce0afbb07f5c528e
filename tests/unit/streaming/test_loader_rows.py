"""Routing of Kafka records to ClickHouse rows, and refusals with the field named."""

from __future__ import annotations

import json
import math

import pytest

from ablab.platform.events import MAX_EVENT_BYTES, Rejection
from ablab.streaming.loader.rows import RAW_COLUMNS, WINDOW_COLUMNS, Routed, route

WINDOWS = "ablab.windows"


def _inference(**overrides):
    event = {"v": 1, "type": "inference", "event_id": "e1", "ts": "2026-01-01T00:00:01.250Z", "trace_id": "t1",
             "experiment": "exp", "variant": "a", "unit_id": "u1", "ttft_ms": 10.0, "e2e_ms": 50.0, "tpot_ms": 2.0,
             "prompt_tokens": 12, "output_tokens": 21, "device_s": 0.5, "cost_usd": 0.001, "price_version": "p1",
             "strategy": "s1"}
    event.update(overrides)
    return json.dumps(event).encode()


def _window(**overrides):
    row = {name: 1.0 for name in WINDOW_COLUMNS}
    row.update({"kind": "inference", "experiment": "exp", "variant": "a", "n": 3, "errors": 0, "tpot_ms_n": 2,
                "window_start": "2026-01-01T00:00:00Z", "window_end": "2026-01-01T00:00:10Z",
                "emitted_at": "2026-01-01T00:00:12.345Z"})
    row.update(overrides)
    return json.dumps(row).encode()


def _route(topic, value, known=None):
    return route(topic=topic, value=value, partition=2, offset=41, windows_topic=WINDOWS, known_experiments=known)


def test_a_valid_inference_event_becomes_a_raw_row():
    routed = _route("ablab.inference", _inference())
    assert isinstance(routed, Routed) and routed.table == "raw_events"
    row = dict(zip(RAW_COLUMNS, routed.row))
    assert row["event_id"] == "e1" and row["type"] == "inference" and row["e2e_ms"] == 50.0
    assert row["ts"].isoformat() == "2026-01-01T00:00:01.250000+00:00"
    assert (row["kafka_partition"], row["kafka_offset"]) == (2, 41)
    assert json.loads(row["payload"])["trace_id"] == "t1"


def test_measures_dims_and_a_score_only_label_reach_their_columns():
    row = dict(zip(RAW_COLUMNS, _route("ablab.inference", _inference(
        measures={"tool_calls": 3, "itl_ms": 4.5}, dims={"domain": "code"})).row))
    assert row["measures"] == {"tool_calls": 3, "itl_ms": 4.5} and row["dims"] == {"domain": "code"}
    plain = dict(zip(RAW_COLUMNS, _route("ablab.inference", _inference()).row))
    assert plain["measures"] == {} and plain["dims"] == {}  # empty maps, never NULL
    label = {"v": 1, "type": "feedback", "event_id": "f1", "ts": "2026-01-01T00:00:02Z", "trace_id": "t1", "score": 7.5,
             "source": "judge"}
    routed = _route("ablab.feedback", json.dumps(label).encode())
    assert isinstance(routed, Routed), routed
    row = dict(zip(RAW_COLUMNS, routed.row))
    assert row["score"] == 7.5 and row["correct"] is None


@pytest.mark.parametrize(
    ("value", "field", "text"),
    [
        (b"{not json", "$", "malformed JSON"),
        (_inference(e2e_ms="fast"), "e2e_ms", "number"),
        (_inference(prompt_tokens=True), "prompt_tokens", "integer"),
        (_inference(ttft_ms=90.0), "ttft_ms", "exceeds"),
        (_inference(surprise=1), "surprise", "unknown field"),
        (b"x" * (MAX_EVENT_BYTES + 1), "$", "limit"),
        (None, "$", "tombstone"),
    ],
)
def test_bad_raw_records_are_refused_with_the_field_named(value, field, text):
    refused = _route("ablab.inference", value)
    assert isinstance(refused, Rejection)
    assert refused.field == field and text in refused.message


def test_unknown_experiment_is_refused_only_when_experiments_are_known():
    assert isinstance(_route("ablab.inference", _inference(experiment="ghost")), Routed)
    refused = _route("ablab.inference", _inference(experiment="ghost"), known={"exp"})
    assert refused == Rejection("experiment", "unknown experiment 'ghost'")
    assert isinstance(_route(WINDOWS, _window(experiment="ghost"), known={"exp"}), Rejection)


def test_window_rows_are_checked_field_by_field():
    routed = _route(WINDOWS, _window())
    assert isinstance(routed, Routed) and routed.table == "window_stats"
    row = dict(zip(WINDOW_COLUMNS, routed.row))
    assert row["n"] == 3 and row["window_start"].isoformat() == "2026-01-01T00:00:00+00:00"
    assert _route(WINDOWS, _window(n=-1)) == Rejection("n", "must be a non-negative integer (got -1)")
    assert _route(WINDOWS, _window(e2e_ms_sum="12")).field == "e2e_ms_sum"
    assert _route(WINDOWS, _window(window_start="yesterday")).field == "window_start"
    assert _route(WINDOWS, _window(kind="other")).field == "kind"
    missing = json.loads(_window())
    del missing["cost_usd_sum"]
    assert _route(WINDOWS, json.dumps(missing).encode()) == Rejection("cost_usd_sum", "missing")


def test_a_window_whose_values_were_all_null_has_nan_percentiles():
    routed = _route(WINDOWS, _window(e2e_ms_p95=None))
    assert math.isnan(dict(zip(WINDOW_COLUMNS, routed.row))["e2e_ms_p95"])


def test_late_rows_carry_the_window_they_missed():
    late = {"kind": "late", "event_type": "inference", "event_id": "e9", "trace_id": "t9", "experiment": "exp",
            "variant": "a", "ts": "2026-01-01T00:00:17.5Z", "watermark": "2026-01-01T00:01:00Z", "e2e_ms": 5}
    routed = _route(WINDOWS, json.dumps(late).encode())
    assert isinstance(routed, Routed) and routed.table == "late_events"
    assert routed.row[6].isoformat() == "2026-01-01T00:00:10+00:00"  # window_start
    assert _route(WINDOWS, json.dumps({**late, "event_type": "feedback"}).encode()).field == "event_type"


def test_a_record_whose_value_is_an_event_as_a_json_string_is_refused():
    # The edge refuses a string element of a batch; a producer writing to Kafka directly
    # gets the same rule here: the value must be the event object, not text that holds one.
    refused = _route("ablab.inference", json.dumps(_inference().decode()).encode())
    assert isinstance(refused, Rejection) and refused.field == "$" and "str" in refused.message


def test_a_heartbeat_is_skipped_not_stored_nor_dead_lettered():
    # issue 35: the edge's clock, written to every inference partition for the stream job's
    # watermark; the loader has nothing to store for it, and nothing is wrong with it.
    from datetime import UTC, datetime

    from ablab.platform.events import heartbeat_record
    from ablab.streaming.loader.rows import HEARTBEAT

    assert _route("ablab.inference", heartbeat_record(datetime.now(UTC))) is HEARTBEAT
    # an event cannot pass for one: a heartbeat is exactly its shape
    spoof = json.dumps({**json.loads(_inference()), "type": "heartbeat"}).encode()
    assert isinstance(_route("ablab.inference", spoof), Rejection)


def test_a_shadow_request_is_stored_apart_from_the_variants_requests():
    # issue 34: a shadow's own inference event (shadow_of = its primary's trace_id) is stored
    # with type 'shadow', so no reader of type = 'inference' counts it in a variant.
    shadow = json.loads(_inference())
    primary_trace = shadow["trace_id"]
    shadow.update(trace_id="shadow-1", event_id="shadow-1", shadow_of=primary_trace)
    row = dict(zip(RAW_COLUMNS, _route("ablab.inference", json.dumps(shadow).encode()).row))
    assert (row["type"], row["shadow_of"], row["shadow"]) == ("shadow", primary_trace, "")
    primary = dict(zip(RAW_COLUMNS, _route("ablab.inference", _inference(shadow="dropped")).row))
    assert (primary["type"], primary["shadow_of"], primary["shadow"]) == ("inference", "", "dropped")
    for bad, field in (({**shadow, "shadow": "sent"}, "shadow"), ({**shadow, "shadow_of": "shadow-1"}, "shadow_of"),
                       ({**shadow, "shadow_of": None, "shadow": "maybe"}, "shadow")):
        refused = _route("ablab.inference", json.dumps(bad).encode())
        assert isinstance(refused, Rejection) and refused.field == field, refused
