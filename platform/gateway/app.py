"""The thin ASGI app: routes to the serving classes; the lifespan builds clients, the SDK's
assignment client, the outbox and its shipper (never at import time)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ablab.platform.gateway import protocol
from ablab.platform.gateway.auth import key_allowed, presented_key
from ablab.platform.gateway.limits import HardeningMetrics
from ablab.platform.gateway.model_routing import ModelCatalog
from ablab.platform.gateway.observe import GatewayMetrics, tracer
from ablab.platform.gateway.policy_hook import PolicyLoadFailures
from ablab.platform.gateway.serving import (
    GatewayState,
    OpenAIServing,
    ServingChat,
    ServingCompletion,
    ServingEmbeddings,
    ServingResponses,
    list_models,
)
from ablab.platform.gateway.settings import METRICS_TOKEN_ENV, Backend, GatewaySettings, token_digest
from ablab.platform.gateway.upstream import upstream_pools

# A prompt compressor: (text, tau, window) -> the text with its predictable tokens dropped.
Compressor = Callable[[str, float, int], str]

log = logging.getLogger(__name__)


def build_state(settings: GatewaySettings, *, sdk: Any = None, compress: Compressor | None = None) -> GatewayState:
    """Everything a running gateway holds. ``sdk`` assigns units (an ``AblabClient``, which
    ``ablab gateway`` starts with the sdk token and closes); without one every request goes to
    the default backend. ``compress`` serves ``compression`` strategies (without one they are
    refused by name)."""
    state = GatewayState(settings=settings, clients=upstream_pools(settings.backends), metrics=GatewayMetrics(), tracer=tracer(),
                         compress=compress)
    state.hardening = HardeningMetrics(state.metrics.registry)
    state.metrics.registry.register(PolicyLoadFailures(state))
    state.catalog = ModelCatalog(settings, partial(_list_backend_models, state))
    if sdk is None:
        log.warning("no assignment client (no sdk token): every request goes to the default backend %r",
                    settings.default_backend)
    state.sdk = sdk
    if settings.outbox_dir is not None:
        from ablab.platform.gateway.emit import schema_has_measures
        from ablab.platform.gateway.outbox import segmented_outbox

        state.outbox = segmented_outbox(settings.outbox_dir)  # segments, a disk cap (503 when full), retention
        state.with_measures = schema_has_measures()
    from ablab.platform.gateway.shadow import ShadowRunner

    # Shadows: their own task set, caps, clients and timeouts (platform/gateway/shadow.py).
    state.shadows = ShadowRunner(backends=settings.backends, default_backend=settings.default_backend,
                                 templates=settings.templates, compress=compress, record=state.write_events,
                                 metrics=state.metrics, with_measures=state.with_measures,
                                 max_inflight=settings.shadow_max_inflight, inflight=state.inflight)
    state.shadows.open_clients()
    from ablab.platform.gateway.prompting import rewrite_request

    # A shadow's strategy is rewritten as a variant's is (its prompt strategies included); their
    # notes are filed under the shadow's own trace id and land in its event.
    state.shadows.rewrite = partial(rewrite_request, state, events=1)
    return state


async def _list_backend_models(state: GatewayState, backend: Backend) -> frozenset[str] | None:
    """The model ids a backend's ``GET /models`` lists (None: it could not be read)."""
    import httpx

    headers = {"authorization": f"Bearer {k}"} if (k := backend.api_key()) else {}
    try:
        r = await state.clients[backend.name].client().get(backend.url + "/models", headers=headers, timeout=5.0)
        data = r.json().get("data") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return frozenset(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))


def refused_variants(state: GatewayState) -> list[str]:
    """Running variants whose strategy this gateway cannot serve, with the reasons (logged at
    start, so an operator learns before traffic does)."""
    from ablab.platform.gateway.rewrite import strategy_problems

    if state.sdk is None:
        return []
    out = []

    def check(where: str, strategy: Any) -> None:
        problems = strategy_problems(strategy, backends=state.settings.backends, templates=state.settings.templates,
                                     can_compress=state.compress is not None)
        if problems:
            out.append(f"{where}: " + "; ".join(problems))

    for exp in state.sdk.config.experiments:
        for v in exp.variants:
            check(f"{exp.key}/{v.key}", v.strategy)
            if v.shadow:
                check(f"{exp.key}/{v.key} (shadow)", v.shadow.get("strategy") or {})
        if getattr(exp, "shadow", None):
            check(f"{exp.key} (shadow)", exp.shadow.get("strategy") or {})
    return out


def metrics_authorized(settings: GatewaySettings, authorization: str | None) -> bool:
    """Whether a scrape may read ``/metrics``: always when no token is configured, else when
    it sends ``Authorization: Bearer <token>``. Digests are compared in constant time."""
    expected = settings.metrics_token_sha256
    if expected is None:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    return hmac.compare_digest(token_digest(token.strip()).encode(), expected.encode())


def _unauthorized(detail: str) -> Response:
    """The API's problem+json shape (``platform/api/problems.py``), without importing the API."""
    body = {"type": "about:blank", "title": "Unauthorized", "status": 401, "detail": detail, "field": "Authorization"}
    return Response(orjson.dumps(body), status_code=401, media_type="application/problem+json",
                    headers={"WWW-Authenticate": "Bearer"})


class GatewayApp(Starlette):
    """Starlette for everything, except that a ``POST`` to a data-plane endpoint goes straight
    to its serving class: Starlette's middleware stack (error middleware, exception middleware,
    router, the per-send wrappers around each) was ≈ 13 % of the gateway's CPU per streamed
    request (docs/benchmarks/gateway.md). ``handle`` already answers its own failures (500 in OpenAI's shape), so
    the skipped middleware had nothing left to catch; other methods on those paths (405) and
    every other path still go through Starlette."""

    def __init__(self, *, routes: list[Route], lifespan: Any, data_plane: dict[str, Callable[[Request], Any]]) -> None:
        super().__init__(routes=routes, lifespan=lifespan)
        self._data_plane = data_plane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            handle = self._data_plane.get(scope["path"])
            if handle is not None:
                scope["app"] = self
                response = await handle(Request(scope, receive))
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: GatewaySettings, *, sdk: Any = None, ship: bool = True, compress: Compressor | None = None) -> Starlette:
    holder: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state = build_state(settings, sdk=sdk, compress=compress)
        holder["state"] = state
        for serving in servings:
            serving.state = state
        for line in refused_variants(state):
            log.error("refused strategy %s", line)
        if state.hardening is not None:
            state.hardening.register()
        if state.catalog is not None:
            await state.catalog.refresh()  # each backend's models, so an unknown one is a 404 from the start
        shipper = None
        if ship and state.outbox is not None and settings.token:
            from ablab.platform.gateway.outbox import GroupShipper

            shipper = GroupShipper(settings.outbox_dir, api_url=settings.api_url, token=settings.token)  # type: ignore[arg-type]
        try:
            yield
        finally:
            if state.shadows is not None:  # first: a cancelled shadow still writes its event
                await state.shadows.aclose()
            for client in state.clients.values():
                await client.aclose()
            if shipper is not None:
                shipper.close()
            if state.outbox is not None:
                state.outbox.close()
            if state.hardening is not None:
                state.hardening.unregister()

    chat = ServingChat(None)  # type: ignore[arg-type]  # the lifespan gives them their state
    completion = ServingCompletion(None)  # type: ignore[arg-type]
    embeddings = ServingEmbeddings(None)  # type: ignore[arg-type]
    responses = ServingResponses(None)  # type: ignore[arg-type]
    servings: tuple[OpenAIServing, ...] = (chat, completion, embeddings, responses)

    async def models(request: Request) -> Response:
        if settings.caller_key_digests and not key_allowed(settings.caller_key_digests, presented_key(request.headers)[0]):
            body = protocol.error_body("this gateway needs a gateway key: send `Authorization: Bearer <key>` or "
                                       "`X-Ablab-Key: <key>`", code="invalid_api_key")
            return Response(body, status_code=401, media_type="application/json", headers={"www-authenticate": "Bearer"})
        return await list_models(holder["state"])

    async def healthz(_: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(_: Request) -> Response:
        state = holder.get("state")
        ready = state is not None and (state.sdk is None or state.sdk.wait_ready(0))
        return Response(orjson.dumps({"ready": bool(ready)}), status_code=200 if ready else 503, media_type="application/json")

    async def metrics(request: Request) -> Response:
        # Its labels name backends, experiments and variants; a deployment that must not show
        # them sets a token (the token itself is never logged or echoed).
        if not metrics_authorized(settings, request.headers.get("authorization")):
            return _unauthorized(f"/metrics needs 'Authorization: Bearer <token>' with the token in {METRICS_TOKEN_ENV}")
        return Response(holder["state"].metrics.render(), media_type="text/plain; version=0.0.4")

    data_plane: dict[str, Callable[[Request], Any]] = {
        "/v1/chat/completions": chat.handle, "/v1/completions": completion.handle,
        "/v1/embeddings": embeddings.handle, "/v1/responses": responses.handle,
    }
    routes = [
        *(Route(path, handle, methods=["POST"]) for path, handle in data_plane.items()),
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = GatewayApp(routes=routes, lifespan=lifespan, data_plane=data_plane)
    app.state.holder = holder
    return app
