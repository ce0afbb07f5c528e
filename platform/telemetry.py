"""OpenTelemetry tracing that can be switched on: ``ABLAB_TRACING=off|console|otlp``.

Off by default, and then nothing is imported and no middleware is added: the hooks in the
API and the worker cost one attribute check. ``console`` prints spans to stderr;
``otlp`` ships them over OTLP/HTTP to ``ABLAB_OTLP_ENDPOINT`` (a collector, Jaeger, Tempo).

The worker's inference span takes the event ``trace_id`` as its OpenTelemetry trace id
(both are 128-bit hex), so a trace found in ClickHouse opens in the tracing UI as is.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from typing import Any

from ablab.platform.config import Settings, get_settings

_HEX128 = re.compile(r"^[0-9a-f]{32}$")
_tracer: Any = None  # an opentelemetry Tracer once configure() turned tracing on


def configure(settings: Settings | None = None, *, service: str = "ablab", exporter: Any = None) -> Any:
    """Install a tracer provider per the settings; returns the tracer, or None when off.

    ``exporter`` overrides the one the settings name (tests pass an in-memory exporter).
    """
    global _tracer
    settings = settings or get_settings()
    if settings.tracing == "off" and exporter is None:
        _tracer = None
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.tracing == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Batched: the request path never waits on the collector.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
    # A provider of our own rather than the global one: tests can configure twice.
    _tracer = provider.get_tracer("ablab")
    return _tracer


def enabled() -> bool:
    return _tracer is not None


def _parent_context(trace_id: str | None) -> Any:
    """A remote parent carrying ``trace_id``, so the child span shares it; None if not 128-bit hex."""
    if not trace_id or not _HEX128.match(trace_id):
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    parent = SpanContext(int(trace_id, 16), secrets.randbits(64) or 1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextlib.contextmanager
def span(name: str, *, trace_id: str | None = None, **attributes: Any) -> Iterator[Any]:
    """A span when tracing is on (with ``trace_id`` as its trace id when it is 128-bit hex), else nothing."""
    if _tracer is None:
        yield None
        return
    clean = {k: v for k, v in attributes.items() if v is not None}
    with _tracer.start_as_current_span(name, context=_parent_context(trace_id), attributes=clean) as current:
        yield current


class _TracingMiddleware:
    """Pure ASGI: one server span per HTTP request, named by method and route template."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or _tracer is None:
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind, Status, StatusCode

        status: dict[str, int] = {}

        async def _send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        with _tracer.start_as_current_span(
            f"{scope['method']} {scope['path']}", kind=SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
        ) as current:
            try:
                await self.app(scope, receive, _send)
            finally:
                route = scope.get("route")
                if route is not None and getattr(route, "path", None):
                    current.update_name(f"{scope['method']} {route.path}")  # template, not the raw path
                    current.set_attribute("http.route", route.path)
                code = status.get("code", 500)
                current.set_attribute("http.response.status_code", code)
                if code >= 500:
                    current.set_status(Status(StatusCode.ERROR))


def instrument(app: Any, settings: Settings | None = None, *, service: str = "ablab-api") -> None:
    """The hook the API and the worker call: adds the middleware only when tracing is on."""
    if configure(settings, service=service) is not None:
        app.add_middleware(_TracingMiddleware)
