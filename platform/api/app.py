"""``create_app()``: the ablab HTTP API. Engines and clients are built in the lifespan."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from ablab.platform.api import problems
from ablab.platform.api.limits import BodyLimitMiddleware
from ablab.platform.api.routers import assign, experiments, health, ingest, keys, layers, results
from ablab.platform.api.state import AppState
from ablab.platform.config import Settings, get_settings
from ablab.platform.factors import router as factors_router
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


def _analytics(state: AppState) -> Any:
    from ablab.platform.analytics.guardian import GuardrailMonitor
    from ablab.platform.analytics.store import AnalyticsStore
    from ablab.platform.registry.db import transaction
    from ablab.platform.registry.service import list_experiments

    settings = state.settings

    known: dict[str, object] = {"revision": None, "keys": frozenset()}

    def known_experiments() -> frozenset[str]:
        # Every experiment ever registered (stopped ones still get late labels), re-read
        # only when the registry revision moves, so a new experiment is known at once.
        revision = state.assignments.current().config.revision
        if revision != known["revision"]:
            with transaction(state.sessions) as session:
                items, _ = list_experiments(session, limit=100_000)
                known["keys"] = frozenset(e.key for e in items)
            known["revision"] = revision
        return known["keys"]  # type: ignore[return-value]

    embedded = settings.resolved_clickhouse_url.startswith("chdb")
    run_loader = settings.run_loader if settings.run_loader is not None else embedded
    store = AnalyticsStore(settings, run_loader=run_loader, known_experiments=known_experiments)
    state.extras["analytics"] = store
    state.extras.setdefault("readiness", {})["clickhouse"] = store.ping
    monitor = GuardrailMonitor(state.sessions, store.client, interval_s=settings.guardrail_interval_s, settings=settings) if settings.guardrail_interval_s > 0 else None

    class _Both:
        def close(self) -> None:
            if monitor is not None:
                monitor.close()
            store.close()

    return _Both()


class _Ingest:
    """The emitter behind the ingestion routes; it spools to disk while Kafka is down."""

    def __init__(self, state: AppState) -> None:
        from ablab.platform.api.webhooks import SqlReplayGuard
        from ablab.streaming.ingest import EdgeLimits, IngestStats
        from ablab.streaming.kafka.emitter import emitter_from_settings

        from ablab.streaming.kafka.spool import SpoolLockedError

        # One spool per API worker process: take the first free slot, so a restarted
        # worker picks up (and replays) what its predecessor in that slot left behind.
        for slot in range(64):
            try:
                self.emitter = emitter_from_settings(name=f"api-{slot}", settings=state.settings)
                break
            except SpoolLockedError:
                continue
        else:
            raise RuntimeError("all 64 API spool slots are locked; too many API workers on one ABLAB_HOME")
        self.stats = IngestStats()
        self.limits = EdgeLimits.from_settings(state.settings)
        self.replay_guard = SqlReplayGuard(state.engine)
        self._state = state
        self._variants: tuple[object, dict[str, frozenset[str]]] = (None, {})
        state.extras["ingest"] = self

    def variants_of(self, key: str) -> Collection[str] | None:
        """The variants of a live (not stopped) experiment, from the assignment config."""
        config = self._state.assignments.current().config
        seen, variants = self._variants
        if seen is not config:  # rebuilt only when the registry revision moved
            variants = {e.key: frozenset(v.key for v in e.variants) for e in config.experiments}
            self._variants = (config, variants)
        return variants.get(key)

    def close(self) -> None:
        # With the broker gone, waiting to deliver is pointless: spool what is left at once
        # (the next API on this slot replays it), so SIGTERM is not held up for seconds.
        up = bool(self.emitter.counters().get("broker_up"))
        self.emitter.close(timeout_s=10.0 if up else 1.0)


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


def _default_extensions(settings: Settings) -> list[Extension]:
    return [_Ingest, *([_analytics] if settings.analytics else [])]


def create_app(settings: Settings | None = None, *, extensions: list[Extension] | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.resolved_database_url)
        state = AppState.build(settings, engine, make_sessionmaker(engine))
        app.state.ablab = state
        started = [ext(state) for ext in (_default_extensions(settings) + (extensions or []))]
        try:
            yield
        finally:
            # The ingest emitter first: its unsent events reach Kafka or the disk spool before
            # anything slower (the loader) can hold the exit up.
            ingest = state.extras.get("ingest")
            order = sorted(reversed(started), key=lambda c: c is not ingest)
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
    for module in (assign, health, experiments, layers, keys, results, ingest):
        app.include_router(module.router)
    app.include_router(keys.whoami_router)
    app.include_router(factors_router.router)
    ingest.install_openapi(app)
    # Outermost last: the metrics middleware also sees the body limit's 413/408 answers.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.http_body_timeout_s)
    app.add_middleware(_MetricsMiddleware)
    from ablab.platform import telemetry

    telemetry.instrument(app, settings, service="ablab-api")  # no-op unless ABLAB_TRACING is on
    return app
