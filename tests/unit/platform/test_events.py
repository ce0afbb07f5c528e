"""Event schemas: what is accepted, what is refused and with which field named."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from ablab.platform.events import (
    EVENT_TYPES,
    FIELD_BOUNDS,
    MAX_EVENT_BYTES,
    MAX_JSON_DEPTH,
    SCHEMA_DIR,
    CostEvent,
    FeedbackEvent,
    InferenceEvent,
    Rejection,
    check_event_time,
    dead_letter_record,
    derive_event_id,
    json_schemas,
    parse_json,
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


def test_event_id_is_kept_when_given_and_derived_when_absent() -> None:
    assert validate_event(inference(event_id="given-1")).event_id == "given-1"
    derived = validate_event(inference()).event_id
    assert derived == derive_event_id(inference()) and re.fullmatch(r"[0-9a-f]{32}", derived)
    assert validate_event(inference(event_id=None)).event_id == derived
    assert validate_event(json.dumps(inference()).encode()).event_id == derived  # the JSON fast path too


def test_an_inference_event_is_identified_by_its_trace_id() -> None:
    # A redelivery is the same request even if a producer re-measured or re-stamped it.
    first = derive_event_id(inference())
    assert derive_event_id(inference(e2e_ms=95.0, ts="2026-03-01T12:00:03Z")) == first
    assert derive_event_id(inference(trace_id="tr-2")) != first
    exposure = {k: inference()[k] for k in ("ts", "trace_id", "experiment", "variant", "unit_id")}
    assert derive_event_id({**exposure, "type": "exposure"}) != first  # same trace, another record


def test_other_events_are_identified_by_their_content_however_it_is_written() -> None:
    label = {"type": "feedback", "ts": "2026-03-01T12:00:00Z", "trace_id": "tr-1", "correct": 1, "source": "human"}
    same = [
        {**label, "ts": "2026-03-01T12:00:00.000+00:00"},
        {**label, "ts": "2026-03-01T14:00:00+02:00"},
        {"v": 1, **dict(reversed(list(label.items())))},
        {**label, "event_id": None},
    ]
    assert {derive_event_id(record) for record in same} == {derive_event_id(label)}
    assert derive_event_id({"type": "rum", "ts": TS, "trace_id": "t", "e2e_ms": 80}) == \
        derive_event_id({"type": "rum", "ts": TS, "trace_id": "t", "e2e_ms": 80.0})
    different = [{**label, "correct": 0}, {**label, "source": "judge"}, {**label, "ts": "2026-03-01T12:00:01Z"}]
    assert len({derive_event_id(r) for r in [label, *different]}) == 4


@pytest.mark.parametrize("record", [
    {"type": "feedback", "ts": "2026-03-01T14:00:00+02:00", "trace_id": "t", "correct": True, "source": "human"},
    {"type": "feedback", "ts": TS, "trace_id": "t", "score": 3, "source": "judge", "experiment": None},
    {"type": "rum", "ts": TS, "trace_id": "t", "e2e_ms": 80},
    {"type": "exposure", "ts": TS, "trace_id": "t", "experiment": "e", "variant": "a", "unit_id": "u", "v": 1},
    {"type": "cost", "ts": TS, "resource": "gpu-0", "cost_usd": 2, "period_start": "2026-03-01T11:00:00Z",
     "period_end": "2026-03-01T12:00:00.000+00:00"},
])
def test_the_id_of_a_record_as_sent_equals_the_id_the_model_derives(record) -> None:
    # Producers derive ids from what they send; the models (the loader, validation) from what
    # they validated. Both must agree, through the JSON fast path too.
    event = validate_event(record)
    assert not isinstance(event, Rejection), event
    assert event.event_id == derive_event_id(record) == validate_event(json.dumps(record).encode()).event_id


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
        assert path.is_file(), f"{path} missing: run `python -m ablab.platform.events`"
        assert path.read_text() == render_schema(schema), f"{path} is stale: run `python -m ablab.platform.events`"


def test_published_schema_forbids_unknown_fields_and_names_required_ones() -> None:
    schema = json_schemas()["inference"]
    assert schema["additionalProperties"] is False
    assert {"ts", "trace_id", "ttft_ms", "e2e_ms", "strategy", "type"} <= set(schema["required"])


# --- physical bounds ----------------------------------------------------------------------

DAY_MS = 86_400_000.0
HOSTILE = [
    *[({name: value}, name, fragment) for name in ("ttft_ms", "e2e_ms", "tpot_ms")
      for value, fragment in ((float("nan"), "finite"), (float("inf"), "finite"), (float("-inf"), "finite"),
                              (1e308, "at most a day"), (1.7e308, "at most a day"), (DAY_MS + 1, "at most a day"),
                              (-0.001, "greater than or equal"))],
    ({"device_s": 86_401.0}, "device_s", "at most a day"),
    ({"device_s": float("nan")}, "device_s", "finite"),
    ({"cost_usd": 1e7}, "cost_usd", "1,000,000 USD"),
    ({"cost_usd": -1e-9}, "cost_usd", "greater than or equal"),
    ({"cost_usd": float("inf")}, "cost_usd", "finite"),
    ({"prompt_tokens": 10**7 + 1}, "prompt_tokens", "10 M tokens"),
    ({"output_tokens": 10**30}, "output_tokens", "10 M tokens"),
    ({"output_tokens": -1}, "output_tokens", "greater than or equal"),
    ({"ts": "9999-12-31T23:59:59Z"}, "ts", "outside 2000..2199"),
    ({"ts": "9999-12-31T23:59:59-01:00"}, "ts", "outside 2000..2199"),  # past datetime.max once in UTC
    ({"ts": "0001-01-01T00:00:00Z"}, "ts", "outside 2000..2199"),
    ({"ts": "1970-01-01T00:00:00Z"}, "ts", "outside 2000..2199"),
]


@pytest.mark.parametrize(("overrides", "field", "fragment"), HOSTILE)
def test_values_outside_physical_bounds_are_refused_by_name(overrides, field: str, fragment: str) -> None:
    body = inference(**overrides)
    if field == "ttft_ms":
        body["e2e_ms"] = DAY_MS  # so the bound, not ttft <= e2e, is what refuses it
    rejection = validate_event(body)
    assert isinstance(rejection, Rejection), rejection
    assert rejection.field == field and fragment in rejection.message, rejection
    if all(isinstance(v, str) or v == v for v in overrides.values()):  # NaN is not valid JSON to compare
        assert validate_event(json.dumps(body).encode()) == rejection


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"1.7e308"])
def test_non_finite_and_huge_json_numbers_are_refused(literal: bytes) -> None:
    raw = json.dumps(inference(e2e_ms=1.0)).encode().replace(b'"e2e_ms": 1.0', b'"e2e_ms": ' + literal)
    rejection = validate_event(raw)
    assert isinstance(rejection, Rejection) and rejection.field == "e2e_ms", rejection


def test_rum_latency_and_label_score_share_the_bounds_table() -> None:
    rum = {"type": "rum", "ts": TS, "trace_id": "t", "e2e_ms": 1.7e308}
    assert validate_event(rum).field == "e2e_ms"
    assert isinstance(validate_event({**rum, "e2e_ms": DAY_MS}), type(validate_event({**rum, "e2e_ms": 0.0})))
    label = {"type": "feedback", "ts": TS, "trace_id": "t", "score": 2e9, "source": "judge"}
    assert validate_event(label).field == "score"


def test_the_bounds_table_is_what_the_models_and_published_schemas_enforce() -> None:
    schemas = json_schemas()
    for name, bound in FIELD_BOUNDS.items():
        owners = [s for s in schemas.values() if name in s.get("properties", {})]
        assert owners, name
        for schema in owners:
            prop = schema["properties"][name]
            limits = prop.get("anyOf", [prop])[0]
            assert (limits["minimum"], limits["maximum"]) == (bound.lo, bound.hi), name
    edge = inference(ttft_ms=DAY_MS, e2e_ms=DAY_MS, tpot_ms=DAY_MS, device_s=86_400.0, cost_usd=1e6,
                     prompt_tokens=10**7, output_tokens=0)
    assert isinstance(validate_event(edge), InferenceEvent)  # the bounds themselves are inclusive


def test_event_time_is_checked_against_the_receiving_clock() -> None:
    event = validate_event(inference())
    now = event.ts
    assert check_event_time(event, now=now - timedelta(seconds=299), max_ahead_s=300, max_age_s=3600) is None
    ahead = check_event_time(event, now=now - timedelta(seconds=301), max_ahead_s=300, max_age_s=3600)
    assert ahead is not None and ahead.field == "ts" and "ahead of the receiving clock" in ahead.message
    assert check_event_time(event, now=now + timedelta(seconds=3599), max_ahead_s=300, max_age_s=3600) is None
    old = check_event_time(event, now=now + timedelta(seconds=3601), max_ahead_s=300, max_age_s=3600)
    assert old is not None and old.field == "ts" and "retention" in old.message


# --- nesting --------------------------------------------------------------------------------


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 100, 1_000, 100_000])
def test_deeply_nested_json_is_a_rejection_not_a_recursion_error(depth: int) -> None:
    raw = f'{{"type": "rum", "ts": "{TS}", "trace_id": "t", "e2e_ms": 1, "x": {deep(depth)}}}'
    for form in (raw, raw.encode()):
        rejection = validate_event(form)
        assert isinstance(rejection, Rejection)
        assert rejection.field == ("x" if depth < MAX_JSON_DEPTH else "$"), rejection
    assert isinstance(parse_json(deep(depth)), Rejection) == (depth > MAX_JSON_DEPTH)


def test_a_deep_mapping_is_refused_before_validation() -> None:
    nested: object = []
    for _ in range(5_000):
        nested = [nested]
    rejection = validate_event({"type": "rum", "ts": TS, "trace_id": "t", "e2e_ms": 1, "x": nested})
    assert rejection == Rejection("$", rejection.message) and "nested" in rejection.message


def test_custom_measures_and_dims_ride_on_the_inference_event() -> None:
    event = validate_event(inference(measures={"tool_calls": 2, "itl_ms_mean": 1.5}, dims={"domain": "math"}))
    assert isinstance(event, InferenceEvent)
    assert event.measures == {"tool_calls": 2.0, "itl_ms_mean": 1.5} and event.dims == {"domain": "math"}
    assert validate_event(event.to_json_bytes()) == event
    assert validate_event(inference()).measures is None  # optional: older producers are unchanged


@pytest.mark.parametrize(("overrides", "field", "fragment"), [
    ({"measures": {"Tool Calls": 1}}, "measures.Tool Calls", "pattern"),
    ({"measures": {"x": float("nan")}}, "measures.x", "finite"),
    ({"measures": {"x": 1e300}}, "measures.x", "less than or equal"),
    ({"measures": {"x": "1"}}, "measures.x", "valid number"),
    ({"measures": {f"m{i}": 1 for i in range(33)}}, "measures", "at most 32"),
    ({"dims": {"domain": ""}}, "dims.domain", "at least 1"),
    ({"dims": {"domain": "x" * 129}}, "dims.domain", "at most 128"),
    ({"dims": {f"d{i}": "v" for i in range(17)}}, "dims", "at most 16"),
])
def test_measures_and_dims_are_bounded(overrides, field: str, fragment: str) -> None:
    rejection = validate_event(inference(**overrides))
    assert isinstance(rejection, Rejection)
    assert rejection.field.startswith(field) and fragment in rejection.message


def test_a_heartbeat_is_no_event_and_no_event_is_a_heartbeat():
    from datetime import UTC, datetime

    from ablab.platform.events import heartbeat_record, is_heartbeat, validate_event

    beat = heartbeat_record(datetime(2026, 12, 6, 1, 2, 3, 456789, tzinfo=UTC))
    assert beat == b'{"v":1,"type":"heartbeat","ts":"2026-12-06T01:02:03.456Z"}'
    assert is_heartbeat(beat)
    refused = validate_event(beat)  # nobody may send one through the edge
    assert getattr(refused, "field", None) == "type"
    assert not is_heartbeat(beat[:-1] + b',"trace_id":"' + b"x" * 40 + b'"}')


def test_only_a_shadow_carries_its_answer_text_and_within_the_event_limit():
    from ablab.platform.events import MAX_EVENT_BYTES, MAX_OUTPUT_TEXT_CHARS, InferenceEvent

    base = {"v": 1, "type": "inference", "ts": TS, "trace_id": "s-1", "experiment": "exp", "variant": "a",
            "unit_id": "u", "ttft_ms": 1.0, "e2e_ms": 2.0, "prompt_tokens": 1, "output_tokens": 1, "device_s": 0.0,
            "cost_usd": 0.0, "price_version": "p", "strategy": "s"}
    longest = "\u00e9" * MAX_OUTPUT_TEXT_CHARS  # two bytes each in UTF-8
    shadow = validate_event({**base, "shadow_of": "p-1", "output_text": longest})
    assert isinstance(shadow, InferenceEvent) and len(shadow.to_json_bytes()) <= MAX_EVENT_BYTES
    assert validate_event({**base, "shadow_of": "p-1", "output_text": longest + "x"}).field == "output_text"
    assert validate_event({**base, "output_text": "the primary's answer is never recorded"}).field == "output_text"
