"""Kafka record → ClickHouse row: pure functions, no I/O.

:func:`route` decides, for one record of one topic, which table it goes to and with what
values, or why it is refused (a :class:`~ablab.platform.events.Rejection`, which the
loader dead-letters and counts). Raw events are validated by the one schema
(:func:`ablab.platform.events.validate_event`); window rows written by the Flink job are
checked here, field by field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ablab.platform import fields
from ablab.platform.events import MAX_EVENT_BYTES, STORED_SHADOW_TYPE, Rejection, is_heartbeat, validate_event
from ablab.streaming.store.columns import RAW_COLUMNS

WINDOW_COLUMNS = fields.WINDOW_COLUMNS
"""A window row as the Flink job emits it: generated from the field catalogue."""
LATE_COLUMNS = (
    "event_id", "type", "ts", "trace_id", "experiment", "variant", "window_start", "watermark", *fields.LATE_FIELDS, "is_error",
)
"""A late event as late_events stores it: the catalogue's late fields (what its window sums)."""
# What the loader itself can store and aggregate: ClickHouse's DateTime64 range, and numbers
# whose squares are finite (window and rollup sums of squares). Physical bounds (a latency
# within a day, an event time at most minutes ahead) are the edge's; these catch what a
# producer writing straight to Kafka can still put on the bus.
STORE_TS_MIN = datetime(1900, 1, 1, tzinfo=UTC)
STORE_TS_MAX = datetime(2299, 12, 31, tzinfo=UTC)
STORE_ABS_MAX = 1e150
_NUMERIC_RAW = tuple(f.name for f in fields.FIELDS.values() if f.type == "float")  # ints are bounded by the schema
DEFAULT_MAX_FUTURE_S = 300.0
"""Default of how far ahead of the loader's clock an event time may be (the Flink job's
``max_future_s`` is the same bound)."""
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "raw_events": RAW_COLUMNS,
    "window_stats": WINDOW_COLUMNS,
    "late_events": LATE_COLUMNS,
}
_WINDOW_MS = 10_000
_COUNT_FIELDS = {"n", "errors", *(c for c in fields.WINDOW_COLUMNS if c.endswith("_n"))}
_TIME_FIELDS = {"window_start", "window_end", "emitted_at", "ts", "watermark"}
_TEXT_FIELDS = {"experiment", "variant", "event_id", "trace_id"}


@dataclass(frozen=True, slots=True)
class Routed:
    table: str
    row: tuple[Any, ...]


HEARTBEAT = Routed("heartbeat", ())
"""A heartbeat record (the edge's clock, for the stream job's watermark): nothing to store."""

KnownExperiments = Callable[[], Collection[str]] | None


def route(
    *, topic: str, value: bytes | None, partition: int, offset: int, windows_topic: str,
    known_experiments: Collection[str] | None = None, now: datetime | None = None,
    max_future_s: float = DEFAULT_MAX_FUTURE_S,
) -> Routed | Rejection:
    """The table and row for one Kafka record, or the reason it is refused.

    ``now`` (default: the clock) and ``max_future_s`` bound the event time: an event more
    than that ahead is refused, so a producer that bypassed the edge cannot store one.
    """
    if value is None:
        return Rejection("$", "empty record (tombstone)")
    if len(value) > MAX_EVENT_BYTES:
        return Rejection("$", f"record is {len(value)} bytes; the limit is {MAX_EVENT_BYTES}")
    if topic == windows_topic:
        return _window_record(value, known_experiments)
    if is_heartbeat(value):
        return HEARTBEAT
    event = validate_event(value)
    if isinstance(event, Rejection):
        return event
    experiment = getattr(event, "experiment", None)
    if known_experiments is not None and experiment is not None and experiment not in known_experiments:
        return Rejection("experiment", f"unknown experiment {experiment!r}")
    unstorable = storable(event, now=now, max_future_s=max_future_s)
    if unstorable is not None:
        return unstorable
    return Routed("raw_events", raw_event_row(event, payload=value, partition=partition, offset=offset))


def storable(event: Any, *, now: datetime | None = None, max_future_s: float = DEFAULT_MAX_FUTURE_S) -> Rejection | None:
    """Why a validated event cannot be stored and aggregated, or None."""
    ts: datetime = event.ts
    limit = (now or datetime.now(UTC)).timestamp() + max_future_s
    if not STORE_TS_MIN <= ts <= STORE_TS_MAX or ts.timestamp() > limit:
        return Rejection("ts", f"event time {ts.isoformat()} is more than {max_future_s:.0f} s ahead of the loader's "
                               "clock or outside 1900..2299; fix the producer's clock")
    get = vars(event).get
    for name in _NUMERIC_RAW:
        number = get(name)
        if number is not None and not abs(number) <= STORE_ABS_MAX:
            return Rejection(name, f"{number!r} is beyond what the store can aggregate (|x| <= {STORE_ABS_MAX:g})")
    return None


def raw_event_row(event: Any, *, payload: bytes, partition: int, offset: int) -> tuple[Any, ...]:
    # Events differ in fields. Reading the model's __dict__ avoids pydantic's __getattr__
    # fallback for absent names, which raised and caught an AttributeError per missing
    # column and was the loader's largest cost (benchmarks/bench_loader.py).
    get = vars(event).get
    shadow_of = get("shadow_of")
    return (
        event.event_id, STORED_SHADOW_TYPE if shadow_of else event.type, event.ts, get("trace_id") or "",
        get("experiment") or "",
        get("variant") or "", get("unit_id") or "", *map(get, fields.EVENT_FIELDS),
        get("price_version") or "", get("error"), get("strategy") or "",
        get("correct"), get("source") or "", payload.decode("utf-8", errors="replace"),
        get("measures") or {}, get("dims") or {}, partition, offset, shadow_of or "", get("shadow") or "",
    )


def _window_record(value: bytes, known_experiments: Collection[str] | None) -> Routed | Rejection:
    try:
        record = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejection("$", f"malformed JSON: {exc}")
    if not isinstance(record, dict):
        return Rejection("$", "a window row must be a JSON object")
    kind = record.get("kind")
    if kind == "inference":
        table, columns = "window_stats", WINDOW_COLUMNS
        for old, new in fields.LEGACY_WINDOW_NAMES.items():  # a job started before migration 0012
            if old in record and new not in record:
                record[new] = record.pop(old)
    elif kind == "late":
        return _late_record(record, known_experiments)
    elif kind == "rejected":
        return _rejected_record(record)
    else:
        return Rejection("kind", f"`kind` must be inference, late or rejected; got {kind!r}")
    values = []
    for name in columns:
        parsed = _field(record, name)
        if isinstance(parsed, Rejection):
            return parsed
        values.append(parsed)
    if known_experiments is not None and record["experiment"] not in known_experiments:
        return Rejection("experiment", f"unknown experiment {record['experiment']!r}")
    return Routed(table, tuple(values))


def _late_record(record: dict[str, Any], known_experiments: Collection[str] | None) -> Routed | Rejection:
    values: dict[str, Any] = {}
    for name in ("event_id", "trace_id", "ts", "watermark"):
        parsed = _field(record, name)
        if isinstance(parsed, Rejection):
            return parsed
        values[name] = parsed
    event_type = record.get("event_type")
    if event_type != "inference":  # the job windows (hence calls late) inference events only
        return Rejection("event_type", f"`event_type` must be inference; got {event_type!r}")
    experiment = record.get("experiment") or ""
    if known_experiments is not None and experiment and experiment not in known_experiments:
        return Rejection("experiment", f"unknown experiment {experiment!r}")
    ts: datetime = values["ts"]
    window_start = datetime.fromtimestamp(
        (int(ts.timestamp() * 1000) // _WINDOW_MS) * _WINDOW_MS / 1000, tz=UTC
    )
    return Routed("late_events", (
        values["event_id"], event_type, ts, values["trace_id"], experiment, record.get("variant") or "",
        window_start, values["watermark"], *(_number(record, name) for name in fields.LATE_FIELDS),
        1 if record.get("is_error") else 0,
    ))


def _number(record: dict[str, Any], name: str) -> float | None:
    value = record.get(name)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class FlinkRejection(Rejection):
    """A record the Flink job kept out of its windows (an event time beyond the watermark
    bound, a value out of bounds); the loader dead-letters it with the job's reason."""


def _rejected_record(record: dict[str, Any]) -> Rejection:
    field_name = record.get("field")
    message = record.get("message")
    if not isinstance(field_name, str) or not isinstance(message, str):
        return Rejection("$", "a rejected row needs string `field` and `message`")
    return FlinkRejection(field_name, f"flink: {message} (event_id {record.get('event_id')!r}, "
                                      f"trace_id {record.get('trace_id')!r})")


def _field(record: dict[str, Any], name: str) -> Any:
    value = record.get(name)
    if value is None:
        if name.endswith(("_p50", "_p95", "_p99")):
            return math.nan  # a window whose values were all null has no percentile
        return Rejection(name, "missing")
    if name in _TIME_FIELDS:
        return parse_time(value, name)
    if name in _TEXT_FIELDS:
        return value if isinstance(value, str) and value else Rejection(name, f"must be a non-empty string (got {value!r})")
    if name in _COUNT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return Rejection(name, f"must be a non-negative integer (got {value!r})")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return Rejection(name, f"must be a number (got {value!r})")
    return float(value)


def parse_time(value: Any, name: str) -> datetime | Rejection:
    if not isinstance(value, str):
        return Rejection(name, f"must be an ISO-8601 timestamp (got {value!r})")
    try:
        parsed = datetime.fromisoformat(value.replace(" ", "T"))
    except ValueError:
        return Rejection(name, f"not an ISO-8601 timestamp: {value[:40]!r}")
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
