"""Event schemas: what is accepted, what is refused and with which field named."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.streaming.events import (
    EVENT_TYPES,
    MAX_EVENT_BYTES,
    SCHEMA_DIR,
    CostEvent,
    FeedbackEvent,
    InferenceEvent,
    Rejection,
    dead_letter_record,
    json_schemas,
    render_schema,
    topic_key,
    validate_event,
)

TS = "2026-03-01T12:00:00.250Z"


def inference(**overrides):
    body = {
        "type": "inference", "ts": TS, "trace_id": "tr-1", "experiment": "exp", "variant": "a", "unit_id": "u1",
        "ttft_ms": 12.5, "e2e_ms": 80, "tpot_ms": 4.1, "prompt_tokens": 30, "output_tokens": 17,
        "device_s": 0.08, "cost_usd": 0.0001, "price_version": "2026-01", "strategy": "3f2a9c",
    }
    body.update(overrides)
    return body


def test_valid_inference_round_trips_through_json() -> None:
    event = validate_event(inference())
    assert isinstance(event, InferenceEvent)
    assert event.v == 1 and event.ts == datetime(2026, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
    again = validate_event(event.to_json_bytes())
    assert again == event
    assert json.loads(event.to_json_bytes())["ts"] == "2026-03-01T12:00:00.250000Z"


def test_event_id_is_generated_and_kept() -> None:
    first, second = validate_event(inference()), validate_event(inference())
    assert first.event_id != second.event_id
    assert validate_event(inference(event_id="given-1")).event_id == "given-1"


def test_offset_timestamps_are_normalised_to_utc() -> None:
    event = validate_event(inference(ts="2026-03-01T14:00:00+02:00"))
    assert event.ts == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


BAD_FIELDS = [
        ({"ttft_ms": "12"}, "ttft_ms", "valid number"),  # strict: no string coercion
        ({"prompt_tokens": True}, "prompt_tokens", "valid integer"),  # strict: bool is not an int
        ({"prompt_tokens": 1.5}, "prompt_tokens", "integer"),
        ({"e2e_ms": -1}, "e2e_ms", "greater than or equal"),
        ({"ttft_ms": 100}, "ttft_ms", "exceeds e2e_ms"),
        ({"ts": "2026-03-01T12:00:00"}, "ts", "UTC offset"),
        ({"ts": 1767225600}, "ts", "ISO-8601"),
        ({"ts": "yesterday"}, "ts", "ISO-8601"),
        ({"trace_id": "has space"}, "trace_id", "pattern"),
        ({"colour": "red"}, "colour", "unknown field"),
        ({"type": "click"}, "type", "must be one of"),
        ({"v": 2}, "v", "unsupported schema version"),
        ({"e2e_ms": float("nan")}, "e2e_ms", "finite"),
        ({"v": True}, "v", "unsupported schema version"),  # JSON true == 1 in Python
]


@pytest.mark.parametrize(("overrides", "field", "fragment"), BAD_FIELDS)
def test_bad_fields_are_rejected_by_name(overrides, field: str, fragment: str) -> None:
    rejection = validate_event(inference(**overrides))
    assert isinstance(rejection, Rejection)
    assert rejection.field == field
    assert fragment in rejection.message


@pytest.mark.parametrize(("overrides", "field", "fragment"), BAD_FIELDS)
def test_json_bytes_get_the_same_rejection_as_a_mapping(overrides, field: str, fragment: str) -> None:
    # bytes take pydantic-core's one-pass JSON fast path; a refusal must still name the field
    raw = json.dumps(inference(**overrides)).encode()
    assert validate_event(raw) == validate_event(inference(**overrides))


def test_json_bytes_and_mapping_give_the_same_event() -> None:
    body = inference(error="oom", tpot_ms=None, event_id="ev-1")
    assert validate_event(json.dumps(body).encode()) == validate_event(body)


def test_missing_fields_are_named() -> None:
    body = inference()
    del body["e2e_ms"]
    assert validate_event(body) == Rejection("e2e_ms", "Field required")
    del body["type"]
    assert validate_event(body).field == "type"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", "null"])
def test_malformed_input_is_a_rejection_not_an_exception(raw) -> None:
    rejection = validate_event(raw)
    assert isinstance(rejection, Rejection) and rejection.field == "$"


def test_oversized_event_is_rejected_before_parsing() -> None:
    raw = json.dumps(inference(error="x" * 10)).encode() + b" " * MAX_EVENT_BYTES
    rejection = validate_event(raw)
    assert isinstance(rejection, Rejection)
    assert rejection.field == "$" and str(MAX_EVENT_BYTES) in rejection.message


def test_feedback_needs_a_label_and_accepts_bool_as_0_1() -> None:
    base = {"type": "feedback", "ts": TS, "trace_id": "tr-1", "source": "human"}
    assert validate_event(base).field == "correct"
    event = validate_event({**base, "correct": True})
    assert isinstance(event, FeedbackEvent) and event.correct == 1 and event.experiment is None
    assert validate_event({**base, "correct": 2}).field == "correct"
    assert validate_event({**base, "score": 0.7, "source": "crowd"}).field == "source"


def test_cost_by_trace_or_by_resource_period() -> None:
    base = {"type": "cost", "ts": TS, "cost_usd": 0.02}
    assert validate_event(base).field == "trace_id"
    assert isinstance(validate_event({**base, "trace_id": "tr-9"}), CostEvent)
    period = {**base, "resource": "gpu-0", "period_start": "2026-03-01T12:00:00Z", "period_end": "2026-03-01T13:00:00Z"}
    event = validate_event(period)
    assert isinstance(event, CostEvent) and topic_key(event) == b"gpu-0"
    backwards = {**period, "period_end": "2026-03-01T11:00:00Z"}
    assert validate_event(backwards).field == "period_end"


def test_exposure_requires_assignment_fields() -> None:
    body = {"type": "exposure", "ts": TS, "trace_id": "tr-1", "experiment": "exp", "variant": "a"}
    assert validate_event(body) == Rejection("unit_id", "Field required")
    assert topic_key(validate_event({**body, "unit_id": "u"})) == b"tr-1"


def test_dead_letter_record_keeps_reason_and_truncated_raw() -> None:
    record = json.loads(dead_letter_record(raw=b"x" * 20_000, rejection=Rejection("$", "malformed JSON"), source="http"))
    assert record["field"] == "$" and record["source"] == "http" and len(record["raw"]) == 8192
    assert record["received_at"].endswith("Z")


def test_committed_json_schemas_equal_the_generated_ones() -> None:
    generated = json_schemas()
    assert set(generated) == {*EVENT_TYPES, "event"}
    for name, schema in generated.items():
        path = SCHEMA_DIR / f"{name}.json"
        assert path.is_file(), f"{path} missing: run `python -m ablab.streaming.events`"
        assert path.read_text() == render_schema(schema), f"{path} is stale: run `python -m ablab.streaming.events`"


def test_published_schema_forbids_unknown_fields_and_names_required_ones() -> None:
    schema = json_schemas()["inference"]
    assert schema["additionalProperties"] is False
    assert {"ts", "trace_id", "ttft_ms", "e2e_ms", "strategy", "type"} <= set(schema["required"])
