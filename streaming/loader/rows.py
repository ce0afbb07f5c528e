"""Kafka record → ClickHouse row: pure functions, no I/O.

:func:`route` decides, for one record of one topic, which table it goes to and with what
values, or why it is refused (a :class:`~ablab.streaming.events.Rejection`, which the
loader dead-letters and counts). Raw events are validated by the one schema
(:func:`ablab.streaming.events.validate_event`); window rows written by the Flink job are
checked here, field by field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ablab.streaming.events import MAX_EVENT_BYTES, Rejection, validate_event

RAW_COLUMNS = (
    "event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id",
    "ttft_ms", "e2e_ms", "tpot_ms", "prompt_tokens", "output_tokens", "device_s", "cost_usd",
    "price_version", "error", "strategy", "correct", "score", "source", "payload",
    "kafka_partition", "kafka_offset",
)
WINDOW_COLUMNS = (
    "experiment", "variant", "window_start", "window_end", "n", "errors",
    "e2e_sum", "e2e_sumsq", "ttft_sum", "ttft_sumsq", "tpot_n", "tpot_sum", "tpot_sumsq",
    "cost_sum", "cost_sumsq", "prompt_tokens_sum", "prompt_tokens_sumsq",
    "output_tokens_sum", "output_tokens_sumsq",
    "e2e_p50", "e2e_p95", "e2e_p99", "ttft_p50", "ttft_p95", "ttft_p99", "emitted_at",
)
LATE_COLUMNS = (
    "event_id", "type", "ts", "trace_id", "experiment", "variant", "window_start", "watermark", "e2e_ms",
)
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "raw_events": RAW_COLUMNS,
    "window_stats": WINDOW_COLUMNS,
    "late_events": LATE_COLUMNS,
}
_WINDOW_MS = 10_000
_COUNT_FIELDS = {"n", "errors", "tpot_n"}
_TIME_FIELDS = {"window_start", "window_end", "emitted_at", "ts", "watermark"}
_TEXT_FIELDS = {"experiment", "variant", "event_id", "trace_id"}


@dataclass(frozen=True, slots=True)
class Routed:
    table: str
    row: tuple[Any, ...]


KnownExperiments = Callable[[], Collection[str]] | None


def route(
    *, topic: str, value: bytes | None, partition: int, offset: int, windows_topic: str,
    known_experiments: Collection[str] | None = None,
) -> Routed | Rejection:
    """The table and row for one Kafka record, or the reason it is refused."""
    if value is None:
        return Rejection("$", "empty record (tombstone)")
    if len(value) > MAX_EVENT_BYTES:
        return Rejection("$", f"record is {len(value)} bytes; the limit is {MAX_EVENT_BYTES}")
    if topic == windows_topic:
        return _window_record(value, known_experiments)
    event = validate_event(value)
    if isinstance(event, Rejection):
        return event
    experiment = getattr(event, "experiment", None)
    if known_experiments is not None and experiment is not None and experiment not in known_experiments:
        return Rejection("experiment", f"unknown experiment {experiment!r}")
    return Routed("raw_events", raw_event_row(event, payload=value, partition=partition, offset=offset))


def raw_event_row(event: Any, *, payload: bytes, partition: int, offset: int) -> tuple[Any, ...]:
    # Events differ in fields. Reading the model's __dict__ avoids pydantic's __getattr__
    # fallback for absent names, which raised and caught an AttributeError per missing
    # column and was the loader's largest cost (benchmarks/bench_loader.py).
    get = vars(event).get
    return (
        event.event_id, event.type, event.ts, get("trace_id") or "", get("experiment") or "",
        get("variant") or "", get("unit_id") or "",
        get("ttft_ms"), get("e2e_ms"), get("tpot_ms"), get("prompt_tokens"), get("output_tokens"),
        get("device_s"), get("cost_usd"), get("price_version") or "", get("error"), get("strategy") or "",
        get("correct"), get("score"), get("source") or "", payload.decode("utf-8", errors="replace"),
        partition, offset,
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
    elif kind == "late":
        return _late_record(record, known_experiments)
    else:
        return Rejection("kind", f"`kind` must be inference or late; got {kind!r}")
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
    e2e = record.get("e2e_ms")
    return Routed("late_events", (
        values["event_id"], event_type, ts, values["trace_id"], experiment, record.get("variant") or "",
        window_start, values["watermark"], float(e2e) if isinstance(e2e, (int, float)) else None,
    ))


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
