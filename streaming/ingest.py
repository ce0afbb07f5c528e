"""HTTP ingestion, framework-free: validate what clients send and forward it to Kafka.

The API's routers (``POST /v1/events``, ``/v1/feedback``, ``/v1/webhooks/billing``) pass
the raw request body here together with an :class:`EventSink` (the
:class:`~ablab.streaming.kafka.emitter.Emitter`) and return what these functions return:

- per-event problems never fail the request: the valid events are forwarded, each invalid
  one is dead-lettered with its reason and listed in ``errors`` (``{index, field,
  message}``); the route answers 202 with :meth:`IngestResult.as_dict`. Invalid means: not
  the schema, outside a field's physical bounds (``ablab.platform.events.FIELD_BOUNDS``),
  an event time too far ahead of the receiving clock or older than the retention, or an
  experiment or variant the registry does not have;
- a problem with the whole request (body too large, not JSON, nested too deep, bad
  signature, stale timestamp, replayed delivery) raises :class:`IngestRejected` carrying the
  HTTP status, the field and the message; the body is dead-lettered too, except for
  signature and replay failures (an attacker must not be able to fill the dead-letter topic).

Identity: a record without an ``event_id`` gets
:func:`~ablab.platform.events.derive_event_id` (an inference event from its ``trace_id``,
others from their content as sent, before the ingest fills in defaults such as a label's
receive time), so a client retrying a POST after a timeout sends the same events again,
not new ones.

Everything is counted in :class:`IngestStats` (the API exports it to ``/metrics``);
rejections are counted per field, with unknown field names folded into ``other`` so a
client cannot create counters without bound.

Billing webhooks are signed like Stripe's: header ``X-Ablab-Timestamp: <unix seconds>``
and ``X-Ablab-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>." + raw body>`` with
``Settings.webhook_secret``. The signature is compared in constant time; a timestamp more
than ``webhook_tolerance_s`` (default 300 s) away from now is refused, and each signed
delivery is accepted once: its signature is remembered by a :class:`ReplayGuard` until its
timestamp leaves the window (the API's guard is a table in the shared config DB, so a
replay is refused by every API process). A provider retrying signs again with a new
timestamp; its records keep their ``event_id`` (the provider's ``id``, else the content
rule), so the retry is deduplicated downstream instead of billed twice.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

from ablab.platform.config import Settings
from ablab.platform.events import (
    EVENT_MODELS,
    MAX_JSON_DEPTH,
    Rejection,
    check_event_time,
    derive_event_id,
    parse_json,
    validate_event,
)

MAX_BATCH_EVENTS = 1000
SIGNATURE_HEADER = "X-Ablab-Signature"
TIMESTAMP_HEADER = "X-Ablab-Timestamp"
_UNIX_SECONDS = re.compile(r"^[0-9]{1,12}$")  # up to year 33658: a number, not a payload


def _setting_default(name: str) -> Any:
    return Settings.model_fields[name].default


@dataclass(frozen=True)
class EdgeLimits:
    """What the edge accepts; the API builds it from the settings of the same names."""

    max_body_bytes: int = _setting_default("max_body_bytes")
    max_batch_events: int = MAX_BATCH_EVENTS
    max_depth: int = MAX_JSON_DEPTH
    max_ahead_s: float = _setting_default("event_max_ahead_s")
    max_age_s: float = _setting_default("event_max_age_s")
    webhook_tolerance_s: float = _setting_default("webhook_tolerance_s")

    @classmethod
    def from_settings(cls, settings: Settings) -> EdgeLimits:
        return cls(max_body_bytes=settings.max_body_bytes, max_ahead_s=settings.event_max_ahead_s,
                   max_age_s=settings.event_max_age_s, webhook_tolerance_s=settings.webhook_tolerance_s)


MAX_BODY_BYTES = EdgeLimits.max_body_bytes


class EventSink(Protocol):
    def emit(self, event: Any) -> None: ...

    def dead_letter(self, *, raw: Any, rejection: Rejection, source: str) -> None: ...


class ReplayGuard(Protocol):
    def first_seen(self, key: str, *, expires_at: float) -> bool:
        """Record ``key`` until ``expires_at`` (unix seconds); False if it is already recorded."""
        ...


class IngestRejected(Exception):
    """The whole request is refused; ``status_code`` is the HTTP status to answer."""

    def __init__(self, status_code: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status_code, self.field, self.message = status_code, field, message


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    rejected: int
    errors: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": self.rejected, "errors": list(self.errors)}


# Rejections are counted per field; only names the schema has (or these) get a counter.
COUNTED_FIELDS = frozenset(
    {name for model in EVENT_MODELS.values() for name in model.model_fields}
    | {"$", "id", "experiment", "variant", SIGNATURE_HEADER, TIMESTAMP_HEADER}
)


def counted_field(name: str) -> str:
    """``name`` when it is a field of the event schema, else ``other`` (bounded counter names)."""
    return name if name in COUNTED_FIELDS else "other"


@dataclass
class IngestStats:
    """Thread-safe counters: accepted/rejected per endpoint, rejections per field."""

    counts: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                self.counts[name] = self.counts.get(name, 0) + n

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


VariantsOf = Callable[[str], Collection[str] | None]
"""An experiment's variant keys, or None when the registry has no such experiment."""


class MemoryReplayGuard:
    """Signatures seen by this process, each kept until its timestamp leaves the window.

    For a single process and tests; the API uses the config DB (shared by its processes).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def first_seen(self, key: str, *, expires_at: float) -> bool:
        with self._lock:
            now = self._clock()
            if len(self._seen) > 10_000:
                self._seen = {k: t for k, t in self._seen.items() if t > now}
            known = self._seen.get(key)
            if known is not None and known > now:
                return False
            self._seen[key] = expires_at
            return True


# --- POST /v1/events --------------------------------------------------------------------


def ingest_events(
    *, body: bytes | str | Any, sink: EventSink, stats: IngestStats, variants_of: VariantsOf | None = None,
    limits: EdgeLimits = EdgeLimits(), now: datetime | None = None,
) -> IngestResult:
    """A batch of events: a JSON list, ``{"events": [...]}``, or one event object."""
    received = now or datetime.now(UTC)
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="events", list_key="events", limits=limits)
    return _forward(items, sink=sink, stats=stats, endpoint="events", variants_of=variants_of, limits=limits,
                    received=received, prepare=lambda item: item)


# --- POST /v1/feedback ------------------------------------------------------------------


def ingest_feedback(
    *, body: bytes | str | Any, sink: EventSink, stats: IngestStats, variants_of: VariantsOf | None = None,
    limits: EdgeLimits = EdgeLimits(), now: datetime | None = None,
) -> IngestResult:
    """Labels ``{trace_id, correct?, score?, source, ts?}`` (one object, a list, or ``{"labels": [...]}``).

    ``ts`` defaults to the time received; the label is joined to its request by trace_id.
    """
    received = now or datetime.now(UTC)
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="feedback", list_key="labels", limits=limits)

    def prepare(item: Mapping[str, Any]) -> Any:
        if "type" in item and item["type"] != "feedback":
            return Rejection("type", f"labels are feedback; got type {str(item['type'])[:40]!r}")
        record = {"type": "feedback", **item}
        # The id before the receive-time default: a label re-sent without ts is the same label.
        if record.get("event_id") is None:
            record["event_id"] = derive_event_id(record)
        record.setdefault("ts", _iso(received))
        return record

    return _forward(items, sink=sink, stats=stats, endpoint="feedback", variants_of=variants_of, limits=limits,
                    received=received, prepare=prepare)


# --- POST /v1/webhooks/billing ----------------------------------------------------------


def sign_billing(*, body: bytes, secret: str, timestamp: int) -> str:
    """The ``X-Ablab-Signature`` value for ``body`` sent at ``timestamp`` (for senders and tests)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_billing_signature(
    *, body: bytes, signature: str | None, timestamp: str | None, secret: str, now: float | None = None,
    tolerance_s: float = EdgeLimits.webhook_tolerance_s,
) -> int:
    """Raise :class:`IngestRejected` (401) unless the signature and timestamp are valid; return the timestamp."""
    if not signature:
        raise IngestRejected(401, SIGNATURE_HEADER, f"missing {SIGNATURE_HEADER} header")
    if not timestamp:
        raise IngestRejected(401, TIMESTAMP_HEADER, f"missing {TIMESTAMP_HEADER} header")
    if not _UNIX_SECONDS.match(timestamp.strip()):
        raise IngestRejected(401, TIMESTAMP_HEADER, f"{TIMESTAMP_HEADER} must be unix seconds (at most 12 digits)")
    sent_at = int(timestamp.strip())
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance_s:
        raise IngestRejected(401, TIMESTAMP_HEADER,
                             f"timestamp is {current - sent_at:+.0f} s from now; the tolerance is {tolerance_s:.0f} s")
    expected = sign_billing(body=body, secret=secret, timestamp=sent_at)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode("utf-8", "replace")):
        raise IngestRejected(401, SIGNATURE_HEADER, "signature does not match the body")
    return sent_at


def delivery_key(*, timestamp: int, signature: str) -> str:
    """What a :class:`ReplayGuard` remembers of one signed delivery (a digest, fixed length)."""
    return hashlib.sha256(f"{timestamp}.{signature.strip()}".encode()).hexdigest()


def ingest_billing(
    *, body: bytes, signature: str | None, timestamp: str | None, secret: str, sink: EventSink, stats: IngestStats,
    replay_guard: ReplayGuard, variants_of: VariantsOf | None = None, limits: EdgeLimits = EdgeLimits(),
    now: float | None = None,
) -> IngestResult:
    """Verify the webhook and that it is not a replay, then turn ``{"records": [...]}`` into ``cost`` events."""
    current = time.time() if now is None else now
    try:
        sent_at = verify_billing_signature(body=body, signature=signature, timestamp=timestamp, secret=secret,
                                           now=current, tolerance_s=limits.webhook_tolerance_s)
    except IngestRejected:
        stats.add("billing.requests")
        stats.add("billing.bad_signature")
        raise
    assert signature is not None  # verified above
    if not replay_guard.first_seen(delivery_key(timestamp=sent_at, signature=signature),
                                   expires_at=sent_at + limits.webhook_tolerance_s):
        stats.add("billing.requests")
        stats.add("billing.replayed")
        raise IngestRejected(409, SIGNATURE_HEADER, "this signed delivery was already received; a retry must be "
                                                    "signed again with the current timestamp")
    received = datetime.fromtimestamp(current, UTC)
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="billing", list_key="records", limits=limits)

    def prepare(item: Mapping[str, Any]) -> Any:
        record = dict(item)
        provider_id = record.pop("id", None)
        if provider_id is not None and not isinstance(provider_id, str):
            return Rejection("id", "record id must be a string")
        record.setdefault("type", "cost")
        if record["type"] != "cost":
            return Rejection("type", f"billing records are cost events; got type {str(record['type'])[:40]!r}")
        if record.get("event_id") is None:
            record["event_id"] = provider_id or derive_event_id(record)
        record.setdefault("ts", record.get("period_end") or _iso(received))
        return record

    return _forward(items, sink=sink, stats=stats, endpoint="billing", variants_of=variants_of, limits=limits,
                    received=received, prepare=prepare)


# --- shared -----------------------------------------------------------------------------


def _parse_batch(
    body: Any, *, sink: EventSink, stats: IngestStats, endpoint: str, list_key: str, limits: EdgeLimits,
) -> list[Any]:
    stats.add(f"{endpoint}.requests")
    if isinstance(body, (bytes, bytearray, str)):
        raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
        if len(raw) > limits.max_body_bytes:
            return _refuse(413, "$", f"body is {len(raw)} bytes; the limit is {limits.max_body_bytes}", raw=raw[:8192],
                           sink=sink, stats=stats, endpoint=endpoint, reason="oversized")
        parsed = parse_json(raw, max_depth=limits.max_depth)
        if isinstance(parsed, Rejection):
            reason = "too_deep" if "nested" in parsed.message else "malformed"
            return _refuse(400, parsed.field, parsed.message, raw=raw, sink=sink, stats=stats, endpoint=endpoint,
                           reason=reason)
        body = parsed
    if isinstance(body, Mapping) and list_key in body:
        if set(body) != {list_key}:
            extra = sorted(str(k) for k in set(body) - {list_key})[0]
            return _refuse(400, extra[:64], "unknown field", raw=body, sink=sink, stats=stats, endpoint=endpoint,
                           reason="malformed")
        body = body[list_key]
    items = [body] if isinstance(body, Mapping) else body
    if not isinstance(items, list):
        return _refuse(400, "$", f"expected a JSON object or a list, got {type(body).__name__}", raw=body,
                       sink=sink, stats=stats, endpoint=endpoint, reason="malformed")
    if len(items) > limits.max_batch_events:
        return _refuse(413, "$", f"{len(items)} items in one request; the limit is {limits.max_batch_events}",
                       raw=items[:10], sink=sink, stats=stats, endpoint=endpoint, reason="oversized")
    return items


def _refuse(status: int, field_name: str, message: str, *, raw: Any, sink: EventSink, stats: IngestStats,
            endpoint: str, reason: str) -> NoReturn:
    stats.add(f"{endpoint}.{reason}")
    sink.dead_letter(raw=raw, rejection=Rejection(field_name, message), source=endpoint)
    raise IngestRejected(status, field_name, message)


def _forward(
    items: list[Any], *, sink: EventSink, stats: IngestStats, endpoint: str, variants_of: VariantsOf | None,
    limits: EdgeLimits, received: datetime, prepare: Callable[[Mapping[str, Any]], Any],
) -> IngestResult:
    accepted, errors = 0, []
    for index, item in enumerate(items):
        # A record is an object. validate_event also parses JSON text (the loader's Kafka
        # values are bytes), so a string element would otherwise be parsed as an event and
        # skip ``prepare``: a label endpoint storing an exposure, a billing record that is
        # not a cost. No producer sends events as strings inside a batch.
        prepared = (prepare(item) if isinstance(item, Mapping)
                    else Rejection("$", f"each record must be a JSON object, got {type(item).__name__}"))
        outcome = prepared if isinstance(prepared, Rejection) else validate_event(prepared)
        if not isinstance(outcome, Rejection):
            outcome = (check_event_time(outcome, now=received, max_ahead_s=limits.max_ahead_s,
                                        max_age_s=limits.max_age_s)
                       or _check_assignment(outcome, variants_of) or outcome)
        if isinstance(outcome, Rejection):
            errors.append({"index": index, **outcome.as_dict()})
            stats.add(f"{endpoint}.rejected.{counted_field(outcome.field)}")
            sink.dead_letter(raw=item, rejection=outcome, source=endpoint)
            continue
        sink.emit(outcome)
        accepted += 1
    stats.add(f"{endpoint}.accepted", accepted)
    stats.add(f"{endpoint}.rejected", len(errors))
    return IngestResult(accepted=accepted, rejected=len(errors), errors=tuple(errors))


def _check_assignment(event: Any, variants_of: VariantsOf | None) -> Rejection | None:
    """An event naming an experiment must name one the registry has, and one of its variants."""
    experiment = getattr(event, "experiment", None)
    if variants_of is None or experiment is None:
        return None
    variants = variants_of(experiment)
    if variants is None:
        return Rejection("experiment", f"unknown experiment {experiment!r}")
    variant = getattr(event, "variant", None)
    if variant is not None and variant not in variants:
        return Rejection("variant", f"experiment {experiment!r} has no variant {variant!r}; it has {sorted(variants)}")
    return None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
