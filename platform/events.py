"""Event schemas: the one definition of what producers may put on the bus.

Five event types (docs/contracts.md, "Events"), one pydantic model each, joined in a
discriminated union on ``type``. Every event carries the schema version ``v``, its event
time ``ts`` (ISO-8601 with an explicit offset, normalised to UTC), a ``trace_id`` that
joins worker-side, client-side, label and billing records of one request, and an
``event_id`` that makes each record unique (the loader and the Flink job deduplicate on
it, so a redelivered record is never counted twice).

``experiment``, ``variant`` and ``unit_id`` are required where the producer knows them
(``exposure``, ``inference``) and optional on events joined later by ``trace_id``
(``rum``, ``feedback``, ``cost``): a labeler or a billing system rarely knows the variant.

Validation is strict (no ``"12"`` → 12, no ``true`` → 1) and rejects unknown fields, so a
typo in a producer is an error with the field named, not a silently missing metric.
:func:`validate_event` turns any raw input into either an :data:`Event` or a
:class:`Rejection`; it never raises on bad data.

Physical bounds live in one table, :data:`FIELD_BOUNDS` (a view of the field catalogue,
:mod:`ablab.platform.fields`): a latency over a day, a negative
or non-finite number, a cost over :data:`MAX_COST_USD` is not a measurement and is refused
with the field named (it would otherwise poison every aggregate it reaches). Event times
are bounded twice: statically here (:data:`TS_RANGE`, so nothing outside what the stores
can hold passes any validation), and against the receiving clock at the edge with
:func:`check_event_time` (a few minutes ahead at most, not older than the retention).

Identity: :func:`derive_event_id` gives a record without an ``event_id`` a deterministic
one (an inference event from its ``trace_id``, any other from its content); the models
apply it, and so must every producer that writes to Kafka directly.

The published JSON Schemas under ``platform/schemas/<type>.json`` are generated from
these models (``python -m ablab.platform.events``); a unit test keeps them equal.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ablab.platform.fields import AT_MOST, FIELDS

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_EVENT_BYTES = 64 * 1024
"""Largest serialized event accepted (bytes of its JSON)."""
MAX_OUTPUT_TEXT_CHARS = 8_192
"""Longest answer text a (shadow) inference event carries: 32 KiB of UTF-8 at most."""
MAX_JSON_DEPTH = 32
"""Deepest JSON nesting accepted in an event or an ingestion body (an event is 3 deep)."""

EVENT_TYPES = ("exposure", "inference", "rum", "feedback", "cost")
STORED_SHADOW_TYPE = "shadow"
"""The store's ``type`` of an inference event with ``shadow_of`` (``InferenceEvent.stored_type``)."""
SCHEMA_DIR = Path(__file__).parent / "schemas"

_ID_PATTERN = r"^[A-Za-z0-9_.:\-]+$"  # printable, no spaces: safe as a Kafka key and in SQL


# --- physical bounds ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Bound:
    """The physical range of one numeric field, inclusive: outside it a value is not a measurement."""

    lo: float
    hi: float
    unit: str
    why: str

    def describe(self) -> str:
        return f"{self.lo:,.0f}..{self.hi:,.0f} {self.unit}".rstrip()


FIELD_BOUNDS: Mapping[str, Bound] = MappingProxyType({
    f.name: Bound(f.lo, f.hi, f.unit, f.why) for f in FIELDS.values()
})
"""Per-field bounds every event model takes its numeric constraints from: a view of the
field catalogue (:mod:`ablab.platform.fields`), the one place a field is declared."""

TS_RANGE = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))
"""Event times any validation accepts, clock-free (ClickHouse DateTime64 holds 1900-2299)."""


MeasureName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
"""Name of a custom measure or dimension: lower snake case, so it is a column name anywhere."""
MAX_MEASURES = 32
MAX_DIMS = 16
MEASURE_BOUND = Bound(-1e12, 1e12, "", "a custom measurement is a bounded number")
MeasureValue = Annotated[float, Field(ge=MEASURE_BOUND.lo, le=MEASURE_BOUND.hi, allow_inf_nan=False)]


def bounded(name: str) -> Any:
    """The pydantic constraints of field ``name`` from :data:`FIELD_BOUNDS`."""
    bound = FIELD_BOUNDS[name]
    return Field(ge=bound.lo, le=bound.hi, allow_inf_nan=False, description=f"{bound.unit}; {bound.why}".lstrip("; "))


def _iso_ms(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _utc_timestamp(value: Any) -> Any:
    """Accept an ISO-8601 string or an aware datetime; return an aware UTC datetime.

    Naive times are refused: a producer in another zone would otherwise shift every
    window silently. Numbers are refused too (seconds or milliseconds is a guess). Times
    outside :data:`TS_RANGE` are refused: no store or watermark can take them.
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
    try:
        parsed = parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is past datetime.max in UTC
        raise ValueError(f"{value} is outside {TS_RANGE[0].year}..{TS_RANGE[1].year - 1}") from None
    if not TS_RANGE[0] <= parsed < TS_RANGE[1]:
        raise ValueError(f"{_iso_ms(parsed)} is outside {TS_RANGE[0].year}..{TS_RANGE[1].year - 1}")
    return parsed


def _bool_as_int(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


UtcTimestamp = Annotated[datetime, BeforeValidator(_utc_timestamp)]
Identifier = Annotated[str, Field(min_length=1, max_length=128, pattern=_ID_PATTERN)]


def _field_error(field: str, message: str) -> PydanticCustomError:
    """A model-level check's error that still names its field (see :func:`validate_event`)."""
    return PydanticCustomError("ablab_field", message, {"field": field})


# --- identity ----------------------------------------------------------------------------

_TIME_FIELDS = frozenset({"ts", "period_start", "period_end"})


def derive_event_id(record: Mapping[str, Any]) -> str:
    """The deterministic ``event_id`` of a record that came without one.

    - ``inference``: from its ``trace_id`` alone. An inference event *is* its request, so
      every delivery of it (a client retrying after a timeout, a replayed batch, a producer
      writing to Kafka directly) gets the same id, whatever else differs.
    - every other type: from its content, the record without ``event_id`` as canonical
      JSON (sorted keys; null fields dropped; times as UTC milliseconds; ``v`` defaulted;
      80.0 written as 80, true as 1), so the same record sent twice is one event and two
      different records are two, and the id of a record as sent equals that of the record
      as validated (what the models derive).

    128 bits of SHA-256, hex. Any record given its own ``event_id`` keeps it.
    """
    kind = record.get("type")
    trace = record.get("trace_id")
    if kind == "inference" and isinstance(trace, str) and trace:
        basis = "inference\x1f" + trace
    else:
        content = {k: v for k, v in record.items() if k != "event_id"}
        content.setdefault("v", SCHEMA_VERSION)
        basis = "content\x1f" + json.dumps(_canonical(content), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(basis.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _canonical(value: Any, key: str | None = None) -> Any:
    """One spelling per value, so a record as sent and as validated hash alike: no null
    fields, booleans as 0/1, integral floats as ints, times as UTC milliseconds."""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, str(k)) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if key in _TIME_FIELDS and isinstance(value, (str, datetime)):
        try:
            return _iso_ms(_utc_timestamp(value))
        except ValueError:
            return value
    return value


class _EventBase(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: Literal[1] = Field(default=SCHEMA_VERSION, description="Schema version of this record.")
    # Never None after validation: _derive_missing_event_id fills it in.
    event_id: Identifier | None = Field(
        default=None,
        description="Unique per record. When absent or null: derived from the trace_id (inference) or the content.",
    )
    ts: UtcTimestamp = Field(description="Event time, ISO-8601 with offset, stored as UTC.")
    trace_id: Identifier = Field(description="Joins one request's worker, client, label and billing records.")

    @model_validator(mode="after")
    def _derive_missing_event_id(self) -> Any:
        # After validation, not before: a "before" hook makes pydantic build a dict of every
        # record, which cost the loader's JSON fast path 60 % even for records that have an id.
        if self.event_id is None:
            object.__setattr__(self, "event_id", derive_event_id(self.model_dump(exclude={"event_id"})))
        return self

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


class _PolicyChoice(BaseModel):
    """What a policy variant chose for the request (docs/policies.md): its arm, the exact
    probability it had, and the model version that gave it, so off-policy evaluation can
    re-weigh the request. Absent on a fixed variant's events (a fixed variant may still log
    ``propensity``: its weight share)."""

    arm: MeasureName | None = Field(default=None, description="The policy's arm that served the request.")
    propensity: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        default=None, description="Probability of this arm (policy) or of this variant (weight share), in (0, 1].")
    policy_version: Identifier | None = Field(
        default=None, description="The policy model version that decided (uniform:<hash>, rule:<hash> or a model's).")


class ExposureEvent(_PolicyChoice, _Assigned):
    """The unit was assigned to ``variant`` and served by it."""

    type: Literal["exposure"]


class InferenceEvent(_PolicyChoice, _Assigned):
    """Worker-side measurement of one request (metric definitions: docs/architecture.md)."""

    type: Literal["inference"]
    ttft_ms: Annotated[float, bounded("ttft_ms")]
    e2e_ms: Annotated[float, bounded("e2e_ms")]
    tpot_ms: Annotated[float, bounded("tpot_ms")] | None = Field(default=None, description="Null when output_tokens <= 1.")
    prompt_tokens: Annotated[int, bounded("prompt_tokens")]
    output_tokens: Annotated[int, bounded("output_tokens")]
    device_s: Annotated[float, bounded("device_s")] = Field(description="Device-seconds attributed to this request.")
    cost_usd: Annotated[float, bounded("cost_usd")]
    price_version: Identifier = Field(description="Version of the price table used for cost_usd.")
    error: Annotated[str, Field(min_length=1, max_length=256)] | None = Field(
        default=None, description="Error code when the request failed; null on success."
    )
    strategy: Identifier = Field(description="Content hash (or name) of the strategy that served the request.")
    measures: dict[MeasureName, MeasureValue] | None = Field(
        default=None, max_length=MAX_MEASURES,
        description="Any other numeric measurement of the request (tool calls, ITL, a backend's own "
                    "timings), by name; stored with the event.",
    )
    dims: dict[MeasureName, Annotated[str, Field(min_length=1, max_length=128)]] | None = Field(
        default=None, max_length=MAX_DIMS,
        description="Segment dimensions of the request (task domain, prompt-length bucket), by name.",
    )
    shadow_of: Identifier | None = Field(
        default=None,
        description="Set on a shadow request's own event: the trace_id of the primary request it mirrored. Its "
                    "answer was never returned; it is compared with its primary, never counted in a variant.",
    )
    output_text: Annotated[str, Field(max_length=MAX_OUTPUT_TEXT_CHARS)] | None = Field(
        default=None,
        description="A shadow's answer, for graders (its answer is never returned to the caller): at most "
                    f"{MAX_OUTPUT_TEXT_CHARS:,} characters, so the event stays within {MAX_EVENT_BYTES // 1024} KiB.",
    )
    shadow: Literal["sent", "dropped"] | None = Field(
        default=None,
        description="On a primary request chosen for shadowing: sent (a shadow was launched) or dropped (the "
                    "shadow's concurrency cap was full). Absent when not chosen.",
    )

    @model_validator(mode="after")
    def _coherent_latencies(self) -> InferenceEvent:
        for name, bound, _ in AT_MOST:  # the catalogue's order rules (first token before the last)
            if getattr(self, name) > getattr(self, bound):
                raise _field_error(name, f"{name} ({getattr(self, name)}) exceeds {bound} ({getattr(self, bound)})")
        if self.output_text is not None and self.shadow_of is None:
            raise _field_error("output_text", "only a shadow's event carries its answer text")
        if self.shadow_of is not None and self.shadow is not None:
            raise _field_error("shadow", "a shadow request has no shadow of its own")
        if self.shadow_of is not None and self.shadow_of == self.trace_id:
            raise _field_error("shadow_of", "a shadow has its own trace_id, not its primary's")
        return self

    @property
    def stored_type(self) -> str:
        """The ``type`` its store row carries: ``shadow`` for a shadow request, so every
        reader of ``type = 'inference'`` (windows, rollup, results) leaves shadows out."""
        return STORED_SHADOW_TYPE if self.shadow_of is not None else self.type


class RumEvent(_Joined):
    """Client-side (real-user) end-to-end latency of a request."""

    type: Literal["rum"]
    e2e_ms: Annotated[float, bounded("e2e_ms")]


class FeedbackEvent(_Joined):
    """A label for a request; may arrive minutes after it."""

    type: Literal["feedback"]
    correct: Annotated[Literal[0, 1], BeforeValidator(_bool_as_int)] | None = None
    score: Annotated[float, bounded("score")] | None = None
    source: Literal["human", "auto", "judge"]

    @model_validator(mode="after")
    def _has_label(self) -> FeedbackEvent:
        if self.correct is None and self.score is None:
            raise _field_error("correct", "feedback needs `correct` (0/1) and/or `score`")
        return self


class CostEvent(_Joined):
    """Billed cost for one request, or for a resource over a period."""

    type: Literal["cost"]
    trace_id: Identifier | None = None  # type: ignore[assignment]  # a resource-period record has none
    cost_usd: Annotated[float, bounded("cost_usd")]
    resource: Identifier | None = None
    period_start: UtcTimestamp | None = None
    period_end: UtcTimestamp | None = None
    price_version: Identifier | None = None

    @model_validator(mode="after")
    def _attributable(self) -> CostEvent:
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
    raises for bad input (JSON nested too deep included).
    """
    if isinstance(raw, (bytes, bytearray, str)):
        size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
        if size > MAX_EVENT_BYTES:
            return Rejection("$", f"event is {size} bytes; the limit is {MAX_EVENT_BYTES}")
        try:
            # Fast path: pydantic-core parses and validates in one pass (the loader's hot
            # path). Anything it refuses takes the path below, which names the field.
            return _EVENT_ADAPTER.validate_json(raw)
        except ValidationError:
            pass
        parsed = parse_json(raw)
        if isinstance(parsed, Rejection):
            return parsed
        raw = parsed
    if not isinstance(raw, Mapping):
        return Rejection("$", f"an event must be a JSON object, got {type(raw).__name__}")
    if json_depth_exceeds(raw, MAX_JSON_DEPTH):
        return _too_deep()
    version = raw.get("v", SCHEMA_VERSION)
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        return Rejection("v", f"unsupported schema version {_short(version)}; supported: {list(SUPPORTED_VERSIONS)}")
    try:
        return _EVENT_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        return _first_rejection(exc)


def parse_json(raw: bytes | bytearray | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that returns a :class:`Rejection` for malformed or too deeply nested input.

    A body nested deeper than the interpreter's recursion limit makes ``json.loads`` raise
    ``RecursionError``; anything nested deeper than ``max_depth`` is refused as well, so no
    later recursive step (validation, ``repr``, ``json.dumps``) can hit that limit.
    """
    try:
        value = json.loads(raw)
    except RecursionError:
        return _too_deep(max_depth)
    except (ValueError, UnicodeDecodeError) as exc:
        return Rejection("$", f"malformed JSON: {exc}")
    if json_depth_exceeds(value, max_depth):
        return _too_deep(max_depth)
    return value


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests objects/arrays more than ``limit`` deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)  # exact types first: parsed JSON is dicts and lists, ABC checks are slow
        if kind is dict or (kind is not list and isinstance(node, Mapping)):
            children: Any = node.values()
        elif kind is list or isinstance(node, tuple):
            children = node
        else:
            continue
        if depth > limit:
            return True
        for child in children:
            if type(child) in _CONTAINERS or (not isinstance(child, _SCALARS) and isinstance(child, (Mapping, tuple))):
                stack.append((child, depth + 1))
    return False


_CONTAINERS = (dict, list)
_SCALARS = (str, int, float, type(None))


def _too_deep(limit: int = MAX_JSON_DEPTH) -> Rejection:
    return Rejection("$", f"JSON nested more than {limit} levels deep; events are 3 deep")


def check_event_time(event: Any, *, now: datetime, max_ahead_s: float, max_age_s: float) -> Rejection | None:
    """Refuse an event time more than ``max_ahead_s`` ahead of the receiving clock ``now``, or
    older than ``max_age_s`` (the retention; settings ``event_max_ahead_s``, ``event_max_age_s``).

    The edge's check (the API calls it with the time a request arrived): one event time in
    the future would move its partition's watermark there and make every later event late.
    """
    ts = event.ts
    if ts > now + timedelta(seconds=max_ahead_s):
        ahead = (ts - now).total_seconds()
        return Rejection("ts", f"{_iso_ms(ts)} is {ahead:,.0f} s ahead of the receiving clock ({_iso_ms(now)}); "
                               f"at most {max_ahead_s:,.0f} s is accepted: check the producer's clock")
    if ts < now - timedelta(seconds=max_age_s):
        age = (now - ts).total_seconds()
        return Rejection("ts", f"{_iso_ms(ts)} is {age:,.0f} s old; events older than {max_age_s:,.0f} s "
                               f"(the retention) are refused")
    return None


def _first_rejection(exc: ValidationError) -> Rejection:
    error = exc.errors(include_url=False)[0]
    kind, loc, message = error["type"], error["loc"], error["msg"]
    if kind == "union_tag_not_found":
        return Rejection("type", f"missing `type`; one of {list(EVENT_TYPES)}")
    if kind == "union_tag_invalid":
        got = error["input"].get("type") if isinstance(error.get("input"), Mapping) else None
        return Rejection("type", f"`type` must be one of {list(EVENT_TYPES)}; got {_short(got)}")
    if kind == "ablab_field":
        return Rejection(error["ctx"]["field"], message)
    path = ".".join(str(part) for part in loc[1:])  # loc[0] is the discriminator tag
    if kind == "extra_forbidden":
        return Rejection(path, "unknown field")
    message = message.removeprefix("Value error, ")
    bound = FIELD_BOUNDS.get(path)
    if bound is not None and kind in _BOUND_ERRORS:
        message = f"{message}; {bound.why} (range {bound.describe()})"
    if kind != "missing" and "input" in error:
        message = f"{message} (got {type(error['input']).__name__} {_short(error['input'])})"
    return Rejection(path or "$", message)


_BOUND_ERRORS = frozenset({"greater_than_equal", "less_than_equal", "finite_number"})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def topic_key(event: _EventBase) -> bytes:
    """Kafka key: the trace_id (so a request's records share a partition), else the resource."""
    key = event.trace_id or getattr(event, "resource", None) or event.event_id
    return key.encode()


# --- heartbeats ---------------------------------------------------------------------------

HEARTBEAT_TYPE = "heartbeat"
_HEARTBEAT_MARK = b'"type":"heartbeat"'


def heartbeat_record(moment: datetime) -> bytes:
    """A record that says "the producer's clock is at ``moment``" on one partition of the
    inference topic. It carries no measurement: the stream job reads only its ``ts`` (so the
    watermark advances while no request arrives and the last windows close), the loader
    skips it, and the edge refuses the type (it is not an event anyone may send)."""
    return b'{"v":1,' + _HEARTBEAT_MARK + b',"ts":"' + _iso_ms(moment).encode() + b'"}'


def is_heartbeat(value: bytes) -> bool:
    """Whether a Kafka value is a :func:`heartbeat_record` (exactly its shape, so no event
    can pass for one)."""
    return value.startswith(b'{"v":1,' + _HEARTBEAT_MARK + b',"ts":"') and len(value) <= 64


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


if __name__ == "__main__":  # python -m ablab.platform.events  → regenerate schemas/
    for path in write_json_schemas():
        print(path)
