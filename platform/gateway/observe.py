"""Prometheus metrics and OpenTelemetry spans (GenAI semantic-convention attribute names).

Spans go through the OpenTelemetry API: without a configured SDK they are no-ops, so a
deployment opts in with its usual ``OTEL_*`` set-up and the gateway pays ~nothing otherwise.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ablab.platform.fields import otel_attributes

OTEL_ATTRIBUTES = otel_attributes()  # field → (span attribute, factor from the field's unit)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("ablab_gateway_requests", "Requests by endpoint, backend and outcome.",
                                ("endpoint", "backend", "outcome"), registry=r)
        self.ttft = Histogram("ablab_gateway_ttft_seconds", "Time to first generated token.", ("backend",),
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("ablab_gateway_e2e_seconds", "Request start to last token.", ("backend",),
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.inflight = Gauge("ablab_gateway_inflight", "Requests in flight per backend.", ("backend",), registry=r)
        self.events = Counter("ablab_gateway_events", "Events written to the outbox, or refused.", ("result",), registry=r)
        self.tokens = Counter("ablab_gateway_tokens", "Tokens by backend and direction.", ("backend", "direction"), registry=r)
        # Shadows apart from the requests above: they are not callers' requests.
        self.shadows = Counter("ablab_gateway_shadows", "Shadow requests by experiment and result: sent (launched), "
                               "dropped (its concurrency cap was full: never queued), ok, failed (timeout or error).",
                               ("experiment", "result"), registry=r)
        self.shadow_failures = Counter("ablab_gateway_shadow_failures", "Failed shadows by experiment and reason.",
                                       ("experiment", "reason"), registry=r)
        self.shadow_inflight = Gauge("ablab_gateway_shadow_inflight", "Shadow requests in flight.", ("experiment",), registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:  # the API package is optional in a minimal install
        return None
    return trace.get_tracer("ablab.gateway")


def start_span(t: Any, *, operation: str, model: str | None, backend: str, trace_id: str) -> Any:
    if t is None:
        return None
    from opentelemetry.trace import SpanKind

    attrs = {"gen_ai.operation.name": operation, "gen_ai.provider.name": backend, "ablab.trace_id": trace_id}
    if model:
        attrs["gen_ai.request.model"] = model
    return t.start_span(f"{operation} {model or ''}".strip(), kind=SpanKind.CLIENT, attributes=attrs)


def end_span(span: Any, event: dict[str, Any] | None, *, error: str | None, experiment: str | None, variant: str | None) -> None:
    if span is None:
        return
    if event is not None:
        for name, (attribute, factor) in OTEL_ATTRIBUTES.items():  # GenAI semantic conventions
            if event.get(name) is not None:
                value = event[name]
                span.set_attribute(attribute, value if factor == 1 else value * factor)
    if experiment:
        span.set_attribute("ablab.experiment", experiment)
        span.set_attribute("ablab.variant", variant or "")
    if error:
        span.set_attribute("error.type", error)
    span.end()
