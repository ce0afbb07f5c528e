"""The inference worker: HTTP JSON in/out (``/v1/infer``), and the OpenAI protocol
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``; see ``openai_api``).

Per request: start the clock (``perf_counter``), ask the assigner which strategy serves
the unit, resolve it through the strategy registry, run it, compute cost from the
attributed device-seconds and the versioned price table, emit ``exposure`` and
``inference`` events, and answer with a ``trace_id``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ablab.inference.registry import StrategyNotServable, plan_for
from ablab.inference.serving import events as ev
from ablab.inference.serving.assigners import Assigner
from ablab.inference.serving.service import InferenceService
from ablab.inference.tasks import DOMAINS
from ablab.platform.pricing import PriceTable, load_price_table
from ablab.platform.strategy import Strategy, open_strategy


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unit_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")
    prompt: str = Field(min_length=1, max_length=512)
    domain: str = Field(default="arith", description=f"Domain hint for adapter routing: one of {DOMAINS}.")
    attributes: dict[str, Any] = Field(default_factory=dict)
    max_new_tokens: int = Field(default=8, ge=1, le=32)
    trace_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:\-]+$")


class InferResponse(BaseModel):
    trace_id: str
    experiment: str | None
    variant: str | None
    strategy: str
    output: str
    ttft_ms: float
    tpot_ms: float | None
    e2e_ms: float
    prompt_tokens: int
    output_tokens: int
    device_s: float
    cost_usd: float
    price_version: str
    confidence: float
    revalidated: bool
    adapter: str | None
    error: str | None = None
    # refused by load shedding: the HTTP endpoint answers 503 with Retry-After
    overloaded: bool = False


class Worker:
    def __init__(
        self,
        *,
        service: InferenceService,
        assigner: Assigner,
        sink: ev.EventSink,
        prices: PriceTable | None = None,
        default_strategy: Strategy | None = None,
    ):
        self.service = service
        self.assigner = assigner
        self.sink = sink
        self.prices = prices or load_price_table()
        self.default_strategy = default_strategy or Strategy()
        self.served = 0

    def handle(self, request: InferRequest) -> InferResponse:
        started = time.perf_counter()
        trace_id = request.trace_id or ev.new_trace_id()
        assignments = self.assigner.assign(request.unit_id, {"domain": request.domain, **request.attributes})
        chosen = assignments[0] if assignments else None
        try:
            strategy = open_strategy(chosen.strategy) if chosen else self.default_strategy
        except ValidationError as exc:
            raise StrategyNotServable([f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]) from exc
        plan = plan_for(strategy, self.service.context)  # raises StrategyNotServable with reasons
        served = self.service.serve(
            text=request.prompt, domain=request.domain, plan=plan, started=started, max_new_tokens=request.max_new_tokens
        )
        when = datetime.now(UTC)
        cost, version = self.prices.cost(device_s=served.device_s, device=self.service.device_kind, when=when)
        tpot = served.tpot_s
        response = InferResponse(
            trace_id=trace_id,
            experiment=chosen.experiment if chosen else None,
            variant=chosen.variant if chosen else None,
            strategy=strategy.content_hash,
            output=served.output,
            ttft_ms=served.ttft_s * 1000,
            tpot_ms=None if tpot is None else tpot * 1000,
            e2e_ms=served.e2e_s * 1000,
            prompt_tokens=served.prompt_tokens,
            output_tokens=served.output_tokens,
            device_s=served.device_s,
            cost_usd=cost,
            price_version=version,
            confidence=served.confidence,
            revalidated=served.revalidated,
            adapter=served.adapter,
            error=served.error,
            overloaded=served.overloaded,
        )
        if chosen is not None:
            ts = when.isoformat()
            self.sink.emit(ev.exposure_event(trace_id=trace_id, experiment=chosen.experiment, variant=chosen.variant, unit_id=request.unit_id, ts=ts))
            self.sink.emit(
                ev.inference_event(
                    trace_id=trace_id, experiment=chosen.experiment, variant=chosen.variant, unit_id=request.unit_id,
                    ttft_ms=response.ttft_ms, e2e_ms=response.e2e_ms, tpot_ms=response.tpot_ms,
                    prompt_tokens=response.prompt_tokens, output_tokens=response.output_tokens,
                    device_s=response.device_s, cost_usd=cost, price_version=version,
                    strategy=response.strategy, error=(served.error or "")[:64] or None, ts=ts,
                )
            )
        self.served += 1
        return response

    def close(self) -> None:
        self.service.close()
        self.sink.close()


def create_app(worker: Worker):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse

    from ablab.platform import telemetry

    app = FastAPI(title="ablab inference worker")
    telemetry.instrument(app, service="ablab-worker")  # no-op unless ABLAB_TRACING is on

    @app.post("/v1/infer", response_model=InferResponse, responses={503: {"model": InferResponse, "description": "Shed: queued too long to meet the strategy's TTFT SLO; retry after Retry-After seconds"}})
    def infer(body: InferRequest) -> InferResponse:  # sync: FastAPI's threadpool gives concurrency
        if telemetry.enabled():  # the span's trace id is the event trace_id
            body = body if body.trace_id else body.model_copy(update={"trace_id": ev.new_trace_id()})
        try:
            with telemetry.span("inference", trace_id=body.trace_id, **{"ablab.unit_id": body.unit_id, "ablab.domain": body.domain}):
                response = worker.handle(body)
        except StrategyNotServable as exc:
            raise HTTPException(status_code=422, detail={"title": "strategy not servable", "reasons": exc.reasons}) from exc
        if response.overloaded:  # shed past its TTFT SLO: a client or balancer should retry elsewhere
            return JSONResponse(response.model_dump(mode="json"), status_code=503, headers={"Retry-After": "1"})
        return response

    from ablab.inference.serving.openai_api import register_openai_routes

    register_openai_routes(app, worker)  # the same model as an OpenAI-compatible backend

    @app.get("/healthz")
    def healthz() -> Mapping[str, Any]:
        return {"status": "ok", "served": worker.served}

    @app.get("/v1/strategies")
    def strategies() -> JSONResponse:
        from ablab.inference.registry import REGISTRY

        return JSONResponse({"components": [{"name": c.name, "fields": list(c.fields)} for c in REGISTRY]})

    return app
