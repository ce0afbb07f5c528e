"""``create_app()``: the ablab HTTP API. Engines and clients are built in the lifespan."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from ablab.platform.api import problems
from ablab.platform.api.routers import assign, experiments, health, keys, layers
from ablab.platform.api.state import AppState
from ablab.platform.config import Settings, get_settings
from ablab.platform.registry.db import make_engine, make_sessionmaker

# Components started with the app (loader, ingestion) register here: name → factory that
# takes the AppState and returns an object with `close()`. Keeps the core free of them.
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


def create_app(settings: Settings | None = None, *, extensions: list[Extension] | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.resolved_database_url)
        state = AppState.build(settings, engine, make_sessionmaker(engine))
        app.state.ablab = state
        started = [ext(state) for ext in (extensions or [])]
        try:
            yield
        finally:
            for component in reversed(started):
                if component is not None and hasattr(component, "close"):
                    component.close()
            engine.dispose()

    app = FastAPI(
        title="ablab",
        version="0.1.0",
        summary="Online A/B experimentation and attribution for LLM inference strategies.",
        lifespan=lifespan,
    )
    problems.install(app)
    for module in (health, experiments, layers, assign, keys):
        app.include_router(module.router)
    app.add_middleware(_MetricsMiddleware)
    return app
