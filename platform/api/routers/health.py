"""Liveness, readiness and Prometheus metrics (no auth, except ``/metrics`` where
``Settings.metrics_auth`` asks for a viewer-scope token).

``/readyz`` fails (503) while a component this process runs or depends on is failing: the
config DB, ClickHouse, the in-process loader (cannot store, or stalled with records
waiting), the emitter's spool (dropping, or backlogged beyond a bound) and, where this
process runs the loader, the stream job (records to read and no checkpoint for a minute).
``/metrics`` exports the same components' counters, last success times and lags through a
prometheus_client collector: fixed metric names, the varying parts as labels. Each
component (``ports.Component``) names its own checks and metric families; this module only
gathers them. Its labels name experiments, variants and backends, which a deployment may not
want public: with ``ABLAB_METRICS_AUTH`` a scrape needs the same bearer token as the
read-only API (the app's own auth: an admin, editor or viewer key; 401/403 problems).

``/v1/backends`` (viewer) says whether each LLM backend a gateway serves is answering, and
if not why (a llama.cpp backend whose wheel is still building reports the build's
progress): what the dashboard shows for an experiment that has no events yet. A component
with a ``backends()`` method supplies the rows (``ablab.cli.backends``, wired by
``ablab.cli.wiring``); without one the list is empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector
from pydantic import BaseModel

from ablab.platform.api.deps import StateDep, Viewer, require
from ablab.platform.api.ports import Probe
from ablab.platform.api.problems import problem, responses
from ablab.platform.api.state import AppState
from ablab.platform.errors import Forbidden, Unauthorized
from ablab.platform.registry.schemas import Scope

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    """``checks``: one line per component, "ok …" or "failed: …" with what to do next."""

    status: Literal["ready"] = "ready"
    checks: dict[str, str]


@router.get("/healthz", response_model=Liveness)
def healthz() -> Liveness:
    return Liveness()


def _database(state: AppState) -> str:
    from ablab.platform.registry.migrate import revision_of

    try:
        revision = revision_of(state.engine)
    except Exception as exc:
        return f"failed: {type(exc).__name__}"
    if revision is None:
        return "failed: the config database has no migrations applied"
    return f"ok (migration {revision})"


@router.get("/readyz", response_model=Readiness,
            responses={503: {"description": "Not ready (application/problem+json with the same `checks`)"}})
def readyz(state: StateDep) -> Response:
    checks: dict[str, str] = {}
    probes: dict[str, Probe] = {"database": lambda: _database(state)}
    for component in state.running():
        probes.update(component.checks())
    for name, probe in probes.items():
        try:
            checks[name] = probe()
        except Exception as exc:
            checks[name] = f"failed: {type(exc).__name__}: {exc}"
    failed = [k for k, v in checks.items() if v.startswith("failed")]
    if failed:
        hint = " (run `ablab db upgrade`?)" if "database" in failed else ""
        return problem(503, "Not ready", f"not ready: {', '.join(failed)}{hint}", checks=checks)
    return JSONResponse(Readiness(checks=checks).model_dump())


class ComponentCollector(Collector):
    """The running components' own metric families, read at scrape time."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Any]:
        for component in self.state.running():
            yield from component.collect()


_viewer = require(Scope.viewer)


def metrics_reader(state: StateDep, authorization: Annotated[str | None, Header()] = None) -> None:
    """Nothing when ``/metrics`` is public (the default); else a viewer-scope bearer token."""
    if state.settings.metrics_auth:
        _viewer(state, authorization)


@router.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(metrics_reader)],
            responses={200: {"description": "Prometheus text exposition format"}, **responses(Unauthorized, Forbidden)})
def metrics(state: StateDep) -> Response:
    components = CollectorRegistry(auto_describe=False)
    components.register(ComponentCollector(state))
    body = generate_latest(state.metrics.registry) + generate_latest(components)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


class BackendState(BaseModel):
    """One LLM backend: ``state`` is ``serving``, ``starting`` (installed, not answering
    yet), ``building`` (its runtime is compiling; ``progress`` 0..1 when known),
    ``failed``, ``not built`` or ``unreachable``; ``detail`` says it in words."""

    name: str
    kind: str
    default: bool = False
    state: str
    progress: float | None = None
    detail: str = ""


class Backends(BaseModel):
    items: list[BackendState]
    checked_at: str | None = None  # ISO-8601 UTC time of the probes


@router.get("/v1/backends", response_model=Backends, tags=["health"], responses=responses(Unauthorized, Forbidden))
def backends(_: Viewer, state: StateDep) -> Backends:
    items: list[BackendState] = []
    checked_at = None
    for component in state.components:
        report = getattr(component, "backends", None)
        if callable(report):
            found = report()
            items.extend(BackendState.model_validate(row) for row in found.get("items", []))
            checked_at = found.get("checked_at") or checked_at
    return Backends(items=items, checked_at=checked_at)
