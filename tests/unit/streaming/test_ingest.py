"""Ingestion service: per-event rejections, whole-request refusals, signed billing webhooks."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.streaming.events import CostEvent, ExposureEvent, FeedbackEvent, Rejection
from ablab.streaming.ingest import (
    MAX_BATCH_EVENTS,
    MAX_BODY_BYTES,
    IngestRejected,
    IngestStats,
    ingest_billing,
    ingest_events,
    ingest_feedback,
    sign_billing,
    verify_billing_signature,
)

SECRET = "s3cret"
NOW = 1_790_000_000.0


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
    result = ingest_events(body=body, sink=sink, stats=stats)
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
    assert ingest_events(body={"events": [exposure()]}, sink=sink, stats=stats).accepted == 1
    assert ingest_events(body=exposure(), sink=sink, stats=stats).accepted == 1
    with pytest.raises(IngestRejected) as refused:
        ingest_events(body={"events": [], "extra": 1}, sink=sink, stats=stats)
    assert refused.value.field == "extra"


def test_unknown_experiment_is_rejected_by_name() -> None:
    sink, stats = RecordingSink(), IngestStats()
    result = ingest_events(body=[exposure(), exposure(experiment="ghost")], sink=sink, stats=stats,
                           known_experiment=lambda key: key == "exp")
    assert result.accepted == 1
    assert result.errors[0]["field"] == "experiment" and "ghost" in result.errors[0]["message"]
    assert stats.as_dict()["events.rejected.experiment"] == 1


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
        ingest_events(body=body, sink=sink, stats=stats)
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
                            stats=stats, now=NOW)
    assert (result.accepted, result.rejected) == (2, 1) and result.errors[0]["field"] == "cost_usd"
    by_trace, by_resource = sink.events
    assert isinstance(by_trace, CostEvent) and by_trace.event_id == "inv-1-line-1"
    assert by_resource.ts == datetime(2026, 3, 1, 12, tzinfo=UTC)  # event time = end of the billed period
    again = RecordingSink()
    ingest_billing(body=body, signature=signature, timestamp=str(int(NOW)), secret=SECRET, sink=again,
                   stats=stats, now=NOW + 1)
    assert [e.event_id for e in again.events] == [e.event_id for e in sink.events]  # a retry dedupes downstream


@pytest.mark.parametrize(
    ("mutate", "field", "fragment"),
    [
        (lambda b, s, t: (b + b" ", s, t), "X-Ablab-Signature", "does not match"),
        (lambda b, s, t: (b, s.replace("sha256=", "sha256=0"), t), "X-Ablab-Signature", "does not match"),
        (lambda b, s, t: (b, None, t), "X-Ablab-Signature", "missing"),
        (lambda b, s, t: (b, s, None), "X-Ablab-Timestamp", "missing"),
        (lambda b, s, t: (b, s, "yesterday"), "X-Ablab-Timestamp", "unix seconds"),
    ],
)
def test_bad_signatures_are_refused_without_dead_letters(mutate, field: str, fragment: str) -> None:
    body = billing_body()
    signature = sign_billing(body=body, secret=SECRET, timestamp=int(NOW))
    body, signature, timestamp = mutate(body, signature, str(int(NOW)))
    sink, stats = RecordingSink(), IngestStats()
    with pytest.raises(IngestRejected) as refused:
        ingest_billing(body=body, signature=signature, timestamp=timestamp, secret=SECRET, sink=sink, stats=stats,
                       now=NOW)
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
