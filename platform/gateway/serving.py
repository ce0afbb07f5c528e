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
from ablab.platform.gateway.emit import event_unit_id
from ablab.platform.gateway.metering import Measurement, exposure_event, inference_event, strategy_id
from ablab.platform.gateway.observe import GatewayMetrics, end_span, start_span
from ablab.platform.gateway.prompting import rewrite_request
from ablab.platform.gateway.relay import SseResponse, UpstreamResponse
from ablab.platform.gateway.rewrite import StrategyError, strategy_problems
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.gateway.shadow import SHADOW_STATUS, ShadowJob, ShadowRunner, ShadowSpec, inference_fields, spec_of
from ablab.platform.gateway.stream import StreamMeter
from ablab.platform.gateway.translators import translator_for
from ablab.platform.gateway.upstream import UpstreamPool

log = logging.getLogger(__name__)
_UNIT_HEADER = "x-ablab-unit"
_ATTR_PREFIX = "x-ablab-attr-"
# Not copied from the backend's response: framing (the server sets its own) and the headers uvicorn adds.
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding", "date", "server"})


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

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    def check(self, body: dict[str, Any]) -> None:
        raise NotImplementedError

    async def handle(self, request: Request) -> Response:
        st = self.state
        start = time.perf_counter()
        ts = datetime.now(UTC)
        trace_id = uuid.uuid4().hex
        raw = await request.body()
        try:
            body = protocol.parse_body(raw)
            self.check(body)
        except protocol.ProtocolError as exc:
            return Response(protocol.error_body(str(exc), param=exc.param), status_code=exc.status,
                            media_type="application/json", headers={"x-ablab-trace-id": trace_id})
        headers = request.headers
        unit = headers.get(_UNIT_HEADER) or (body.get("user") if isinstance(body.get("user"), str) else None)
        plan = st.plan(unit, _attributes(headers))
        out_headers = {"x-ablab-trace-id": trace_id}
        if plan.assignments:
            out_headers["x-ablab-experiment"] = ",".join(e for e, _ in plan.assignments)
            out_headers["x-ablab-variant"] = ",".join(v for _, v in plan.assignments)
        backend = st.settings.backend(plan.strategy.get("backend") if plan.problems == () else None)
        translator = translator_for(backend.kind)
        stream = body.get("stream") is True
        call = _Call(self, plan=plan, unit=unit or "", trace_id=trace_id, ts=ts, start=start, backend=backend,
                     body=body, model=None)
        call.authorization = headers.get("authorization")
        if plan.problems:
            call.finish(error="strategy_unsupported")
            msg = "this request's variant cannot be served: " + "; ".join(plan.problems)
            return Response(protocol.error_body(msg, kind="ablab_strategy_error"), status_code=500,
                            media_type="application/json", headers=out_headers)
        try:
            upstream = await rewrite_request(st, body, plan.strategy, chat=self.chat, backend=backend, trace_id=trace_id, events=len(plan.assignments))
        except StrategyError as exc:
            call.finish(error="strategy_unsupported")
            return Response(protocol.error_body(str(exc), kind="ablab_strategy_error"), status_code=500,
                            media_type="application/json", headers=out_headers)
        before = upstream is body and not stream
        upstream = translator.upstream_body(upstream if upstream is not body else dict(body), stream=stream) if stream else upstream
        content = raw if before else orjson.dumps(upstream)
        call.model = upstream.get("model") if isinstance(upstream.get("model"), str) else None
        # identity: stream bytes are relayed raw, so they must not arrive compressed
        up_headers = {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": trace_id}
        if plan.assignments:
            up_headers["x-ablab-experiment"] = out_headers["x-ablab-experiment"]
            up_headers["x-ablab-variant"] = out_headers["x-ablab-variant"]
        if (key := backend.api_key()) is not None:
            up_headers["authorization"] = f"Bearer {key}"
        elif auth := headers.get("authorization"):
            up_headers["authorization"] = auth  # a pass-through key meant for the backend
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
                            prompt_tokens=protocol.estimate_tokens(len(protocol.message_text(body))))
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
        error = None
        usage, chars, metrics = None, 0, {}
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError:
            parsed = None
            error = "backend_invalid_json"
        if resp.status_code >= 400:
            error = f"backend_http_{resp.status_code}"
        elif parsed is not None:
            usage, chars = protocol.response_view(parsed)
            metrics = translator_for(call.backend.kind).server_metrics(parsed) if isinstance(parsed, dict) else {}
        call.finish(error=error, end=now, usage=usage, out_chars=chars, server_metrics=metrics)
        headers = {k: v for k, v in resp.headers.items() if k not in _HOP_HEADERS and not k.startswith("x-ablab-")}
        headers.update(out_headers)
        return Response(data, status_code=resp.status_code, headers=headers)

    async def _relay(self, call: _Call, resp: UpstreamResponse, meter: StreamMeter) -> AsyncIterator[bytes]:
        stats = meter.stats
        finished = False
        clock = time.perf_counter
        try:
            async for data in resp.aiter_raw():
                out = meter.feed(data, clock())
                if stats.done and not finished:
                    finished = True
                    call.finish_stream(stats, error=_stream_error(stats))
                if out:
                    yield out
            tail = meter.close()
            if not finished:
                finished = True
                call.finish_stream(stats, error=_stream_error(stats) or "backend_stream_incomplete")
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

    __slots__ = ("serving", "plan", "unit", "trace_id", "ts", "start", "backend", "body", "model", "span",
                 "_inflight_at_start", "_entered", "_done", "authorization", "shadow_status", "_shadow_jobs")

    def __init__(self, serving: OpenAIServing, *, plan: Plan, unit: str, trace_id: str, ts: datetime, start: float,
                 backend: Backend, body: dict[str, Any], model: str | None) -> None:
        self.serving, self.plan, self.unit, self.trace_id, self.ts, self.start = serving, plan, unit, trace_id, ts, start
        self.backend, self.body, self.model = backend, body, model
        self.span = None
        self._inflight_at_start = 1
        self._entered = False
        self._done = False
        self.authorization: str | None = None
        self.shadow_status: dict[str, str] | None = None  # experiment → "sent" | "dropped", once decided
        self._shadow_jobs: list[tuple[ShadowJob, Any]] = []

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
                job = ShadowJob(spec=spec, experiment=experiment, variant=variant, unit_id=unit_id,
                                primary_trace=self.trace_id, body=self.body, chat=self.serving.chat,
                                endpoint=self.serving.endpoint, authorization=self.authorization)
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

    def finish(self, *, error: str | None, end: float | None = None, first: float | None = None,
               usage: dict[str, Any] | None = None, out_chars: int = 0, chunks: int = 0,
               itl: tuple[float, float] = (0.0, 0.0), server_metrics: dict[str, float] | None = None) -> None:
        if self._done:
            return
        self._done = True
        st = self.serving.state
        if self._entered and self.plan.shadows and self.shadow_status is None:
            self.decide_shadows()  # "after": the primary's backend has sent its last byte (or failed)
        end = end if end is not None else time.perf_counter()
        name = self.backend.name
        concurrency = 1.0
        if self._entered:
            now_inflight = st.inflight.get(name, 1)
            concurrency = (self._inflight_at_start + now_inflight) / 2.0
            st.inflight[name] = now_inflight - 1
            st.metrics.inflight.labels(name).dec()
        prompt_tokens, output_tokens = translator_for(self.backend.kind).usage_tokens(usage)
        m = Measurement(
            start=self.start, end=end, first_token=first, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            est_prompt_tokens=protocol.estimate_tokens(len(protocol.message_text(self.body))),
            est_output_tokens=chunks or protocol.estimate_tokens(out_chars), generated_chunks=chunks,
            itl_sum_s=itl[0], itl_max_s=itl[1], concurrency=concurrency, error=error, server_metrics=server_metrics,
        )
        st.metrics.requests.labels(self.serving.operation, name, error or "ok").inc()
        e2e_s = end - self.start
        st.metrics.e2e.labels(name).observe(e2e_s)
        if first is not None:
            st.metrics.ttft.labels(name).observe(first - self.start)
        events: list[dict[str, Any]] = []
        first_event = None
        unit_id = event_unit_id(self.unit) if self.plan.assignments else ""
        statuses = self.shadow_status if self.shadow_status and SHADOW_STATUS in inference_fields() else None
        for experiment, variant in self.plan.assignments:
            common = {"ts": self.ts, "trace_id": self.trace_id, "experiment": experiment, "variant": variant, "unit_id": unit_id}
            events.append(exposure_event(**common))
            ev = inference_event(m, **common, strategy=self.plan.strategy_id, backend=self.backend,
                                 model=self.model, with_measures=st.with_measures)
            if statuses and experiment in statuses:
                ev[SHADOW_STATUS] = statuses[experiment]
            events.append(ev)
            first_event = first_event or ev
        if first_event is not None:
            st.metrics.tokens.labels(name, "input").inc(first_event["prompt_tokens"])
            st.metrics.tokens.labels(name, "output").inc(first_event["output_tokens"])
        st.write_events(events)
        if self._shadow_jobs:
            self.launch_shadows()  # after the primary's events: a shadow never delays them
        exp = ",".join(e for e, _ in self.plan.assignments) or None
        var = ",".join(v for _, v in self.plan.assignments) or None
        end_span(self.span, first_event, error=error, experiment=exp, variant=var)


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
