"""Ingestion service: per-event rejections, whole-request refusals, signed billing webhooks."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.platform.events import CostEvent, ExposureEvent, FeedbackEvent, Rejection
from ablab.streaming.ingest import (
    MAX_BATCH_EVENTS,
    MAX_BODY_BYTES,
    IngestRejected,
    IngestStats,
    MemoryReplayGuard,
    ingest_billing,
    ingest_events,
    ingest_feedback,
    sign_billing,
    verify_billing_signature,
)

SECRET = "s3cret"
RECEIVED = datetime(2026, 3, 1, 12, 1, tzinfo=UTC)  # the receiving clock of these tests
NOW = RECEIVED.timestamp()


class RecordingSink:
    """Collects what the ingestion forwards (the emitter's role; Kafka is tested elsewhere)."""

    def __init__(self) -> None:
        self.events: list = []
        self.dead: list[tuple[object, Rejection, str]] = []

    def emit(self, event) -> None:
        self.events.append(event)

    def dead_letter(self, *, raw, rejection: Rejection, source: str) -> None:
        self.dead.append((raw, rejection, source))


def exposure(**overrides):
    return {"type": "exposure", "ts": "2026-03-01T12:00:00Z", "trace_id": "t1", "experiment": "exp",
            "variant": "a", "unit_id": "u1", **overrides}


def test_valid_events_forwarded_invalid_ones_listed_and_dead_lettered() -> None:
    sink, stats = RecordingSink(), IngestStats()
    body = json.dumps([exposure(), exposure(variant=3), exposure(trace_id="t2"), {"type": "nope"}]).encode()
    result = ingest_events(body=body, sink=sink, stats=stats, now=RECEIVED)
    assert (result.accepted, result.rejected) == (2, 2)
    assert [e["index"] for e in result.errors] == [1, 3]
    assert [e["field"] for e in result.errors] == ["variant", "type"]
    assert all(isinstance(e, ExposureEvent) for e in sink.events) and len(sink.events) == 2
    assert [d[1].field for d in sink.dead] == ["variant", "type"] and sink.dead[0][0]["variant"] == 3
    counts = stats.as_dict()
    assert counts["events.accepted"] == 2 and counts["events.rejected"] == 2
    assert counts["events.rejected.variant"] == 1
    assert result.as_dict()["errors"][0] == {"index": 1, "field": "variant", "message": result.errors[0]["message"]}


def test_events_wrapper_and_single_object_are_accepted() -> None:
    sink, stats = RecordingSink(), IngestStats()
    assert ingest_events(body={"events": [exposure()]}, sink=sink, stats=stats, now=RECEIVED).accepted == 1
    assert ingest_events(body=exposure(), sink=sink, stats=stats, now=RECEIVED).accepted == 1
    with pytest.raises(IngestRejected) as refused:
        ingest_events(body={"events": [], "extra": 1}, sink=sink, stats=stats, now=RECEIVED)
    assert refused.value.field == "extra"


def variants_of(key: str):
    return {"exp": {"a", "b"}}.get(key)


def test_unknown_experiment_or_variant_is_rejected_by_name() -> None:
    sink, stats = RecordingSink(), IngestStats()
    body = [exposure(), exposure(experiment="ghost"), exposure(variant="z"), exposure(variant="b")]
    result = ingest_events(body=body, sink=sink, stats=stats, variants_of=variants_of, now=RECEIVED)
    assert result.accepted == 2
    assert [(e["index"], e["field"]) for e in result.errors] == [(1, "experiment"), (2, "variant")]
    assert "ghost" in result.errors[0]["message"] and "'z'" in result.errors[1]["message"]
    assert [d[1].field for d in sink.dead] == ["experiment", "variant"]
    counts = stats.as_dict()
    assert counts["events.rejected.experiment"] == 1 and counts["events.rejected.variant"] == 1
    # Labels and billing records naming an experiment are held to the same registry.
    labels = [{"trace_id": "t1", "correct": 1, "source": "human", "experiment": "exp", "variant": "z"}]
    assert ingest_feedback(body=labels, sink=sink, stats=stats, variants_of=variants_of,
                           now=RECEIVED).errors[0]["field"] == "variant"


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "malformed"),
        (b"42", 400, "malformed"),
        (b" " * (MAX_BODY_BYTES + 1), 413, "oversized"),
        (json.dumps([exposure()] * (MAX_BATCH_EVENTS + 1)).encode(), 413, "oversized"),
    ],
)
def test_whole_request_problems_raise_with_status_and_are_dead_lettered(body: bytes, status: int, reason: str) -> None:
    sink, stats = RecordingSink(), IngestStats()
    with pytest.raises(IngestRejected) as refused:
        ingest_events(body=body, sink=sink, stats=stats, now=RECEIVED)
    assert refused.value.status_code == status
    assert len(sink.dead) == 1 and sink.events == []
    assert stats.as_dict()[f"events.{reason}"] == 1


def test_feedback_labels_become_feedback_events_with_receive_time() -> None:
    sink, stats = RecordingSink(), IngestStats()
    now = datetime(2026, 3, 1, 12, 5, tzinfo=UTC)
    body = {"labels": [{"trace_id": "t1", "correct": 1, "source": "human"},
                       {"trace_id": "t2", "score": 0.4, "source": "judge", "ts": "2026-03-01T12:01:00Z"},
                       {"trace_id": "t3", "source": "human"},
                       {"trace_id": "t4", "correct": 1, "source": "human", "type": "rum"}]}
    result = ingest_feedback(body=json.dumps(body), sink=sink, stats=stats, now=now)
    assert (result.accepted, result.rejected) == (2, 2)
    assert [e["field"] for e in result.errors] == ["correct", "type"]
    first, second = sink.events
    assert isinstance(first, FeedbackEvent) and first.ts == now and first.correct == 1
    assert second.ts == datetime(2026, 3, 1, 12, 1, tzinfo=UTC) and second.score == 0.4


def billing_body() -> bytes:
    return json.dumps({"records": [
        {"id": "inv-1-line-1", "trace_id": "t1", "cost_usd": 0.002, "price_version": "2026-03"},
        {"resource": "gpu-0", "cost_usd": 1.5, "period_start": "2026-03-01T11:00:00Z",
         "period_end": "2026-03-01T12:00:00Z"},
        {"trace_id": "t3", "cost_usd": -1},
    ]}).encode()


def test_signed_billing_webhook_becomes_cost_events_with_stable_ids() -> None:
    body, sink, stats = billing_body(), RecordingSink(), IngestStats()
    signature = sign_billing(body=body, secret=SECRET, timestamp=int(NOW))
    result = ingest_billing(body=body, signature=signature, timestamp=str(int(NOW)), secret=SECRET, sink=sink,
                            stats=stats, replay_guard=MemoryReplayGuard(), now=NOW)
    assert (result.accepted, result.rejected) == (2, 1) and result.errors[0]["field"] == "cost_usd"
    by_trace, by_resource = sink.events
    assert isinstance(by_trace, CostEvent) and by_trace.event_id == "inv-1-line-1"
    assert by_resource.ts == datetime(2026, 3, 1, 12, tzinfo=UTC)  # event time = end of the billed period
    # The provider retries: signed again, later; the records keep their ids, so the retry dedupes downstream.
    again, later = RecordingSink(), int(NOW) + 60
    ingest_billing(body=body, signature=sign_billing(body=body, secret=SECRET, timestamp=later),
                   timestamp=str(later), secret=SECRET, sink=again, stats=stats, replay_guard=MemoryReplayGuard(),
                   now=later)
    assert [e.event_id for e in again.events] == [e.event_id for e in sink.events]


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (lambda b, s, t: (b + b" ", s, t), "X-Ablab-Signature", "does not match"),
        (lambda b, s, t: (b, s.replace("sha256=", "sha256=0"), t), "X-Ablab-Signature", "does not match"),
        (lambda b, s, t: (b, None, t), "X-Ablab-Signature", "missing"),
        (lambda b, s, t: (b, s, None), "X-Ablab-Timestamp", "missing"),
        (lambda b, s, t: (b, s, "yesterday"), "X-Ablab-Timestamp", "unix seconds"),
        (lambda b, s, t: (b, s, "9" * 400), "X-Ablab-Timestamp", "unix seconds"),  # was an OverflowError (500)
        (lambda b, s, t: (b, s, "1" * 5000), "X-Ablab-Timestamp", "unix seconds"),
        (lambda b, s, t: (b, s, "-" + t), "X-Ablab-Timestamp", "unix seconds"),
        (lambda b, s, t: (b, s, str(int(t) - 301)), "X-Ablab-Timestamp", "tolerance"),
        (lambda b, s, t: (b, s, str(int(t) + 301)), "X-Ablab-Timestamp", "tolerance"),
        (lambda b, s, t: (b, "sha256=\u00e9\ud800", t), "X-Ablab-Signature", "does not match"),
    ],
)
def test_bad_signatures_are_refused_without_dead_letters(mutate, field: str, fragment: str) -> None:
    body = billing_body()
    signature = sign_billing(body=body, secret=SECRET, timestamp=int(NOW))
    body, signature, timestamp = mutate(body, signature, str(int(NOW)))
    sink, stats = RecordingSink(), IngestStats()
    with pytest.raises(IngestRejected) as refused:
        ingest_billing(body=body, signature=signature, timestamp=timestamp, secret=SECRET, sink=sink, stats=stats,
                       replay_guard=MemoryReplayGuard(), now=NOW)
    assert refused.value.status_code == 401 and refused.value.field == field and fragment in refused.value.message
    assert sink.dead == [] and sink.events == [] and stats.as_dict()["billing.bad_signature"] == 1


def test_replayed_webhook_outside_the_tolerance_is_refused() -> None:
    body = billing_body()
    old = int(NOW) - 301
    signature = sign_billing(body=body, secret=SECRET, timestamp=old)  # genuinely signed, but captured
    with pytest.raises(IngestRejected, match="tolerance"):
        verify_billing_signature(body=body, signature=signature, timestamp=str(old), secret=SECRET, now=NOW)
    verify_billing_signature(body=body, signature=signature, timestamp=str(old), secret=SECRET, now=NOW - 10)
    with pytest.raises(IngestRejected, match="does not match"):
        verify_billing_signature(body=body, signature=signature, timestamp=str(old), secret="other", now=old)


# --- physical bounds, event time, identity, nesting, replay, counters -------------------------


def inference(**overrides):
    return {"type": "inference", "ts": "2026-03-01T12:00:00Z", "trace_id": "tr-1", "experiment": "exp",
            "variant": "a", "unit_id": "u1", "ttft_ms": 10.0, "e2e_ms": 80.0, "tpot_ms": 4.0, "prompt_tokens": 30,
            "output_tokens": 17, "device_s": 0.08, "cost_usd": 1e-4, "price_version": "p1", "strategy": "s1",
            **overrides}


def test_hostile_values_are_refused_by_name_dead_lettered_and_counted_while_the_rest_flows() -> None:
    sink, stats = RecordingSink(), IngestStats()
    hostile = [
        ({"e2e_ms": 1.7e308}, "e2e_ms"), ({"e2e_ms": 1e308}, "e2e_ms"), ({"ttft_ms": -5.0}, "ttft_ms"),
        ({"tpot_ms": 1e12}, "tpot_ms"), ({"cost_usd": 1e12}, "cost_usd"), ({"device_s": 1e9}, "device_s"),
        ({"output_tokens": 10**12}, "output_tokens"), ({"ts": "9999-12-31T00:00:00Z"}, "ts"),
        ({"ts": "2026-03-01T12:06:01Z"}, "ts"),  # 5 min 1 s ahead of the receiving clock
        ({"ts": "2026-01-01T00:00:00Z"}, "ts"),  # older than the 30-day retention
    ]
    body = [inference(trace_id="ok-1")]
    body += [inference(trace_id=f"bad-{i}", **overrides) for i, (overrides, _) in enumerate(hostile)]
    body += [inference(trace_id="ok-2")]
    # NaN reaches the API as a JSON literal that Python's parser accepts.
    nan = json.dumps(inference(trace_id="nan")).encode().replace(b'"e2e_ms": 80.0', b'"e2e_ms": NaN')
    raw = json.dumps(body).encode()[:-1] + b"," + nan + b"]"
    result = ingest_events(body=raw, sink=sink, stats=stats, now=RECEIVED)
    assert result.accepted == 2 and [e.trace_id for e in sink.events] == ["ok-1", "ok-2"]
    assert [e["field"] for e in result.errors] == [field for _, field in hostile] + ["e2e_ms"]
    assert len(sink.dead) == len(hostile) + 1
    counts = stats.as_dict()
    assert counts["events.rejected"] == len(hostile) + 1 and counts["events.rejected.ts"] == 3
    assert counts["events.rejected.e2e_ms"] == 3


def test_event_time_bounds_follow_the_limits() -> None:
    from ablab.streaming.ingest import EdgeLimits

    sink, stats = RecordingSink(), IngestStats()
    strict = EdgeLimits(max_ahead_s=10, max_age_s=120)
    body = [exposure(ts="2026-03-01T12:01:09Z"), exposure(ts="2026-03-01T12:01:11Z"),
            exposure(ts="2026-02-28T23:00:00Z"), exposure(ts="2026-03-01T11:59:30Z")]
    result = ingest_events(body=body, sink=sink, stats=stats, limits=strict, now=RECEIVED)
    assert result.accepted == 2 and [e["index"] for e in result.errors] == [1, 2]
    assert all(e["field"] == "ts" for e in result.errors)


def test_a_redelivered_inference_event_without_event_id_is_the_same_event() -> None:
    sink, stats = RecordingSink(), IngestStats()
    first = inference(trace_id="retry-me")
    ingest_events(body=[first], sink=sink, stats=stats, now=RECEIVED)
    ingest_events(body=[first, inference(trace_id="other")], sink=sink, stats=stats, now=RECEIVED)
    ids = [e.event_id for e in sink.events]
    assert ids[0] == ids[1] != ids[2]
    # Given ids are kept as they are.
    ingest_events(body=[inference(event_id="mine")], sink=sink, stats=stats, now=RECEIVED)
    assert sink.events[-1].event_id == "mine"


def test_a_label_resent_without_ts_is_the_same_label() -> None:
    sink, stats = RecordingSink(), IngestStats()
    label = {"trace_id": "t1", "correct": 1, "source": "human"}
    ingest_feedback(body=[label], sink=sink, stats=stats, now=RECEIVED)
    ingest_feedback(body=[label, {**label, "correct": 0}], sink=sink, stats=stats,
                    now=datetime(2026, 3, 1, 12, 2, tzinfo=UTC))
    first, again, other = sink.events
    assert first.event_id == again.event_id != other.event_id and first.ts != again.ts


def test_billing_records_without_provider_ids_get_content_ids() -> None:
    sink, stats = RecordingSink(), IngestStats()
    records = [{"trace_id": "t1", "cost_usd": 0.5}, {"trace_id": "t1", "cost_usd": 0.5}, {"trace_id": "t1", "cost_usd": 0.7}]
    body = json.dumps({"records": records}).encode()
    ingest_billing(body=body, signature=sign_billing(body=body, secret=SECRET, timestamp=int(NOW)),
                   timestamp=str(int(NOW)), secret=SECRET, sink=sink, stats=stats, replay_guard=MemoryReplayGuard(),
                   now=NOW)
    a, b, c = (e.event_id for e in sink.events)
    assert a == b != c


DEEP = b"[" * 1_000 + b"]" * 1_000


@pytest.mark.parametrize("body", [
    DEEP, b'{"events": ' + DEEP + b"}", b'[{"type": "rum", "x": ' + DEEP + b"}]", b"[" * 40 + b"]" * 40,
    b"[" * 200_000 + b"]" * 200_000,
])
def test_deep_json_is_a_400_naming_the_body_dead_lettered_and_counted(body: bytes) -> None:
    for endpoint, call in (("events", ingest_events), ("feedback", ingest_feedback)):
        sink, stats = RecordingSink(), IngestStats()
        with pytest.raises(IngestRejected) as refused:
            call(body=body, sink=sink, stats=stats, now=RECEIVED)
        assert (refused.value.status_code, refused.value.field) == (400, "$")
        assert "nested" in refused.value.message
        assert len(sink.dead) == 1 and len(sink.dead[0][0]) == len(body)  # the raw bytes, as sent
        assert stats.as_dict()[f"{endpoint}.too_deep"] == 1


def test_a_signed_deep_webhook_is_a_400_too() -> None:
    sink, stats = RecordingSink(), IngestStats()
    body = b'{"records": ' + DEEP + b"}"
    with pytest.raises(IngestRejected) as refused:
        ingest_billing(body=body, signature=sign_billing(body=body, secret=SECRET, timestamp=int(NOW)),
                       timestamp=str(int(NOW)), secret=SECRET, sink=sink, stats=stats,
                       replay_guard=MemoryReplayGuard(), now=NOW)
    assert refused.value.status_code == 400 and stats.as_dict()["billing.too_deep"] == 1 and len(sink.dead) == 1


def test_a_replayed_signed_webhook_is_refused_and_so_is_one_past_the_window() -> None:
    body, guard = billing_body(), MemoryReplayGuard(clock=lambda: NOW)
    signature = sign_billing(body=body, secret=SECRET, timestamp=int(NOW))

    def deliver(at: float):
        sink, stats = RecordingSink(), IngestStats()
        try:
            return ingest_billing(body=body, signature=signature, timestamp=str(int(NOW)), secret=SECRET, sink=sink,
                                  stats=stats, replay_guard=guard, now=at), sink, stats
        except IngestRejected as exc:
            return exc, sink, stats

    result, sink, _ = deliver(NOW)
    assert result.accepted == 2
    replayed, sink, stats = deliver(NOW + 5)
    assert isinstance(replayed, IngestRejected) and (replayed.status_code, replayed.field) == (409, "X-Ablab-Signature")
    assert sink.events == [] and sink.dead == [] and stats.as_dict()["billing.replayed"] == 1
    late, sink, stats = deliver(NOW + 301)
    assert isinstance(late, IngestRejected) and late.status_code == 401 and "tolerance" in late.message


def test_the_memory_guard_forgets_a_delivery_once_its_window_has_passed() -> None:
    clock = [100.0]
    guard = MemoryReplayGuard(clock=lambda: clock[0])
    assert guard.first_seen("k", expires_at=400) and not guard.first_seen("k", expires_at=400)
    clock[0] = 401.0
    assert guard.first_seen("k", expires_at=700)


def test_unknown_field_names_share_one_counter() -> None:
    sink, stats = RecordingSink(), IngestStats()
    body = [exposure(**{f"field_{i}": 1}) for i in range(200)] + [exposure(**{"$weird name": 1})]
    result = ingest_events(body=body, sink=sink, stats=stats, now=RECEIVED)
    assert result.rejected == 201 and result.errors[0]["field"] == "field_0"  # the response still names it
    rejected = {k: v for k, v in stats.as_dict().items() if k.startswith("events.rejected.")}
    assert rejected == {"events.rejected.other": 201}


# --- a batch's elements are objects, never JSON text ----------------------------------------


def test_an_event_sent_as_a_json_string_inside_a_batch_is_refused_per_record() -> None:
    # validate_event parses JSON text (the loader's Kafka values are bytes); a batch element
    # must not take that path, or a string would be stored as an event.
    sink, stats = RecordingSink(), IngestStats()
    text = json.dumps(exposure(trace_id="as-text"))
    result = ingest_events(body=json.dumps([exposure(), text, 7]).encode(), sink=sink, stats=stats, now=RECEIVED)
    assert (result.accepted, result.rejected) == (1, 2)
    assert [(e["index"], e["field"]) for e in result.errors] == [(1, "$"), (2, "$")]
    assert "JSON object" in result.errors[0]["message"] and "str" in result.errors[0]["message"]
    assert [e.trace_id for e in sink.events] == ["t1"]
    assert [(d[0], d[1].field, d[2]) for d in sink.dead] == [(text, "$", "events"), (7, "$", "events")]
    assert stats.as_dict()["events.rejected.$"] == 2
    wrapped = ingest_events(body={"events": [text]}, sink=sink, stats=stats, now=RECEIVED)
    assert (wrapped.accepted, wrapped.errors[0]["field"]) == (0, "$")


def test_a_string_label_cannot_smuggle_another_event_type_through_feedback() -> None:
    # Before: a string skipped the label's preparation, so /v1/feedback stored an exposure.
    sink, stats = RecordingSink(), IngestStats()
    label = json.dumps({"type": "feedback", "trace_id": "t1", "correct": 1, "source": "human",
                        "ts": "2026-03-01T12:00:00Z"})
    body = {"labels": [json.dumps(exposure()), label, {"trace_id": "t1", "correct": 1, "source": "human"}]}
    result = ingest_feedback(body=json.dumps(body), sink=sink, stats=stats, now=RECEIVED)
    assert (result.accepted, [(e["index"], e["field"]) for e in result.errors]) == (1, [(0, "$"), (1, "$")])
    assert [type(e) for e in sink.events] == [FeedbackEvent]
    assert stats.as_dict()["feedback.rejected.$"] == 2 and len(sink.dead) == 2


def test_a_string_billing_record_is_refused_not_stored_as_whatever_it_says() -> None:
    sink, stats = RecordingSink(), IngestStats()
    body = json.dumps({"records": [json.dumps(exposure()), json.dumps({"type": "cost", "trace_id": "t1",
                                                                       "cost_usd": 0.5, "ts": "2026-03-01T12:00:00Z"}),
                                   {"id": "inv-9", "trace_id": "t1", "cost_usd": 0.5}]}).encode()
    result = ingest_billing(body=body, signature=sign_billing(body=body, secret=SECRET, timestamp=int(NOW)),
                            timestamp=str(int(NOW)), secret=SECRET, sink=sink, stats=stats,
                            replay_guard=MemoryReplayGuard(), now=NOW)
    assert (result.accepted, [(e["index"], e["field"]) for e in result.errors]) == (1, [(0, "$"), (1, "$")])
    assert [e.event_id for e in sink.events] == ["inv-9"] and isinstance(sink.events[0], CostEvent)
    assert stats.as_dict()["billing.rejected.$"] == 2
