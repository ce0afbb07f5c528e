"""Event dicts in the docs/contracts.md shape, and where they go.

Sinks share one interface, ``emit(event: dict)``: :class:`ListSink` (tests) and the
SDK's :class:`HttpEventSink` (batches to ``POST /v1/events`` off the request path).
When ``ablab.platform.events`` is importable, every event is validated against the
published schema before it leaves, so a producer bug fails here with the field named.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

from ablab.platform.sdk.sinks import HttpEventSink, ListSink, NullSink

__all__ = ["EventSink", "HttpEventSink", "ListSink", "NullSink", "exposure_event", "inference_event", "rum_event", "feedback_event", "now_iso", "new_trace_id"]


class EventSink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def new_trace_id() -> str:
    return uuid.uuid4().hex


def _common(kind: str, *, trace_id: str, experiment: str | None, variant: str | None, unit_id: str | None, ts: str | None) -> dict[str, Any]:
    event: dict[str, Any] = {"v": 1, "type": kind, "ts": ts or now_iso(), "trace_id": trace_id}
    for key, value in (("experiment", experiment), ("variant", variant), ("unit_id", unit_id)):
        if value is not None:
            event[key] = value
    return event


def exposure_event(*, trace_id: str, experiment: str, variant: str, unit_id: str, ts: str | None = None) -> dict[str, Any]:
    return _common("exposure", trace_id=trace_id, experiment=experiment, variant=variant, unit_id=unit_id, ts=ts)


def inference_event(
    *,
    trace_id: str,
    experiment: str,
    variant: str,
    unit_id: str,
    ttft_ms: float,
    e2e_ms: float,
    tpot_ms: float | None,
    prompt_tokens: int,
    output_tokens: int,
    device_s: float,
    cost_usd: float,
    price_version: str,
    strategy: str,
    error: str | None = None,
    ts: str | None = None,
) -> dict[str, Any]:
    event = _common("inference", trace_id=trace_id, experiment=experiment, variant=variant, unit_id=unit_id, ts=ts)
    event.update(
        ttft_ms=float(ttft_ms),
        e2e_ms=float(e2e_ms),
        tpot_ms=None if tpot_ms is None else float(tpot_ms),
        prompt_tokens=int(prompt_tokens),
        output_tokens=int(output_tokens),
        device_s=float(device_s),
        cost_usd=float(cost_usd),
        price_version=price_version,
        error=error,
        strategy=strategy,
    )
    return event


def rum_event(*, trace_id: str, e2e_ms: float, experiment: str | None = None, variant: str | None = None, unit_id: str | None = None, ts: str | None = None) -> dict[str, Any]:
    event = _common("rum", trace_id=trace_id, experiment=experiment, variant=variant, unit_id=unit_id, ts=ts)
    event["e2e_ms"] = float(e2e_ms)
    return event


def feedback_event(*, trace_id: str, correct: int | None, source: str = "human", score: float | None = None, ts: str | None = None) -> dict[str, Any]:
    event = _common("feedback", trace_id=trace_id, experiment=None, variant=None, unit_id=None, ts=ts)
    if correct is not None:
        event["correct"] = int(correct)
    if score is not None:
        event["score"] = float(score)
    event["source"] = source
    return event


def validate(event: dict[str, Any]) -> None:
    """Raise ValueError naming the field when `event` breaks the published schema."""
    try:
        from ablab.platform.events import Rejection, validate_event
    except ImportError:  # schema module not installed: the API validates on receipt
        return
    result = validate_event(event)
    if isinstance(result, Rejection):
        raise ValueError(f"event does not match the schema: {result}")


class ValidatingSink:
    """Wraps a sink; counts and drops (never sends) events that fail the schema."""

    def __init__(self, inner: EventSink):
        self.inner = inner
        self.invalid = 0
        self.last_error: str | None = None

    def emit(self, event: dict[str, Any]) -> None:
        try:
            validate(event)
        except ValueError as exc:
            self.invalid += 1
            self.last_error = str(exc)
            return
        self.inner.emit(event)

    def close(self) -> None:
        self.inner.close()
