"""One serving class per endpoint (chat, completions) over a shared request path, and the
models listing. The app (:mod:`.app`) only routes to these.

Per request: parse once → unit and attributes from headers (``X-Ablab-Unit`` else ``user``;
``X-Ablab-Attr-<name>``) → local assignment → the variant's strategy picks the backend and
rewrites the body (unchanged bodies are forwarded as the caller's bytes) → raw httpx to the
backend with ``X-Request-Id: <trace_id>`` → the stream meter passes bytes through while it
measures → exposure and inference events written to the outbox *before* the last bytes
(``[DONE]``) reach the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from ablab.platform.gateway import protocol
from ablab.platform.gateway.auth import forwarded_authorization, key_allowed, presented_key
from ablab.platform.gateway.emit import event_unit_id
from ablab.platform.gateway.limits import ClientGone, HardeningMetrics, read_body
from ablab.platform.gateway.metering import Measurement, exposure_event, inference_event, strategy_id
from ablab.platform.gateway.model_routing import ModelCatalog, ModelNotFound
from ablab.platform.gateway.observe import GatewayMetrics, end_span, start_span
from ablab.platform.gateway.outbox import outbox_refusal
from ablab.platform.gateway.prompting import rewrite_request
from ablab.platform.gateway.prompting.rates import take_notes
from ablab.platform.gateway.relay import SseResponse, UpstreamResponse
from ablab.platform.gateway.rewrite import StrategyError, apply_strategy, strategy_problems
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.gateway.shadow import SHADOW_STATUS, ShadowJob, ShadowRunner, ShadowSpec, inference_fields, spec_of
from ablab.platform.gateway.stream import StreamMeter
from ablab.platform.gateway.translators import translator_for
from ablab.platform.gateway.upstream import UpstreamPool

log = logging.getLogger(__name__)
_UNIT_HEADER = "x-ablab-unit"
_ATTR_PREFIX = "x-ablab-attr-"
# Not copied from the backend's response: framing (the server sets its own), hop-by-hop headers
# (RFC 9110 7.6.1), the headers uvicorn adds, and what would act on the caller's browser or
# session in the gateway's name (cookies, CORS, auth challenges, HSTS).
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date",
                          "server", "te", "trailer", "trailers", "upgrade", "proxy-authenticate", "proxy-authorization",
                          "proxy-connection", "set-cookie", "set-cookie2", "www-authenticate", "strict-transport-security",
                          "alt-svc", "clear-site-data"})


def relayable_headers(items: Any) -> dict[str, str]:
    """The backend's response headers a caller may receive (names lower-cased)."""
    pairs = [(k.lower(), v) for k, v in items]
    named = {t.strip().lower() for k, v in pairs if k == "connection" for t in v.split(",")}  # more hop-by-hop ones
    return {k: v for k, v in pairs
            if k not in _HOP_HEADERS and k not in named and not k.startswith(("x-ablab-", "access-control-"))}


def caller_caused(status: int) -> bool:
    """A backend's 4xx is the caller's (bad params, a body it refuses): its own outcome, never
    an inference event's error (error_rate, guardrails). 408 and 429 are the backend's state."""
    return 400 <= status < 500 and status not in (408, 429)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the assignment decided for one request (cached per config revision)."""

    assignments: tuple[tuple[str, str], ...]  # (experiment, variant)
    strategy: Mapping[str, Any]
    strategy_id: str
    problems: tuple[str, ...]
    shadows: tuple[tuple[str, str, ShadowSpec], ...] = ()  # (experiment, variant, its shadow)


NO_PLAN = Plan((), {}, "default", ())


@dataclass
class GatewayState:
    settings: GatewaySettings
    clients: dict[str, UpstreamPool]
    metrics: GatewayMetrics
    sdk: Any = None  # AblabClient
    outbox: Any = None  # emit.Outbox
    shadows: ShadowRunner | None = None
    tracer: Any = None
    with_measures: bool = False
    # The prompt compressor (text, tau, window) -> text; the in-repo model's, given by
    # `ablab gateway` where torch is installed (ablab.inference.compression.compress).
    compress: Callable[[str, float, int], str] | None = None
    inflight: dict[str, int] = field(default_factory=dict)
    plans: dict[tuple[str, tuple[tuple[str, str], ...]], Plan] = field(default_factory=dict)
    refused_logged: set[tuple[str, str]] = field(default_factory=set)
    hardening: HardeningMetrics | None = None
    catalog: ModelCatalog | None = None  # None: every model goes to the default backend

    async def named_backend(self, model: str | None, *, responses: bool = False) -> Backend | None:
        """The backend the caller's request names (model_routing.py); ModelNotFound → 404.
        ``responses``: among those serving the Responses API (None: none of them serves it)."""
        only = (lambda b: b.serves_responses) if responses else None
        if self.catalog is None:
            default = self.settings.backends[self.settings.default_backend]
            return default if only is None or only(default) else None
        return await self.catalog.named_backend(model, only)

    def plan(self, unit: str | None, attributes: dict[str, Any] | None) -> Plan:
        if self.sdk is None or not unit:
            return NO_PLAN
        found = self.sdk.assign(unit, attributes, experiments=self.settings.experiments, log_exposure=False)
        if not found:
            return NO_PLAN
        key = (self.sdk.config.revision, tuple((a.experiment, a.variant) for a in found))
        plan = self.plans.get(key)
        if plan is None:
            merged: dict[str, Any] = {}
            for a in found:  # the first experiment (layer order) to set a factor decides it
                for k, v in a.strategy.items():
                    merged.setdefault(k, v)
            problems = tuple(strategy_problems(merged, backends=self.settings.backends, templates=self.settings.templates,
                                               can_compress=self.compress is not None))
            shadows = tuple((a.experiment, a.variant, spec) for a in found if (spec := spec_of(a.shadow)) is not None)
            plan = Plan(key[1], merged, strategy_id(merged), problems, shadows)
            if len(self.plans) > 4096:
                self.plans.clear()
            self.plans[key] = plan
            for exp, var in key[1]:
                if problems and (exp, var) not in self.refused_logged:
                    self.refused_logged.add((exp, var))
                    log.error("experiment %s variant %s cannot be served by this gateway: %s", exp, var, "; ".join(problems))
        return plan

    def compressor(self) -> Callable[[str, float, int], str] | None:
        return self.compress

    def write_events(self, events: list[dict[str, Any]]) -> None:
        """Validate and append events to the outbox, counting what was written and refused."""
        if not events or self.outbox is None:
            return
        before = self.outbox.refused
        self.outbox.write(events)
        refused = self.outbox.refused - before
        self.metrics.events.labels("written").inc(len(events) - refused)
        if refused:
            self.metrics.events.labels("refused").inc(refused)


def _attributes(headers: Mapping[str, str]) -> dict[str, str] | None:
    attrs = {k[len(_ATTR_PREFIX):].replace("-", "_"): v for k, v in headers.items() if k.startswith(_ATTR_PREFIX)}
    return attrs or None


class OpenAIServing:
    """The request path shared by chat and completions; subclasses name the endpoint."""

    endpoint = ""
    operation = ""
    chat = False
    streams = True  # False: `stream` is not this endpoint's (embeddings)
    needs_responses = False  # only backends that serve the Responses API

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def check(self, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def _count_refused(self, reason: str, status: int | None) -> None:
        hardening = self.state.hardening
        if hardening is not None:
            hardening.count_refusal(reason)
            if status is not None:
                hardening.caller_errors.labels(self.operation, str(status)).inc()

    def _refused(self, exc: protocol.ProtocolError, trace_id: str, *, kind: str = "invalid_request_error",
                 code: str | None = None) -> Response:
        """A caller's request refused before anything was assigned or forwarded (no events)."""
        status = exc.status
        reason = {400: "malformed", 401: "unauthenticated", 404: code or "not_found", 413: "too_large"}.get(status, str(status))
        self._count_refused(reason, status)
        headers = {"x-ablab-trace-id": trace_id}
        if status == 413:
            headers["connection"] = "close"  # the rest of an oversized upload is never read
        elif status == 401:
            headers["www-authenticate"] = "Bearer"
        return Response(protocol.error_body(str(exc), kind=kind, param=exc.param, code=code), status_code=status,
                        media_type="application/json", headers=headers)

    async def handle(self, request: Request) -> Response:
        """The request path; a failure of the gateway's own is logged and answered 500 in
        OpenAI's error shape (never a plain-text 500 or a reset connection)."""
        try:
            return await self._handle(request)
        except Exception:
            log.exception("gateway failure on %s", self.endpoint)
            self._count_refused("gateway_error", None)
            return Response(protocol.error_body("the gateway failed on this request (logged with its trace)",
                                                kind="server_error", code="gateway_error"),
                            status_code=500, media_type="application/json")

    async def _handle(self, request: Request) -> Response:
        st = self.state
        start = time.perf_counter()
        ts = datetime.now(UTC)
        trace_id = uuid.uuid4().hex
        if st.outbox is not None and (full := outbox_refusal(st, operation=self.operation, trace_id=trace_id)) is not None:
            return full  # type: ignore[no-any-return]  # a starlette Response
        headers = request.headers
        try:
            raw = await read_body(request, st.settings.max_body_bytes)
            body = protocol.parse_body(raw, max_bytes=st.settings.max_body_bytes)
            self.check(body)
        except ClientGone:
            log.info("%s: the caller hung up before its request body arrived", self.endpoint)
            self._count_refused("client_gone", None)
            return Response(status_code=400)  # never sent: the connection is gone
        except protocol.ProtocolError as exc:
            return self._refused(exc, trace_id)
        caller_auth = headers.get("authorization")
        if st.settings.caller_key_digests:
            key, consumed = presented_key(headers)
            if not key_allowed(st.settings.caller_key_digests, key):
                return self._refused(protocol.ProtocolError(
                    "this gateway needs a gateway key: send `Authorization: Bearer <key>` or `X-Ablab-Key: <key>`",
                    param=None, status=401), trace_id, kind="invalid_request_error", code="invalid_api_key")
            if consumed:
                caller_auth = None  # the gateway's own key: never forwarded to a backend
        model = body.get("model") if isinstance(body.get("model"), str) else None
        try:
            named = await st.named_backend(model, responses=self.needs_responses)
        except ModelNotFound:
            return self._refused(protocol.ProtocolError(
                f"The model `{model}` does not exist or is not served by this gateway (GET /v1/models lists them)",
                param="model", status=404), trace_id, code="model_not_found")
        if named is None:
            return self._refused(protocol.ProtocolError(
                "no backend serving this model serves the Responses API (/v1/responses); a backend does with "
                "`kind: vllm` or `responses: true`", param=None, status=404), trace_id, code="unsupported_endpoint")
        unit = headers.get(_UNIT_HEADER) or (body.get("user") if isinstance(body.get("user"), str) else None)
        plan = st.plan(unit, _attributes(headers))
        if "policy" in plan.strategy:  # a policy variant: the arm this request draws (policy_hook.py)
            from ablab.platform.gateway.policy_hook import choose_arm  # it imports this module

            plan = choose_arm(st, plan, body, headers, trace_id)
        out_headers = {"x-ablab-trace-id": trace_id}
        variant_headers = {}
        if plan.assignments:
            variant_headers = {"x-ablab-experiment": ",".join(e for e, _ in plan.assignments),
                               "x-ablab-variant": ",".join(v for _, v in plan.assignments)}
            if st.settings.variant_headers:
                out_headers.update(variant_headers)
        chosen = plan.strategy.get("backend") if plan.problems == () else None
        backend = st.settings.backend(chosen) if chosen is not None else named
        translator = translator_for(backend.kind)
        stream = body.get("stream") is True and self.streams
        call = _Call(self, plan=plan, unit=unit or "", trace_id=trace_id, ts=ts, start=start, backend=backend,
                     body=body, model=None)
        call.authorization = forwarded_authorization(caller_auth, backend=backend, named=named)
        call.named = named
        call.caller_auth = caller_auth
        if plan.problems:
            call.finish(error="strategy_unsupported")
            msg = "this request's variant cannot be served: " + "; ".join(plan.problems)
            return Response(protocol.error_body(msg, kind="ablab_strategy_error"), status_code=500,
                            media_type="application/json", headers=out_headers)
        try:
            if self.chat or self.endpoint == "/completions":
                upstream = await rewrite_request(st, body, plan.strategy, chat=self.chat, backend=backend, trace_id=trace_id,
                                                 events=len(plan.assignments))
            else:  # embeddings, responses: a variant's model, params and backend; no prompt rewriting
                upstream = apply_strategy(body, {k: v for k, v in plan.strategy.items() if k in ("model", "params")},
                                          chat=False, templates=st.settings.templates)
        except StrategyError as exc:
            call.finish(error="strategy_unsupported")
            return Response(protocol.error_body(str(exc), kind="ablab_strategy_error"), status_code=500,
                            media_type="application/json", headers=out_headers)
        before = upstream is body and not stream
        if stream and not self.needs_responses:  # the Responses API has no stream_options
            upstream = translator.upstream_body(upstream if upstream is not body else dict(body), stream=stream)
        content = raw if before else orjson.dumps(upstream)
        call.model = upstream.get("model") if isinstance(upstream.get("model"), str) else None
        # identity: stream bytes are relayed raw, so they must not arrive compressed
        up_headers = {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": trace_id}
        up_headers.update(variant_headers)  # the backend learns the variant (rewrite.py), the caller only if configured
        if (key := backend.api_key()) is not None:
            up_headers["authorization"] = f"Bearer {key}"
        elif call.authorization is not None:
            up_headers["authorization"] = call.authorization  # the caller's key for the backend it named
        client = st.clients[backend.name].relay()
        req = client.build_request("POST", backend.url + self.endpoint, content=content, headers=up_headers)
        if plan.shadows and st.shadows is not None and st.settings.shadow_launch == "beside":
            call.decide_shadows()
            call.launch_shadows()
        call.enter()
        try:
            resp = await client.send(req, stream=True)
        except httpx.HTTPError as exc:
            return _backend_failed(call, exc, out_headers, stage="connect")
        except BaseException:
            call.finish(error="client_disconnected")
            raise
        if resp.status_code >= 400 or not stream:
            return await self._whole(call, resp, out_headers)
        meter = StreamMeter(translator=translator, strip_usage=not protocol.wants_usage(body),
                            prompt_tokens=call.prompt_estimate())
        return SseResponse(self._relay(call, resp, meter), status_code=resp.status_code,  # type: ignore[return-value]  # an ASGI app, as Response is
                           headers={**out_headers, **protocol.SSE_HEADERS})

    async def _whole(self, call: _Call, resp: UpstreamResponse, out_headers: dict[str, str]) -> Response:
        try:
            data = await resp.aread()
        except httpx.HTTPError as exc:
            return _backend_failed(call, exc, out_headers, stage="read")
        except BaseException:
            call.finish(error="client_disconnected")
            raise
        finally:
            await resp.aclose()
        now = time.perf_counter()
        status = resp.status_code
        error = None
        usage: dict[str, Any] | None = None
        chars, metrics = 0, {}
        body, changed = data, False
        if status >= 400:
            error = f"backend_http_{status}"
            body, changed = protocol.backend_error_body(status, data)
            if changed:  # the original (file paths and all) for the operator, never the caller
                log.warning("backend %r answered %d; relayed in OpenAI's error shape without file paths. It sent: %s",
                            call.backend.name, status, data[:2000].decode("utf-8", "replace"))
        else:
            try:
                parsed = orjson.loads(data)
            except orjson.JSONDecodeError:
                error = "backend_invalid_json"
            else:
                try:
                    usage, chars = protocol.response_view(parsed)
                    metrics = translator_for(call.backend.kind).server_metrics(parsed) if isinstance(parsed, dict) else {}
                except Exception:  # metering never fails an answer
                    call.bookkeeping_failed("response_view")
        call.finish(error=error, end=now, usage=usage, out_chars=chars, server_metrics=metrics, caller=caller_caused(status))
        headers = relayable_headers(resp.headers.items())
        if changed:
            headers["content-type"] = "application/json"
        headers.update(out_headers)
        return Response(body, status_code=status, headers=headers)

    async def _relay(self, call: _Call, resp: UpstreamResponse, meter: StreamMeter) -> AsyncIterator[bytes]:
        stats = meter.stats
        finished = False
        clock = time.perf_counter
        metering = True
        try:
            async for data in resp.aiter_raw():
                if metering:
                    try:
                        out = meter.feed(data, clock())
                    except Exception:  # metering never fails a stream: the rest is relayed as it comes
                        call.bookkeeping_failed("stream_meter")
                        metering, out = False, data
                else:
                    out = data
                if stats.done and not finished:
                    finished = True
                    call.finish_stream(stats, error=_stream_error(stats))
                if out:
                    yield out
            tail = meter.close()
            if not finished:
                finished = True
                # a Responses API stream ends at its response.completed event, with no [DONE]
                complete = self.needs_responses and stats.finish_reason is not None
                call.finish_stream(stats, error=_stream_error(stats) or (None if complete else "backend_stream_incomplete"))
            if tail:
                yield tail
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            if not finished:
                finished = True
                reason = "backend_timeout" if isinstance(exc, httpx.TimeoutException) else "backend_stream_broken"
                call.finish_stream(stats, error=reason)
                yield b"data: " + protocol.error_body(f"{reason}: the backend stopped mid-stream", kind="server_error",
                                                      code=reason) + b"\n\n"
        except BaseException:  # the caller went away (cancelled) or the server is stopping
            if not finished:
                finished = True
                call.finish_stream(stats, error="client_disconnected")
            raise
        finally:
            await resp.aclose()


class ServingChat(OpenAIServing):
    endpoint = "/chat/completions"
    operation = "chat"
    chat = True

    def check(self, body: dict[str, Any]) -> None:
        protocol.check_chat(body)


class ServingCompletion(OpenAIServing):
    endpoint = "/completions"
    operation = "text_completion"

    def check(self, body: dict[str, Any]) -> None:
        protocol.check_completion(body)


class ServingEmbeddings(OpenAIServing):
    """``POST /v1/embeddings``: assigned, forwarded and measured as the others (a variant's
    ``model``, ``params`` and ``backend`` apply; prompt factors do not); never streamed."""

    endpoint = "/embeddings"
    operation = "embeddings"
    streams = False

    def check(self, body: dict[str, Any]) -> None:
        protocol.check_embeddings(body)


class ServingResponses(OpenAIServing):
    """``POST /v1/responses`` (OpenAI's Responses API) where the named backend serves it
    (``kind: vllm`` or ``responses: true``); else 404 ``unsupported_endpoint``."""

    endpoint = "/responses"
    operation = "responses"
    needs_responses = True

    def check(self, body: dict[str, Any]) -> None:
        protocol.check_responses(body)


def _stream_error(stats: Any) -> str | None:
    if stats.stream_error is not None:
        return "backend_stream_error"
    if stats.malformed:
        return "backend_malformed_chunk"
    return None


def _backend_error(status: int, message: str, headers: dict[str, str]) -> Response:
    return Response(protocol.error_body(message, kind="server_error"), status_code=status,
                    media_type="application/json", headers=headers)


# An httpx failure toward the backend, per stage: (the 504's message on a timeout, the
# event's error otherwise, the 502's message). Connecting, the backend is unreachable;
# reading a whole body, the connection broke.
_BACKEND_FAILURES = {
    "connect": ("backend timed out before answering", "backend_unreachable", "backend unreachable"),
    "read": ("backend timed out", "backend_stream_broken", "backend connection broke"),
}


def _backend_failed(call: _Call, exc: httpx.HTTPError, headers: dict[str, str], *, stage: str) -> Response:
    """Record the failure on the call and answer 504 (timeout) or 502."""
    timed_out, error, broke = _BACKEND_FAILURES[stage]
    if isinstance(exc, httpx.TimeoutException):
        call.finish(error="backend_timeout")
        return _backend_error(504, timed_out, headers)
    call.finish(error=error)
    return _backend_error(502, f"{broke} ({type(exc).__name__})", headers)


class _Call:
    """One request's bookkeeping: in-flight count, span, metrics, and its events."""

    __slots__ = ("serving", "plan", "unit", "trace_id", "ts", "start", "backend", "body", "model", "span", "named", "caller_auth",
                 "_inflight_at_start", "_entered", "_done", "authorization", "shadow_status", "_shadow_jobs", "_prompt_est")

    def __init__(self, serving: OpenAIServing, *, plan: Plan, unit: str, trace_id: str, ts: datetime, start: float,
                 backend: Backend, body: dict[str, Any], model: str | None) -> None:
        self.serving, self.plan, self.unit, self.trace_id, self.ts, self.start = serving, plan, unit, trace_id, ts, start
        self.backend, self.body, self.model = backend, body, model
        self.span = None
        self._inflight_at_start = 1
        self._entered = False
        self._done = False
        self.authorization: str | None = None  # the caller's, where the chosen backend may receive it
        self.named: Backend = backend  # the backend the caller's own request names
        self.caller_auth: str | None = None
        self.shadow_status: dict[str, str] | None = None  # experiment → "sent" | "dropped", once decided
        self._shadow_jobs: list[tuple[ShadowJob, Any]] = []
        self._prompt_est: int | None = None

    def prompt_estimate(self) -> int:
        """The gateway's estimate of the prompt's tokens, counted once per request (the usage
        chunk of a stream and the event carry the same number)."""
        if self._prompt_est is None:
            self._prompt_est = protocol.estimate_tokens(len(protocol.message_text(self.body)))
        return self._prompt_est

    def decide_shadows(self) -> None:
        """For each experiment with a shadow: chosen for this trace? a free slot? (no waiting)."""
        runner = self.serving.state.shadows
        self.shadow_status = {}
        if runner is None:
            return
        unit_id = event_unit_id(self.unit)
        for experiment, variant, spec in self.plan.shadows:
            status, slot = runner.decide(self.trace_id, experiment, spec)
            if status is not None:
                self.shadow_status[experiment] = status
            if slot is not None:
                # the caller's key only to the backend the caller named, where it forwards caller auth
                target = runner.backends.get(spec.strategy.get("backend") or runner.default_backend)
                auth = forwarded_authorization(self.caller_auth, backend=target, named=self.named) if target else None
                job = ShadowJob(spec=spec, experiment=experiment, variant=variant, unit_id=unit_id,
                                primary_trace=self.trace_id, body=self.body, chat=self.serving.chat,
                                endpoint=self.serving.endpoint, authorization=auth)
                self._shadow_jobs.append((job, slot))

    def launch_shadows(self) -> None:
        runner = self.serving.state.shadows
        jobs, self._shadow_jobs = self._shadow_jobs, []
        for job, slot in jobs:
            if runner is None:
                slot.release()
            else:
                runner.launch(job, slot)

    def enter(self) -> None:
        st = self.serving.state
        n = st.inflight.get(self.backend.name, 0) + 1
        st.inflight[self.backend.name] = n
        self._inflight_at_start = n
        self._entered = True
        st.metrics.inflight.labels(self.backend.name).inc()
        self.span = start_span(st.tracer, operation=self.serving.operation, model=self.model,
                               backend=self.backend.name, trace_id=self.trace_id)

    def finish_stream(self, stats: Any, *, error: str | None) -> None:
        usage = stats.usage
        self.finish(error=error, end=stats.last_chunk_at or time.perf_counter(), first=stats.first_token_at,
                    usage=usage, out_chars=stats.generated_chars, chunks=stats.generated_chunks,
                    itl=(stats.itl_sum_s, stats.itl_max_s), server_metrics=stats.server_metrics)

    def bookkeeping_failed(self, stage: str) -> None:
        """Metering or event writing failed: logged and counted; the answer still goes out."""
        log.exception("gateway bookkeeping failed at %s (trace %s); the answer is still sent", stage, self.trace_id)
        hardening = self.serving.state.hardening
        if hardening is not None:
            hardening.bookkeeping_failures.labels(stage).inc()

    def finish(self, *, error: str | None, end: float | None = None, first: float | None = None,
               usage: dict[str, Any] | None = None, out_chars: int = 0, chunks: int = 0,
               itl: tuple[float, float] = (0.0, 0.0), server_metrics: dict[str, float] | None = None,
               caller: bool = False) -> None:
        """Record the request once. ``caller``: a caller-caused 4xx, its own outcome (counted
        in ``ablab_gateway_caller_errors``; exposures written, no inference event, so it never
        moves ``error_rate`` or a guardrail). Never raises: a failure here is counted."""
        if self._done:
            return
        self._done = True
        st = self.serving.state
        end = end if end is not None else time.perf_counter()
        name = self.backend.name
        concurrency = 1.0
        if self._entered:
            now_inflight = st.inflight.get(name, 1)
            concurrency = (self._inflight_at_start + now_inflight) / 2.0
            st.inflight[name] = now_inflight - 1
            st.metrics.inflight.labels(name).dec()
        first_event = None
        try:
            if caller:
                self._shadow_jobs = []
            elif self._entered and self.plan.shadows and self.shadow_status is None:
                self.decide_shadows()  # "after": the primary's backend has sent its last byte (or failed)
            first_event = self._record(error, end, first, usage, out_chars, chunks, itl, server_metrics, concurrency, caller)
        except Exception:
            self.bookkeeping_failed("events")
        try:
            if self._shadow_jobs:
                self.launch_shadows()  # after the primary's events: a shadow never delays them
            exp = ",".join(e for e, _ in self.plan.assignments) or None
            var = ",".join(v for _, v in self.plan.assignments) or None
            end_span(self.span, first_event, error=error, experiment=exp, variant=var)
        except Exception:
            self.bookkeeping_failed("shadows_span")

    def _record(self, error: str | None, end: float, first: float | None, usage: dict[str, Any] | None, out_chars: int,
                chunks: int, itl: tuple[float, float], server_metrics: dict[str, float] | None, concurrency: float,
                caller: bool) -> dict[str, Any] | None:
        st = self.serving.state
        name = self.backend.name
        outcome = error or "ok"
        if caller:
            outcome = f"caller_{error}"
            if st.hardening is not None:
                status = (error or "").rsplit("_", 1)[-1]
                st.hardening.caller_errors.labels(self.serving.operation, status).inc()
        st.metrics.requests.labels(self.serving.operation, name, outcome).inc()
        e2e_s = end - self.start
        st.metrics.e2e.labels(name).observe(e2e_s)
        if first is not None:
            st.metrics.ttft.labels(name).observe(first - self.start)
        events: list[dict[str, Any]] = []
        first_event = None
        prompt_tokens, output_tokens = translator_for(self.backend.kind).usage_tokens(usage)
        m = Measurement(
            start=self.start, end=end, first_token=first, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            est_prompt_tokens=self.prompt_estimate(),
            est_output_tokens=chunks or protocol.estimate_tokens(out_chars), generated_chunks=chunks,
            itl_sum_s=itl[0], itl_max_s=itl[1], concurrency=concurrency, error=error, server_metrics=server_metrics,
        )
        unit_id = event_unit_id(self.unit) if self.plan.assignments else ""
        statuses = self.shadow_status if self.shadow_status and SHADOW_STATUS in inference_fields() else None
        for experiment, variant in self.plan.assignments:
            common: dict[str, Any] = {"ts": self.ts, "trace_id": self.trace_id, "experiment": experiment, "variant": variant,
                                      "unit_id": unit_id}
            events.append(exposure_event(**common))
            if caller:
                take_notes(self.trace_id, m)  # its prompt strategies' notes are let go as an event would
                continue
            ev = inference_event(m, **common, strategy=self.plan.strategy_id, backend=self.backend,
                                 model=self.model, with_measures=st.with_measures)
            if statuses and experiment in statuses:
                ev[SHADOW_STATUS] = statuses[experiment]
            events.append(ev)
            first_event = first_event or ev
        if type(self.plan) is not Plan:  # a policy's arm: its choice and features on its events
            from ablab.platform.gateway.policy_hook import annotate

            annotate(self.plan, events)
        if first_event is not None:
            st.metrics.tokens.labels(name, "input").inc(first_event["prompt_tokens"])
            st.metrics.tokens.labels(name, "output").inc(first_event["output_tokens"])
        st.write_events(events)
        return first_event


async def list_models(state: GatewayState) -> Response:
    """``GET /v1/models``: the union of every backend's models (a backend that fails is skipped)."""

    async def one(backend: Backend) -> list[dict[str, Any]]:
        headers = {"authorization": f"Bearer {k}"} if (k := backend.api_key()) else {}
        try:
            r = await state.clients[backend.name].client().get(backend.url + "/models", headers=headers, timeout=5.0)
            data = r.json().get("data") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        return [m for m in data if isinstance(m, dict) and "id" in m] if isinstance(data, list) else []

    seen, out = set(), []
    for models in await asyncio.gather(*(one(b) for b in state.settings.backends.values())):
        for m in models:
            if m["id"] not in seen:
                seen.add(m["id"])
                out.append(m)
    return Response(orjson.dumps({"object": "list", "data": out}), media_type="application/json")
