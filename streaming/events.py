"""Event schemas: the one definition of what producers may put on the bus.

Five event types (CONTRACTS.md, "Events"), one pydantic model each, joined in a
discriminated union on ``type``. Every event carries the schema version ``v``, its event
time ``ts`` (ISO-8601 with an explicit offset, normalised to UTC), a ``trace_id`` that
joins worker-side, client-side, label and billing records of one request, and an
``event_id`` that makes each record unique (the loader deduplicates on it, so a replayed
record is never counted twice).

``experiment``, ``variant`` and ``unit_id`` are required where the producer knows them
(``exposure``, ``inference``) and optional on events joined later by ``trace_id``
(``rum``, ``feedback``, ``cost``): a labeler or a billing system rarely knows the variant.

Validation is strict (no ``"12"`` → 12, no ``true`` → 1) and rejects unknown fields, so a
typo in a producer is an error with the field named, not a silently missing metric.
:func:`validate_event` turns any raw input into either an :data:`Event` or a
:class:`Rejection`; it never raises on bad data.

The published JSON Schemas under ``streaming/schemas/<type>.json`` are generated from
these models (``python -m ablab.streaming.events``); a unit test keeps them equal.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_EVENT_BYTES = 64 * 1024
"""Largest serialized event accepted (bytes of its JSON)."""

EVENT_TYPES = ("exposure", "inference", "rum", "feedback", "cost")
SCHEMA_DIR = Path(__file__).parent / "schemas"

_ID_PATTERN = r"^[A-Za-z0-9_.:\-]+$"  # printable, no spaces: safe as a Kafka key and in SQL


def _utc_timestamp(value: Any) -> Any:
    """Accept an ISO-8601 string or an aware datetime; return an aware UTC datetime.

    Naive times are refused: a producer in another zone would otherwise shift every
    window silently. Numbers are refused too (seconds or milliseconds is a guess).
    """
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO-8601 timestamp: {value[:40]!r}") from None
    else:
        raise ValueError("must be an ISO-8601 string such as 2026-01-31T12:00:00.000Z")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ValueError("timestamp needs an explicit UTC offset (end it with Z or +00:00)")
    return parsed.astimezone(UTC)


def _bool_as_int(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


UtcTimestamp = Annotated[datetime, BeforeValidator(_utc_timestamp)]
Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=_ID_PATTERN)]
NonNegative = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=10_000_000)]


def _field_error(field: str, message: str) -> PydanticCustomError:
    """A model-level check's error that still names its field (see :func:`validate_event`)."""
    return PydanticCustomError("ablab_field", message, {"field": field})


def new_event_id() -> str:
    return uuid.uuid4().hex


class _EventBase(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: Literal[1] = Field(default=SCHEMA_VERSION, description="Schema version of this record.")
    event_id: Identifier = Field(
        default_factory=new_event_id, description="Unique per record; set by the producer for idempotent retries."
    )
    ts: UtcTimestamp = Field(description="Event time, ISO-8601 with offset, stored as UTC.")
    trace_id: Identifier = Field(description="Joins one request's worker, client, label and billing records.")

    @field_validator("v", mode="before")
    @classmethod
    def _version_is_not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # JSON true would otherwise pass as Literal[1]
            raise ValueError(f"unsupported schema version {value!r}; supported: {list(SUPPORTED_VERSIONS)}")
        return value

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json().encode()


class _Assigned(_EventBase):
    experiment: Identifier
    variant: Identifier
    unit_id: Identifier


class _Joined(_EventBase):
    """Events that arrive from outside the worker; the trace_id join fills the rest."""

    experiment: Identifier | None = None
    variant: Identifier | None = None
    unit_id: Identifier | None = None


class ExposureEvent(_Assigned):
    """The unit was assigned to ``variant`` and served by it."""

    type: Literal["exposure"]


class InferenceEvent(_Assigned):
    """Worker-side measurement of one request (metric definitions: DESIGN.md)."""

    type: Literal["inference"]
    ttft_ms: NonNegative
    e2e_ms: NonNegative
    tpot_ms: NonNegative | None = Field(default=None, description="Null when output_tokens <= 1.")
    prompt_tokens: Count
    output_tokens: Count
    device_s: NonNegative = Field(description="Device-seconds attributed to this request.")
    cost_usd: NonNegative
    price_version: Identifier = Field(description="Version of the price table used for cost_usd.")
    error: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Error code when the request failed; null on success."
    )
    strategy: Identifier = Field(description="Content hash (or name) of the strategy that served the request.")

    @model_validator(mode="after")
    def _coherent_latencies(self) -> "InferenceEvent":
        if self.ttft_ms > self.e2e_ms:
            raise _field_error("ttft_ms", f"ttft_ms ({self.ttft_ms}) exceeds e2e_ms ({self.e2e_ms})")
        return self


class RumEvent(_Joined):
    """Client-side (real-user) end-to-end latency of a request."""

    type: Literal["rum"]
    e2e_ms: NonNegative


class FeedbackEvent(_Joined):
    """A label for a request; may arrive minutes after it."""

    type: Literal["feedback"]
    correct: Annotated[Literal[0, 1], BeforeValidator(_bool_as_int)] | None = None
    score: Annotated[float, Field(ge=-1e9, le=1e9, allow_inf_nan=False)] | None = None
    source: Literal["human", "auto", "judge"]

    @model_validator(mode="after")
    def _has_label(self) -> "FeedbackEvent":
        if self.correct is None and self.score is None:
            raise _field_error("correct", "feedback needs `correct` (0/1) and/or `score`")
        return self


class CostEvent(_Joined):
    """Billed cost for one request, or for a resource over a period."""

    type: Literal["cost"]
    trace_id: Identifier | None = None  # type: ignore[assignment]  # a resource-period record has none
    cost_usd: NonNegative
    resource: Identifier | None = None
    period_start: UtcTimestamp | None = None
    period_end: UtcTimestamp | None = None
    price_version: Identifier | None = None

    @model_validator(mode="after")
    def _attributable(self) -> "CostEvent":
        if self.trace_id is None and (self.resource is None or self.period_start is None or self.period_end is None):
            raise _field_error("trace_id", "cost needs a trace_id, or a resource with period_start and period_end")
        if self.period_start and self.period_end and self.period_end < self.period_start:
            raise _field_error("period_end", "period_end is before period_start")
        return self


Event: TypeAlias = Annotated[
    ExposureEvent | InferenceEvent | RumEvent | FeedbackEvent | CostEvent,
    Field(discriminator="type"),
]
EVENT_MODELS: dict[str, type[_EventBase]] = {
    "exposure": ExposureEvent,
    "inference": InferenceEvent,
    "rum": RumEvent,
    "feedback": FeedbackEvent,
    "cost": CostEvent,
}
_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a raw event was refused: the offending field (dotted path) and a message."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


def validate_event(raw: bytes | str | Mapping[str, Any]) -> ExposureEvent | InferenceEvent | RumEvent | FeedbackEvent | CostEvent | Rejection:
    """Validate one raw event (JSON bytes/text or an already parsed mapping).

    Returns the model, or a :class:`Rejection` naming the first offending field. Never
    raises for bad input.
    """
    if isinstance(raw, (bytes, bytearray, str)):
        size = len(raw.encode() if isinstance(raw, str) else raw)
        if size > MAX_EVENT_BYTES:
            return Rejection("$", f"event is {size} bytes; the limit is {MAX_EVENT_BYTES}")
        try:
            # Fast path: pydantic-core parses and validates in one pass (the loader's hot
            # path). Anything it refuses takes the path below, which names the field.
            return _EVENT_ADAPTER.validate_json(raw)
        except ValidationError:
            pass
        try:
            raw = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return Rejection("$", f"malformed JSON: {exc}")
    if not isinstance(raw, Mapping):
        return Rejection("$", f"an event must be a JSON object, got {type(raw).__name__}")
    version = raw.get("v", SCHEMA_VERSION)
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        return Rejection("v", f"unsupported schema version {version!r}; supported: {list(SUPPORTED_VERSIONS)}")
    try:
        return _EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        return _first_rejection(exc)


def _first_rejection(exc: ValidationError) -> Rejection:
    error = exc.errors(include_url=False)[0]
    kind, loc, message = error["type"], error["loc"], error["msg"]
    if kind == "union_tag_not_found":
        return Rejection("type", f"missing `type`; one of {list(EVENT_TYPES)}")
    if kind == "union_tag_invalid":
        got = error["input"].get("type") if isinstance(error.get("input"), Mapping) else None
        return Rejection("type", f"`type` must be one of {list(EVENT_TYPES)}; got {got!r}")
    if kind == "ablab_field":
        return Rejection(error["ctx"]["field"], message)
    path = ".".join(str(part) for part in loc[1:])  # loc[0] is the discriminator tag
    if kind == "extra_forbidden":
        return Rejection(path, "unknown field")
    message = message.removeprefix("Value error, ")
    if kind != "missing" and "input" in error:
        message = f"{message} (got {type(error['input']).__name__} {_short(error['input'])})"
    return Rejection(path or "$", message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def topic_key(event: _EventBase) -> bytes:
    """Kafka key: the trace_id (so a request's records share a partition), else the resource."""
    key = event.trace_id or getattr(event, "resource", None) or event.event_id
    return key.encode()


# --- dead letters ----------------------------------------------------------------------

DEAD_LETTER_RAW_LIMIT = 8 * 1024


def dead_letter_record(*, raw: Any, rejection: Rejection, source: str, received_at: datetime | None = None) -> bytes:
    """The JSON value written to the dead-letter topic for a refused input.

    The raw input is kept (truncated to 8 KiB) so an operator can see what was sent.
    """
    if isinstance(raw, (bytes, bytearray)):
        text = bytes(raw[:DEAD_LETTER_RAW_LIMIT]).decode("utf-8", errors="replace")
    elif isinstance(raw, str):
        text = raw[:DEAD_LETTER_RAW_LIMIT]
    else:
        try:
            text = json.dumps(raw, default=str)[:DEAD_LETTER_RAW_LIMIT]
        except (TypeError, ValueError):
            text = repr(raw)[:DEAD_LETTER_RAW_LIMIT]
    record = {
        "v": SCHEMA_VERSION,
        "source": source,
        "received_at": (received_at or datetime.now(UTC)).isoformat().replace("+00:00", "Z"),
        "field": rejection.field,
        "message": rejection.message,
        "raw": text,
    }
    return json.dumps(record, separators=(",", ":")).encode()


# --- published JSON Schema -------------------------------------------------------------


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema per event type, plus ``event`` for the union."""
    schemas = {name: model.model_json_schema() for name, model in EVENT_MODELS.items()}
    schemas["event"] = _EVENT_ADAPTER.json_schema()
    for name, schema in schemas.items():
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://ablab.dev/schemas/v{SCHEMA_VERSION}/{name}.json"
    return schemas


def render_schema(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_json_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in json_schemas().items():
        path = directory / f"{name}.json"
        path.write_text(render_schema(schema))
        written.append(path)
    return written


if __name__ == "__main__":  # python -m ablab.streaming.events  → regenerate schemas/
    for path in write_json_schemas():
        print(path)
