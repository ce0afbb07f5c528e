"""Tracing: off adds nothing; on, API requests and worker inference produce spans with the event trace id."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ablab.platform import telemetry
from ablab.platform.config import Settings


@pytest.fixture(autouse=True)
def _reset():
    yield
    telemetry.configure(Settings(tracing="off"))


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}")
    def item(item_id: int) -> dict:
        with telemetry.span("inference", trace_id="0af7651916cd43dd8448eb211c80319c", **{"ablab.unit_id": "u1"}):
            return {"id": item_id}

    @app.get("/boom")
    def boom() -> dict:
        raise RuntimeError("boom")

    return app


def test_off_adds_no_middleware_and_no_spans(tmp_path):
    app = _app()
    before = len(app.user_middleware)
    telemetry.instrument(app, Settings(home=tmp_path, tracing="off"))
    assert len(app.user_middleware) == before
    assert not telemetry.enabled()
    with telemetry.span("x", trace_id="0af7651916cd43dd8448eb211c80319c") as current:
        assert current is None


def test_request_span_named_by_route_and_inference_span_keeps_trace_id(tmp_path):
    exporter = InMemorySpanExporter()
    app = _app()
    telemetry.configure(Settings(home=tmp_path), service="test", exporter=exporter)
    app.add_middleware(telemetry._TracingMiddleware)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/items/7").json() == {"id": 7}
        assert client.get("/boom").status_code == 500
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"GET /items/{item_id}", "inference", "GET /boom"}
    inference = spans["inference"]
    assert format(inference.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert inference.attributes["ablab.unit_id"] == "u1"
    assert spans["GET /items/{item_id}"].attributes["http.response.status_code"] == 200
    assert spans["GET /boom"].attributes["http.response.status_code"] == 500
    assert not spans["GET /boom"].status.is_ok


def test_non_hex_trace_id_gets_a_fresh_trace(tmp_path):
    exporter = InMemorySpanExporter()
    telemetry.configure(Settings(home=tmp_path), exporter=exporter)
    with telemetry.span("inference", trace_id="not-hex"):
        pass
    (only,) = exporter.get_finished_spans()
    assert only.context.trace_id != 0


def test_setting_is_validated(tmp_path):
    with pytest.raises(ValueError, match="tracing"):
        Settings(home=tmp_path, tracing="jaeger")
