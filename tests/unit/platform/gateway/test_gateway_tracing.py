"""Spans carry the OpenTelemetry GenAI attribute names."""

from __future__ import annotations

import httpx
import pytest

from ablab_testing.gateway_harness import gateway_for


def test_a_request_yields_a_genai_span(backend, tmp_path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)  # once per process; later calls are ignored with a warning
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another test set the global tracer provider first")
    with gateway_for(backend.url, tmp_path) as gw, httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": [{"role": "user", "content": "x"}],
                                                            "stream": True, "user": "span-unit"})
        assert r.status_code == 200
    spans = [s for s in exporter.get_finished_spans() if s.attributes.get("ablab.trace_id") == r.headers["x-ablab-trace-id"]]
    assert len(spans) == 1
    attrs = spans[0].attributes
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "ok"
    assert attrs["gen_ai.usage.output_tokens"] == 9 and attrs["gen_ai.usage.input_tokens"] == 11
    assert attrs["gen_ai.client.operation.time_to_first_chunk"] >= 0 and attrs["ablab.experiment"] == "exp"
