"""Assignment over HTTP and the SDK's config feed: the hot paths, one small DB read each.

The two assignment routes are ``async`` with an ``async`` auth dependency: FastAPI runs
every sync route and every sync dependency in a thread pool, one thread hop each, and on
``POST /v1/assign`` those hops cost more CPU than the assignment itself (measured in
docs/benchmarks/control-plane.md). The token and assignment caches touch the database
only on a miss / once per TTL, so the event loop rarely waits on it; the token check's
one-row revocation read is the exception (see ``state.TokenCache``).

Nothing a caller sends runs unbounded here: attributes are bounded scalars, targeting
regexes run on RE2 (linear time), and large batches run on a worker thread.

A policy variant's assignment also carries ``decision`` (docs/policies.md, "Assign API"): the
arm drawn by the same :class:`~ablab.platform.policy.serve.PolicyServer`, salt and draw key
(the request's ``trace_id``) as the gateway and the SDK, so all three choose the same arm for
the same trace, features and model version.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
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
from ablab.platform.events import Identifier
from ablab.platform.policy.serve import PolicyServer, served_strategy
from ablab.platform.policy.spec import policy_of
from ablab.platform.registry.schemas import Scope

router = APIRouter(prefix="/v1", tags=["assignment"])

MAX_BATCH = 10_000


TokenCount = Annotated[int, Field(strict=True, ge=0, le=10**9)]


class PolicyFeatures(BaseModel):
    """What a policy reads of the request besides its ``attributes`` (``attr.<name>``);
    a feature left out is absent, as in the gateway and the SDK."""

    model_config = ConfigDict(extra="forbid")
    prompt_tokens: TokenCount | None = Field(default=None, description="The prompt's token count known before the call.")
    max_tokens: TokenCount | None = Field(default=None, description="The request's max_tokens.")


TraceId = Annotated[Identifier | None, Field(description="The request's trace id: a policy variant's draw key "
                                                         "(default: a new one, returned in `decision.trace_id`).")]


class AssignRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit_id: str = Field(min_length=1, max_length=256)
    attributes: dict[str, Any] | None = None
    experiments: list[str] | None = Field(default=None, max_length=1000)
    features: PolicyFeatures | None = None
    trace_id: TraceId = None


class PolicyDecision(BaseModel):
    """A policy variant's choice for this request, as the gateway would make it."""

    arm: str
    propensity: float = Field(description="The exact probability the policy gave this arm")
    policy_version: str = Field(description="The model's version (`uniform:<hash>` before one exists, `rule:<hash>`)")
    strategy: dict[str, Any] = Field(description="The arm's strategy merged with the unit's other assignments' "
                                                 "as the gateway merges them: what to serve")
    trace_id: str = Field(description="The draw key: log the request's events under it")


class AssignmentOut(BaseModel):
    experiment: str
    variant: str
    strategy: dict[str, Any]
    decision: PolicyDecision | None = Field(default=None, description="Only for a policy variant")


class AssignResponse(BaseModel):
    assignments: list[AssignmentOut]


class BatchUnit(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit_id: str = Field(min_length=1, max_length=256)
    attributes: dict[str, Any] | None = None
    features: PolicyFeatures | None = None
    trace_id: TraceId = None


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


def _policies(request: Request) -> PolicyServer:
    """This app's deciders (one per app, like the gateway's per state), rebuilt by the server
    only when a variant's policy or model object changes, i.e. when the config is recompiled."""
    server: PolicyServer | None = getattr(request.app.state, "ablab_policies", None)
    if server is None:
        server = request.app.state.ablab_policies = PolicyServer()
    return server


def _decisions(server: PolicyServer, config: Any, found: Sequence[Any], trace_id: str | None,
               features: PolicyFeatures | None, attributes: Mapping[str, Any] | None) -> dict[int, str]:
    """The ``decision`` JSON of each policy assignment in ``found`` (by index), drawn as the
    gateway draws: by the request's trace id, with the features it was given (absent ones
    absent) and the config's model of the variant."""
    out: dict[int, str] = {}
    trace = trace_id
    for i, a in enumerate(found):
        policy = policy_of(a.strategy)
        if policy is None:
            continue
        trace = trace or uuid.uuid4().hex  # one per request, shared by its policy assignments
        served = server.decide(a.experiment, a.variant, policy, draw_key=trace,
                               model=config.policy_models.get((a.experiment, a.variant)),
                               prompt_tokens=lambda: features.prompt_tokens if features is not None else None,
                               max_tokens=features.max_tokens if features is not None else None, attributes=attributes)
        if served is None:  # a policy this process cannot read: the assignment as it is
            continue
        d = served.decision
        strategy = served_strategy([f.strategy for f in found], i, served.strategy)
        out[i] = json.dumps({"arm": d.arm, "propensity": d.propensity, "policy_version": d.model_version,
                             "strategy": strategy, "trace_id": trace}, separators=(",", ":"), ensure_ascii=False, default=str)
    return out


def _unit_json(config: Any, found: Sequence[Any], decisions: Mapping[int, str]) -> str:
    fragment = _fragments.fragment
    if not decisions:
        return ",".join(fragment(config, a) for a in found)
    parts = []
    for i, a in enumerate(found):
        text = fragment(config, a)
        parts.append(text if i not in decisions else f'{text[:-1]},"decision":{decisions[i]}}}')
    return ",".join(parts)


def _has_policy(found: Sequence[Any]) -> bool:
    return any("policy" in a.strategy for a in found)


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
    decisions = (_decisions(_policies(request), config, found, body.trace_id, body.features, body.attributes)
                 if _has_policy(found) else {})
    return _json('{"assignments":[' + _unit_json(config, found, decisions) + "]}")


def _batch_json(server: PolicyServer, config: Any, units: list[BatchUnit], results: list[Any]) -> str:
    rows = []
    for unit, found in zip(units, results):
        decisions = (_decisions(server, config, found, unit.trace_id, unit.features, unit.attributes)
                     if _has_policy(found) else {})
        rows.append("[" + _unit_json(config, found, decisions) + "]")
    return '{"results":[' + ",".join(rows) + "]}"


@router.post("/assign/batch", response_model=BatchResponse, responses=responses(Invalid))
async def assign_units(body: BatchRequest, request: Request, _: SdkAsync) -> Response:
    for i, unit in enumerate(body.units):
        _check_attributes(unit.attributes, f"units.{i}.attributes")
    config = _state(request).assignments.current().config
    ids = [u.unit_id for u in body.units]
    attrs = [u.attributes for u in body.units] if any(u.attributes for u in body.units) else None
    server = _policies(request)
    if len(ids) <= INLINE_BATCH:
        results = assign_batch(config, ids, attrs, body.experiments)
        return _json(_batch_json(server, config, body.units, results))
    results = await run_in_threadpool(assign_batch, config, ids, attrs, body.experiments)
    return _json(await run_in_threadpool(_batch_json, server, config, body.units, results))


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
