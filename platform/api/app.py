"""``create_app()``: the ablab HTTP API. Engines and clients are built in the lifespan."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI

from ablab.platform.api import problems
from ablab.platform.api.limits import BodyLimitMiddleware
from ablab.platform.api.policy_refresh import policy_refresher
from ablab.platform.api.ports import AnalyticsBackend, IngestPipeline
from ablab.platform.api.routers import assign, experiments, factors, health, keys, layers, results, ship
from ablab.platform.api.routers import ingest as ingest_routes
from ablab.platform.api.routers import ope as ope_routes
from ablab.platform.api.routers import policy_models as policy_model_routes
from ablab.platform.api.state import AppState
from ablab.platform.config import Settings, get_settings
from ablab.platform.registry.db import make_engine, make_sessionmaker

# Builders of what the app runs beside its routes, called in the lifespan with the AppState.
T = TypeVar("T")
Factory = Callable[[AppState], T]
# Anything else to run with the app: an object with `close()` (and, to report readiness and
# metrics, the `checks()` and `collect()` of `ports.Component`).
Extension = Callable[[AppState], Any]


class _MetricsMiddleware:
    """Counts and times requests by route template (pure ASGI: no per-request task)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status_holder = [500]

        async def _send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status_holder[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            state: AppState | None = getattr(scope["app"].state, "ablab", None) if "app" in scope else None
            if state is not None:
                state.metrics.requests.labels(scope["method"], template, str(status_holder[0])).inc()
                state.metrics.latency.labels(template).observe(time.perf_counter() - start)


# How long shutdown waits for one component. The loader can be stuck for 30 s inside a
# Kafka client bootstrapping against an absent broker; nothing it holds is lost by not
# waiting (offsets are committed only after its inserts), while a supervisor's SIGKILL
# after its own timeout would lose the emitter's unspooled events.
SHUTDOWN_STEP_S = 5.0


def _close_bounded(component: Any, timeout_s: float = SHUTDOWN_STEP_S) -> None:
    import logging
    import threading

    thread = threading.Thread(target=component.close, name=f"close-{type(component).__name__}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logging.getLogger(__name__).warning("%s did not close within %.0f s; leaving it to the process exit",
                                            type(component).__name__, timeout_s)


def _guardrails(state: AppState) -> Any:
    from ablab.platform.analytics.guardian import GuardrailMonitor

    assert state.analytics is not None
    return GuardrailMonitor(state.sessions, state.analytics, interval_s=state.settings.guardrail_interval_s,
                            settings=state.settings, sync_rollup=state.analytics.sync_rollup)


def create_app(
    settings: Settings | None = None,
    *,
    ingest: Factory[IngestPipeline] | None = None,
    analytics: Factory[AnalyticsBackend] | None = None,
    extensions: list[Extension] | None = None,
) -> FastAPI:
    """The API. ``ingest`` and ``analytics`` build the event pipeline and the analytics store
    (``ablab.cli.wiring`` passes the Kafka and ClickHouse ones); without them their routes
    answer 503. ``analytics`` is started only when ``settings.analytics`` is on."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.resolved_database_url)
        state = AppState.build(settings, engine, make_sessionmaker(engine))
        app.state.ablab = state
        started: list[Any] = []
        try:
            if ingest is not None:
                state.ingest = ingest(state)
                started.append(state.ingest)
            if analytics is not None and settings.analytics:
                state.analytics = analytics(state)
                started.append(state.analytics)
                if settings.guardrail_interval_s > 0:
                    state.components.append(_guardrails(state))
                if (refresher := policy_refresher(state)) is not None:  # policy models (issue 33)
                    state.components.append(refresher)
            for extension in extensions or []:
                state.components.append(extension(state))
            started.extend(state.components)
            yield
        finally:
            # The ingest emitter first: its unsent events reach Kafka or the disk spool before
            # anything slower (the loader) can hold the exit up; then the rest, last started first.
            order = sorted(reversed(started), key=lambda c: c is not state.ingest)
            for component in order:
                if component is not None and hasattr(component, "close"):
                    _close_bounded(component)
            state.tokens.close()
            engine.dispose()

    app = FastAPI(
        title="ablab",
        version="0.1.0",
        summary="Online A/B experimentation and attribution for LLM inference strategies.",
        lifespan=lifespan,
    )
    problems.install(app)
    # The assignment router first: routes are matched in order and /v1/assign is the hot path.
    for module in (assign, health, experiments, layers, keys, results, ingest_routes):
        app.include_router(module.router)
    app.include_router(keys.whoami_router)
    app.include_router(factors.router)
    app.include_router(ope_routes.router)
    app.include_router(ship.router)
    app.include_router(policy_model_routes.router)
    ingest_routes.install_openapi(app)
    # Outermost last: the metrics middleware also sees the body limit's 413/408 answers.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.http_body_timeout_s)
    app.add_middleware(_MetricsMiddleware)
    from ablab.platform import telemetry

    telemetry.instrument(app, settings, service="ablab-api")  # no-op unless ABLAB_TRACING is on
    return app
