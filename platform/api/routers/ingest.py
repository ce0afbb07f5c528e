"""Event ingestion: validate and forward to the event bus (the wired ``IngestPipeline`` does the work).

Per-event problems never fail a batch: valid events go on, invalid ones are dead-lettered
and listed; the whole request is refused only when it cannot be read at all. The body's
size and read time are bounded for every route by the app's body-limit middleware; the
validation runs in the thread pool, so a large batch never holds the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ablab.platform.api.deps import Sdk, StateDep
from ablab.platform.api.ports import IngestAccepted, IngestPipeline
from ablab.platform.api.problems import responses
from ablab.platform.errors import AblabError, Conflict, PayloadTooLarge, RequestTimeout, Unauthorized, Unavailable

router = APIRouter(prefix="/v1", tags=["ingestion"])


class IngestError(BaseModel):
    """One refused record: where it was in the batch and the field at fault."""

    model_config = ConfigDict(extra="allow")


class IngestCounts(BaseModel):
    """What happened to one request's records (202: valid ones are on their way)."""

    accepted: int = Field(description="Records forwarded to the event bus.")
    rejected: int = Field(description="Records refused and dead-lettered, each listed in `errors`.")
    errors: list[IngestError] = Field(default_factory=list)


def _pipeline(state: StateDep) -> IngestPipeline:
    if state.ingest is None:
        raise Unavailable("event ingestion is not enabled in this API process", field="ingest")
    return state.ingest


Pipeline = Annotated[IngestPipeline, Depends(_pipeline)]


async def _run(call: Callable[[], IngestAccepted]) -> JSONResponse:
    result = await run_in_threadpool(call)
    return JSONResponse(result.as_dict(), status_code=202)


_ERRORS: tuple[type[AblabError], ...] = (AblabError, PayloadTooLarge, RequestTimeout, Unavailable)
_REF = "#/components/schemas/"


def _body(schema_name: str, list_key: str) -> dict[str, Any]:
    """One item, a list of items, or ``{list_key: [...]}``: what the ingest accepts (published
    so clients and the API fuzz test see the real event shapes)."""
    item = {"$ref": _REF + schema_name}
    batch = {"type": "array", "items": item, "maxItems": 1000}
    wrapped = {"type": "object", "properties": {list_key: batch}, "required": [list_key], "additionalProperties": False}
    schema = {"anyOf": [item, batch, wrapped]}
    return {"requestBody": {"content": {"application/json": {"schema": schema}}, "required": True}}


def _components() -> dict[str, Any]:
    """The event models' JSON Schemas as OpenAPI components, plus the label and billing record shapes."""
    import json

    from ablab.platform.events import json_schemas

    union = json.loads(json.dumps(json_schemas()["event"]).replace("#/$defs/", _REF))
    components: dict[str, Any] = union.pop("$defs")
    components["Event"] = {k: v for k, v in union.items() if not k.startswith("$")}

    def relaxed(name: str, optional: set[str], extra: dict[str, Any]) -> dict[str, Any]:
        schema: dict[str, Any] = json.loads(json.dumps(components[name]))
        schema["required"] = [f for f in schema.get("required", []) if f not in optional]
        schema["properties"].update(extra)
        return schema

    components["Label"] = relaxed("FeedbackEvent", {"type", "ts"}, {})
    components["BillingRecord"] = relaxed("CostEvent", {"type", "ts"}, {"id": {"type": "string", "maxLength": 128}})
    return components


def install_openapi(app: Any) -> None:
    """Add the event shapes the ingestion routes' request bodies refer to."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(_components())
        built: dict[str, Any] = app.openapi_schema
        return built

    app.openapi = openapi


@router.post("/events", status_code=202, response_model=IngestCounts, responses=responses(*_ERRORS),
             openapi_extra=_body("Event", "events"))
async def post_events(request: Request, _: Sdk, pipeline: Pipeline) -> JSONResponse:
    """A batch of events (`{"events": [...]}`, a list, or one event) → Kafka; 202 with counts."""
    body = await request.body()
    return await _run(lambda: pipeline.events(body))


@router.post("/feedback", status_code=202, response_model=IngestCounts, responses=responses(*_ERRORS),
             openapi_extra=_body("Label", "labels"))
async def post_feedback(request: Request, _: Sdk, pipeline: Pipeline) -> JSONResponse:
    """Labels `{trace_id, correct?, score?, source}` (one, a list, or `{"labels": [...]}`)."""
    body = await request.body()
    return await _run(lambda: pipeline.feedback(body))


@router.post("/webhooks/billing", status_code=202, response_model=IngestCounts,
             responses=responses(*_ERRORS, Unauthorized, Conflict), openapi_extra=_body("BillingRecord", "records"))
async def post_billing(
    request: Request,
    pipeline: Pipeline,
    x_ablab_signature: Annotated[str | None, Header()] = None,
    x_ablab_timestamp: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    """Cost records from a billing provider, authenticated by an HMAC-SHA256 signature; each
    signed delivery is accepted once (a replay answers 409)."""
    body = await request.body()
    return await _run(lambda: pipeline.billing(body, signature=x_ablab_signature, timestamp=x_ablab_timestamp))
