"""Assignment over HTTP and the SDK's config feed: the hot paths, one small DB read each.

The two assignment routes are ``async`` with an ``async`` auth dependency: FastAPI runs
every sync route and every sync dependency in a thread pool, one thread hop each, and on
``POST /v1/assign`` those hops cost more CPU than the assignment itself (measured in
docs/benchmarks/control-plane.md). The token and assignment caches touch the database
only on a miss / once per TTL, so the event loop rarely waits on it; the token check's
one-row revocation read is the exception (see ``state.TokenCache``).

Nothing a caller sends runs unbounded here: attributes are bounded scalars, targeting
regexes run on RE2 (linear time), and large batches run on a worker thread.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ablab.platform.api.deps import Sdk, StateDep, _principal
from ablab.platform.api.problems import responses
from ablab.platform.api.state import AppState, Principal
from ablab.platform.assignment import assign, assign_batch
from ablab.platform.assignment.payload import SdkConfig
from ablab.platform.assignment.targeting import attributes_problem
from ablab.platform.auth import allows
from ablab.platform.errors import Forbidden, Invalid
from ablab.platform.registry.schemas import Scope

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


class _AssignedJSON:
    """Each assignment's JSON, serialized once per compiled config (strategies are constant)."""

    def __init__(self) -> None:
        self._config: object = None
        self._by_id: dict[int, str] = {}

    def fragment(self, config: object, a: Any) -> str:
        if config is not self._config:
            self._config, self._by_id = config, {}
        text = self._by_id.get(id(a))
        if text is None:  # assignments live in the (kept) compiled config: their ids are stable
            text = self._by_id[id(a)] = json.dumps(_out(a), separators=(",", ":"), ensure_ascii=False, default=str)
        return text


_fragments = _AssignedJSON()


def _json(text: str) -> Response:
    return Response(content=text.encode(), media_type="application/json")


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.ablab
    return state


async def _sdk_principal(request: Request, authorization: Annotated[str | None, Header()] = None) -> Principal:
    """The same check as ``deps.require(Scope.sdk)``, without the thread-pool hop."""
    principal = _principal(_state(request), authorization)
    if not allows(principal.scope, Scope.sdk):
        raise Forbidden(f"this route needs the 'sdk' scope; the token has '{principal.scope.value}'", field="Authorization")
    return principal


SdkAsync = Annotated[Principal, Depends(_sdk_principal)]


# Routes return JSON text directly: the payload is built from trusted engine output, so
# FastAPI's response validation would only cost time on the hottest path.
def _check_attributes(attributes: dict[str, Any] | None, where: str) -> None:
    """Bounded attributes (count, name and value length, scalars), so every targeting
    rule's work per request is bounded too; refused with the attribute named."""
    problem = attributes_problem(attributes)
    if problem is not None:
        name, why = problem
        raise Invalid(why, field=f"{where}.{name}" if name else where)


# A batch this large is assigned on a worker thread: at ~10 µs per unit, inline it would
# hold the event loop (and every other request, /healthz included) for up to ~100 ms.
INLINE_BATCH = 256


@router.post("/assign", response_model=AssignResponse, responses=responses(Invalid))
async def assign_unit(body: AssignRequest, request: Request, _: SdkAsync) -> Response:
    _check_attributes(body.attributes, "attributes")
    state = _state(request)
    config = state.assignments.current().config
    found = assign(config, body.unit_id, body.attributes, body.experiments)
    for a in found:
        state.metrics.assignments.labels(a.experiment, a.variant).inc()
    return _json('{"assignments":[' + ",".join(_fragments.fragment(config, a) for a in found) + "]}")


@router.post("/assign/batch", response_model=BatchResponse, responses=responses(Invalid))
async def assign_units(body: BatchRequest, request: Request, _: SdkAsync) -> Response:
    for i, unit in enumerate(body.units):
        _check_attributes(unit.attributes, f"units.{i}.attributes")
    config = _state(request).assignments.current().config
    ids = [u.unit_id for u in body.units]
    attrs = [u.attributes for u in body.units] if any(u.attributes for u in body.units) else None
    if len(ids) <= INLINE_BATCH:
        results = assign_batch(config, ids, attrs, body.experiments)
    else:
        results = await run_in_threadpool(assign_batch, config, ids, attrs, body.experiments)
    fragment = _fragments.fragment
    rows = ("[" + ",".join(fragment(config, a) for a in unit) + "]" for unit in results)
    return _json('{"results":[' + ",".join(rows) + "]}")


@router.get("/sdk/config", response_model=None,
            responses={200: {"model": SdkConfig, "description": "Everything an SDK needs to assign locally"},
                       304: {"description": "Not modified (If-None-Match matched)"}})
def sdk_config(
    state: StateDep, _: Sdk, response: Response, if_none_match: Annotated[str | None, Header()] = None
) -> dict[str, Any] | Response:
    cache = state.assignments.current()
    if if_none_match is not None and if_none_match.strip() == cache.etag:
        return Response(status_code=304, headers={"ETag": cache.etag})
    response.headers["ETag"] = cache.etag
    response.headers["Cache-Control"] = "no-cache"
    return cache.payload
