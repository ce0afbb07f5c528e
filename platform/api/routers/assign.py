"""Assignment over HTTP and the SDK's config feed. No database work on these hot paths."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ablab.platform.api.deps import Sdk, StateDep
from ablab.platform.assignment import assign, assign_batch

router = APIRouter(prefix="/v1", tags=["assignment"])

MAX_BATCH = 10_000


class AssignRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit_id: str = Field(min_length=1, max_length=256)
    attributes: dict[str, Any] | None = None
    experiments: list[str] | None = Field(default=None, max_length=1000)


class AssignmentOut(BaseModel):
    experiment: str
    variant: str
    strategy: dict[str, Any]


class AssignResponse(BaseModel):
    assignments: list[AssignmentOut]


class BatchUnit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit_id: str = Field(min_length=1, max_length=256)
    attributes: dict[str, Any] | None = None


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    units: list[BatchUnit] = Field(min_length=1, max_length=MAX_BATCH)
    experiments: list[str] | None = Field(default=None, max_length=1000)


class BatchResponse(BaseModel):
    results: list[list[AssignmentOut]]


def _out(a: Any) -> dict[str, Any]:
    return {"experiment": a.experiment, "variant": a.variant, "strategy": a.strategy}


# Routes return JSONResponse directly: the payload is built from trusted engine output, so
# FastAPI's response validation would only cost time on the hottest path.
@router.post("/assign", response_model=AssignResponse)
def assign_unit(body: AssignRequest, state: StateDep, _: Sdk) -> JSONResponse:
    cache = state.assignments.current()
    found = assign(cache.config, body.unit_id, body.attributes, body.experiments)
    for a in found:
        state.metrics.assignments.labels(a.experiment, a.variant).inc()
    return JSONResponse({"assignments": [_out(a) for a in found]})


@router.post("/assign/batch", response_model=BatchResponse)
def assign_units(body: BatchRequest, state: StateDep, _: Sdk) -> JSONResponse:
    cache = state.assignments.current()
    ids = [u.unit_id for u in body.units]
    attrs = [u.attributes for u in body.units] if any(u.attributes for u in body.units) else None
    results = assign_batch(cache.config, ids, attrs, body.experiments)
    return JSONResponse({"results": [[_out(a) for a in unit] for unit in results]})


@router.get("/sdk/config", responses={304: {"description": "Not modified (If-None-Match matched)"}})
def sdk_config(
    state: StateDep, _: Sdk, response: Response, if_none_match: Annotated[str | None, Header()] = None
) -> Any:
    cache = state.assignments.current()
    if if_none_match is not None and if_none_match.strip() == cache.etag:
        return Response(status_code=304, headers={"ETag": cache.etag})
    response.headers["ETag"] = cache.etag
    response.headers["Cache-Control"] = "no-cache"
    return cache.payload
