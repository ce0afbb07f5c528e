"""The API's typed edges: a response schema for every route in OpenAPI, and the pipeline
and store wired in as components (their readiness and metrics gathered, their routes 503
when absent), over a real SQLite config database."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.core import CounterMetricFamily

from ablab.platform.api.app import create_app
from ablab.platform.api.ports import Component, IngestPipeline
from ablab.platform.api.state import AppState
from ablab.platform.auth import create_api_key
from ablab.platform.config import Settings
from ablab.platform.errors import PayloadTooLarge
from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
from ablab.platform.registry.migrate import upgrade
from ablab.platform.registry.schemas import Scope

_GENERIC = ({}, {"type": "object"}, {"type": "object", "additionalProperties": True})


def _schema_problem(schema: dict[str, Any] | None) -> str | None:
    if not schema:
        return "no schema"
    bare = {k: v for k, v in schema.items() if k not in ("title", "description")}
    if bare in _GENERIC:
        return f"an untyped schema {schema}"
    return None


def test_every_route_has_a_response_schema() -> None:
    spec = create_app(Settings(analytics=False)).openapi()
    missing = []
    routes = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            routes += 1
            success = {code: r for code, r in operation["responses"].items() if code.startswith("2")}
            if not success:
                missing.append(f"{method.upper()} {path}: no 2xx response")
            for code, response in success.items():
                if code == "204":
                    assert "content" not in response, f"{method.upper()} {path}: 204 with a body"
                    continue
                content = response.get("content") or {}
                if not content:
                    missing.append(f"{method.upper()} {path} {code}: no content")
                for media, body in content.items():
                    if (problem := _schema_problem(body.get("schema"))) is not None:
                        missing.append(f"{method.upper()} {path} {code} {media}: {problem}")
    assert routes > 30
    assert not missing, "\n".join(missing)


def test_the_results_schema_publishes_the_analysis_fields() -> None:
    schemas = create_app(Settings(analytics=False)).openapi()["components"]["schemas"]
    row = schemas["MetricRow"]["properties"]
    assert {"metric", "variant", "estimate", "rel_ci", "p_value_adjusted", "custom", "aggregation", "cuped", "power"} <= set(row)
    assert {"segments", "metrics", "srm", "decisions"} <= set(schemas["Results"]["properties"])
    assert {"series", "window_s"} <= set(schemas["Timeseries"]["properties"])
    assert {"pareto", "factorial"} <= set(schemas["Attribution"]["properties"])


class _Counted:
    """A stand-in pipeline (not a Kafka double: the protocol is the control plane's own)."""

    def __init__(self, state: AppState) -> None:
        self.bodies: list[bytes] = []
        self.closed = False
        self.healthy = True

    def _accept(self, body: bytes) -> Any:
        self.bodies.append(body)
        if len(body) > 100:
            raise PayloadTooLarge("too many events for this test pipeline", field="events")
        return type("Counts", (), {"as_dict": lambda _: {"accepted": 1, "rejected": 0, "errors": []}})()

    def events(self, body: bytes) -> Any:
        return self._accept(body)

    feedback = events

    def billing(self, body: bytes, *, signature: str | None, timestamp: str | None) -> Any:
        return self._accept(body)

    def checks(self) -> Mapping[str, Any]:
        return {"pipeline": lambda: "ok" if self.healthy else "failed: broker away"}

    def collect(self) -> Iterator[Any]:
        yield CounterMetricFamily("ablab_test_pipeline_bodies", "Bodies seen", value=len(self.bodies))

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def wired(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    settings = Settings(home=tmp_path, analytics=False, kafka_bootstrap="127.0.0.1:1")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        _, admin = create_api_key(session, name="admin", scope=Scope.admin)
        _, sdk = create_api_key(session, name="sdk", scope=Scope.sdk)
    engine.dispose()
    made: dict[str, Any] = {"admin": admin, "sdk": sdk}

    def pipeline(state: AppState) -> _Counted:
        made["pipeline"] = _Counted(state)
        return made["pipeline"]

    with TestClient(create_app(settings, ingest=pipeline)) as client:
        yield client, made


def test_components_report_readiness_and_metrics(wired: tuple[TestClient, dict[str, Any]]) -> None:
    client, made = wired
    assert isinstance(made["pipeline"], Component) and isinstance(made["pipeline"], IngestPipeline)
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["pipeline"] == "ok" and checks["database"].startswith("ok (migration ")
    made["pipeline"].healthy = False
    failing = client.get("/readyz")
    assert failing.status_code == 503 and failing.json()["checks"]["pipeline"] == "failed: broker away"
    client.post("/v1/events", content=b"[]", headers={"Authorization": f"Bearer {made['sdk']}"})
    assert "ablab_test_pipeline_bodies_total 1.0" in client.get("/metrics").text


def test_ingest_routes_go_through_the_pipeline(wired: tuple[TestClient, dict[str, Any]]) -> None:
    client, made = wired
    assert client.post("/v1/events", content=b"[]").status_code == 401  # auth before anything else
    auth = {"Authorization": f"Bearer {made['sdk']}"}
    accepted = client.post("/v1/feedback", content=b'{"labels": []}', headers=auth)
    assert accepted.status_code == 202 and accepted.json() == {"accepted": 1, "rejected": 0, "errors": []}
    refused = client.post("/v1/events", content=b"x" * 101, headers=auth)
    assert refused.status_code == 413 and refused.json()["field"] == "events"
    assert made["pipeline"].bodies == [b'{"labels": []}', b"x" * 101]


def test_without_a_store_results_answer_503_naming_the_setting(wired: tuple[TestClient, dict[str, Any]]) -> None:
    client, made = wired
    auth = {"Authorization": f"Bearer {made['admin']}"}
    assert client.get("/v1/experiments/nope/results").status_code == 401
    assert client.get("/v1/experiments/nope/results", headers=auth).status_code == 404  # CurrentExperiment first
    created = client.post("/v1/experiments", headers=auth, json={
        "key": "exp", "name": "exp", "traffic": 1.0, "control": "a",
        "variants": [{"key": "a", "weight": 0.5}, {"key": "b", "weight": 0.5}]})
    assert created.status_code == 201, created.text
    answer = client.get("/v1/experiments/exp/results", headers=auth)
    assert answer.status_code == 503 and "ABLAB_ANALYTICS" in answer.json()["detail"]


def test_the_pipeline_is_closed_with_the_app(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, analytics=False)
    upgrade(settings.resolved_database_url)
    made: list[_Counted] = []
    with TestClient(create_app(settings, ingest=lambda s: made.append(_Counted(s)) or made[-1])):
        assert not made[0].closed
    assert made[0].closed
