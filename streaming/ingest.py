"""HTTP ingestion, framework-free: validate what clients send and forward it to Kafka.

The API's routers (``POST /v1/events``, ``/v1/feedback``, ``/v1/webhooks/billing``) pass
the raw request body here together with an :class:`EventSink` (the
:class:`~ablab.streaming.kafka.emitter.Emitter`) and return what these functions return:

- per-event problems never fail the request: the valid events are forwarded, each invalid
  one is dead-lettered with its reason and listed in ``errors`` (``{index, field,
  message}``); the route answers 202 with :meth:`IngestResult.as_dict`;
- a problem with the whole request (body too large, not JSON, bad signature, stale
  timestamp) raises :class:`IngestRejected` carrying the HTTP status, the field and the
  message; the body is dead-lettered too, except for signature failures (an attacker
  must not be able to fill the dead-letter topic).

Everything is counted in :class:`IngestStats` (the API exports it to ``/metrics``).

Billing webhooks are signed like Stripe's: header ``X-Ablab-Timestamp: <unix seconds>``
and ``X-Ablab-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>." + raw body>`` with
``Settings.webhook_secret``. The signature is compared in constant time, and a timestamp
more than ``tolerance_s`` (default 300 s) away from now is refused, so a captured request
cannot be replayed later. Records get a deterministic ``event_id`` (the provider's ``id``,
else a hash of the record), so a webhook retried by the provider is deduplicated
downstream instead of billed twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

from ablab.streaming.events import Rejection, validate_event

MAX_BODY_BYTES = 1024 * 1024
MAX_BATCH_EVENTS = 1000
SIGNATURE_HEADER = "X-Ablab-Signature"
TIMESTAMP_HEADER = "X-Ablab-Timestamp"
DEFAULT_TOLERANCE_S = 300.0


class EventSink(Protocol):
    def emit(self, event: Any) -> None: ...

    def dead_letter(self, *, raw: Any, rejection: Rejection, source: str) -> None: ...


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


KnownExperiment = Callable[[str], bool]


# --- POST /v1/events --------------------------------------------------------------------


def ingest_events(
    *, body: bytes | str | Any, sink: EventSink, stats: IngestStats, known_experiment: KnownExperiment | None = None,
) -> IngestResult:
    """A batch of events: a JSON list, ``{"events": [...]}``, or one event object."""
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="events", list_key="events")
    return _forward(items, sink=sink, stats=stats, endpoint="events", known_experiment=known_experiment,
                    prepare=lambda item: item)


# --- POST /v1/feedback ------------------------------------------------------------------


def ingest_feedback(
    *, body: bytes | str | Any, sink: EventSink, stats: IngestStats, now: datetime | None = None,
) -> IngestResult:
    """Labels ``{trace_id, correct?, score?, source, ts?}`` (one object, a list, or ``{"labels": [...]}``).

    ``ts`` defaults to the time received; the label is joined to its request by trace_id.
    """
    received = _iso(now or datetime.now(UTC))
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="feedback", list_key="labels")

    def prepare(item: Any) -> Any:
        if isinstance(item, Mapping):
            if "type" in item and item["type"] != "feedback":
                return Rejection("type", f"labels are feedback; got type {item['type']!r}")
            return {"type": "feedback", "ts": received, **item}
        return item

    return _forward(items, sink=sink, stats=stats, endpoint="feedback", known_experiment=None, prepare=prepare)


# --- POST /v1/webhooks/billing ----------------------------------------------------------


def sign_billing(*, body: bytes, secret: str, timestamp: int) -> str:
    """The ``X-Ablab-Signature`` value for ``body`` sent at ``timestamp`` (for senders and tests)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify_billing_signature(
    *, body: bytes, signature: str | None, timestamp: str | None, secret: str, now: float | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> None:
    """Raise :class:`IngestRejected` (401) unless the signature and timestamp are valid."""
    if not signature:
        raise IngestRejected(401, SIGNATURE_HEADER, f"missing {SIGNATURE_HEADER} header")
    if not timestamp:
        raise IngestRejected(401, TIMESTAMP_HEADER, f"missing {TIMESTAMP_HEADER} header")
    try:
        sent_at = int(timestamp)
    except ValueError:
        raise IngestRejected(401, TIMESTAMP_HEADER, f"{TIMESTAMP_HEADER} must be unix seconds") from None
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance_s:
        raise IngestRejected(401, TIMESTAMP_HEADER,
                             f"timestamp is {current - sent_at:+.0f} s from now; the tolerance is {tolerance_s:.0f} s")
    expected = sign_billing(body=body, secret=secret, timestamp=sent_at)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        raise IngestRejected(401, SIGNATURE_HEADER, "signature does not match the body")


def ingest_billing(
    *, body: bytes, signature: str | None, timestamp: str | None, secret: str, sink: EventSink, stats: IngestStats,
    now: float | None = None, tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> IngestResult:
    """Verify the webhook, then turn ``{"records": [...]}`` into ``cost`` events."""
    try:
        verify_billing_signature(body=body, signature=signature, timestamp=timestamp, secret=secret, now=now,
                                 tolerance_s=tolerance_s)
    except IngestRejected as exc:
        stats.add("billing.bad_signature")
        raise exc
    received = _iso(datetime.fromtimestamp(time.time() if now is None else now, UTC))
    items = _parse_batch(body, sink=sink, stats=stats, endpoint="billing", list_key="records")

    def prepare(item: Any) -> Any:
        if not isinstance(item, Mapping):
            return item
        record = dict(item)
        provider_id = record.pop("id", None)
        if provider_id is not None and not isinstance(provider_id, str):
            return Rejection("id", "record id must be a string")
        record.setdefault("event_id", provider_id or _content_id(item))
        record.setdefault("ts", record.get("period_end") or received)
        record.setdefault("type", "cost")
        if record["type"] != "cost":
            return Rejection("type", f"billing records are cost events; got type {record['type']!r}")
        return record

    return _forward(items, sink=sink, stats=stats, endpoint="billing", known_experiment=None, prepare=prepare)


# --- shared -----------------------------------------------------------------------------


def _parse_batch(body: Any, *, sink: EventSink, stats: IngestStats, endpoint: str, list_key: str) -> list[Any]:
    stats.add(f"{endpoint}.requests")
    if isinstance(body, (bytes, bytearray, str)):
        raw = body.encode() if isinstance(body, str) else bytes(body)
        if len(raw) > MAX_BODY_BYTES:
            return _refuse(413, "$", f"body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", raw=raw[:8192],
                           sink=sink, stats=stats, endpoint=endpoint, reason="oversized")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _refuse(400, "$", f"malformed JSON: {exc}", raw=raw, sink=sink, stats=stats, endpoint=endpoint,
                           reason="malformed")
    if isinstance(body, Mapping) and list_key in body:
        if set(body) != {list_key}:
            extra = sorted(set(body) - {list_key})[0]
            return _refuse(400, extra, "unknown field", raw=body, sink=sink, stats=stats, endpoint=endpoint,
                           reason="malformed")
        body = body[list_key]
    items = [body] if isinstance(body, Mapping) else body
    if not isinstance(items, list):
        return _refuse(400, "$", f"expected a JSON object or a list, got {type(body).__name__}", raw=body,
                       sink=sink, stats=stats, endpoint=endpoint, reason="malformed")
    if len(items) > MAX_BATCH_EVENTS:
        return _refuse(413, "$", f"{len(items)} items in one request; the limit is {MAX_BATCH_EVENTS}",
                       raw=items[:10], sink=sink, stats=stats, endpoint=endpoint, reason="oversized")
    return items


def _refuse(status: int, field_name: str, message: str, *, raw: Any, sink: EventSink, stats: IngestStats,
            endpoint: str, reason: str) -> NoReturn:
    stats.add(f"{endpoint}.{reason}")
    sink.dead_letter(raw=raw, rejection=Rejection(field_name, message), source=endpoint)
    raise IngestRejected(status, field_name, message)


def _forward(
    items: list[Any], *, sink: EventSink, stats: IngestStats, endpoint: str,
    known_experiment: KnownExperiment | None, prepare: Callable[[Any], Any],
) -> IngestResult:
    accepted, errors = 0, []
    for index, item in enumerate(items):
        prepared = prepare(item)
        outcome = prepared if isinstance(prepared, Rejection) else validate_event(prepared)
        if not isinstance(outcome, Rejection):
            experiment = getattr(outcome, "experiment", None)
            if known_experiment is not None and experiment is not None and not known_experiment(experiment):
                outcome = Rejection("experiment", f"unknown experiment {experiment!r}")
        if isinstance(outcome, Rejection):
            errors.append({"index": index, **outcome.as_dict()})
            stats.add(f"{endpoint}.rejected.{outcome.field}")
            sink.dead_letter(raw=item, rejection=outcome, source=endpoint)
            continue
        sink.emit(outcome)
        accepted += 1
    stats.add(f"{endpoint}.accepted", accepted)
    stats.add(f"{endpoint}.rejected", len(errors))
    return IngestResult(accepted=accepted, rejected=len(errors), errors=tuple(errors))


def _content_id(record: Mapping[str, Any]) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return "bill-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
