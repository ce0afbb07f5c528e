"""Event ingestion: validate and forward to Kafka (``ablab.streaming.ingest`` does the work).

Per-event problems never fail a batch: valid events go on, invalid ones are dead-lettered
and listed; the whole request is refused only when it cannot be read at all. The body's
size and read time are bounded for every route by the app's body-limit middleware; the
validation runs in the thread pool, so a large batch never holds the event loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ablab.platform.api.deps import Sdk, StateDep
from ablab.platform.api.problems import problem, responses
from ablab.platform.errors import AblabError, Conflict, PayloadTooLarge, RequestTimeout, Unauthorized, Unavailable

router = APIRouter(prefix="/v1", tags=["ingestion"])


def _pipeline(state: StateDep) -> Any:
    pipeline = state.extras.get("ingest")
    if pipeline is None:
        raise Unavailable("event ingestion is not enabled in this API process", field="ingest")
    return pipeline


async def _run(call: Any, **kwargs: Any) -> JSONResponse:
    from ablab.streaming.ingest import IngestRejected

    try:
        result = await run_in_threadpool(lambda: call(**kwargs))
    except IngestRejected as exc:
        return problem(exc.status_code, _TITLES.get(exc.status_code, "Rejected"), exc.message, field=exc.field)
    return JSONResponse(result.as_dict(), status_code=202)


_TITLES = {400: "Bad request", 401: "Unauthorized", 409: "Conflict", 413: "Payload too large"}
_BODY = {"requestBody": {"content": {"application/json": {"schema": {"type": "object"}}}, "required": True}}
_ERRORS: tuple[type[AblabError], ...] = (AblabError, PayloadTooLarge, RequestTimeout, Unavailable)


@router.post("/events", status_code=202, responses=responses(*_ERRORS), openapi_extra=_BODY)
async def post_events(request: Request, state: StateDep, _: Sdk) -> JSONResponse:
    """A batch of events (`{"events": [...]}`, a list, or one event) → Kafka; 202 with counts."""
    from ablab.streaming.ingest import ingest_events

    pipeline = _pipeline(state)
    body = await request.body()
    return await _run(ingest_events, body=body, sink=pipeline.emitter, stats=pipeline.stats,
                      variants_of=pipeline.variants_of, limits=pipeline.limits)


@router.post("/feedback", status_code=202, responses=responses(*_ERRORS), openapi_extra=_BODY)
async def post_feedback(request: Request, state: StateDep, _: Sdk) -> JSONResponse:
    """Labels `{trace_id, correct?, score?, source}` (one, a list, or `{"labels": [...]}`)."""
    from ablab.streaming.ingest import ingest_feedback

    pipeline = _pipeline(state)
    body = await request.body()
    return await _run(ingest_feedback, body=body, sink=pipeline.emitter, stats=pipeline.stats,
                      variants_of=pipeline.variants_of, limits=pipeline.limits)


@router.post("/webhooks/billing", status_code=202, responses=responses(*_ERRORS, Unauthorized, Conflict),
             openapi_extra=_BODY)
async def post_billing(
    request: Request,
    state: StateDep,
    x_ablab_signature: Annotated[str | None, Header()] = None,
    x_ablab_timestamp: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Cost records from a billing provider, authenticated by an HMAC-SHA256 signature; each
    signed delivery is accepted once (a replay answers 409)."""
    from ablab.streaming.ingest import ingest_billing

    pipeline = _pipeline(state)
    body = await request.body()
    return await _run(
        ingest_billing,
        body=body,
        signature=x_ablab_signature,
        timestamp=x_ablab_timestamp,
        secret=state.settings.webhook_secret.get_secret_value(),
        sink=pipeline.emitter,
        stats=pipeline.stats,
        replay_guard=pipeline.replay_guard,
        variants_of=pipeline.variants_of,
        limits=pipeline.limits,
    )
