"""Ship a winning variant to all of an experiment's traffic, as an audited new phase.

``POST /v1/experiments/{key}/ship`` (editor) reads the experiment's current results and
ships the variant only when its decision is ``ship``; otherwise a 409 problem carries the
decision and its reasons (``force: true`` with a ``reason`` overrides it, audited as
forced). ``GET /v1/experiments/{key}/ship`` (viewer) says which ship is in force. The rules
and what a ship does to layers and holdouts: :mod:`ablab.platform.registry.ship`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse

from ablab.platform.api.deps import Editor, SessionDep, StateDep, Viewer, parse_if_match
from ablab.platform.api.problems import problem, responses
from ablab.platform.errors import Conflict, Invalid, NotFound, PreconditionFailed, Unavailable
from ablab.platform.registry import service
from ablab.platform.registry.schemas import ExperimentRead
from ablab.platform.registry.ship import ShipRefused, ShipRequest, ShipResult, ShipStatus, current_ship, ship_variant
from ablab.platform.stats.result_models import Results

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])


@router.post(
    "/{key}/ship",
    response_model=ShipResult,
    responses={
        **responses(NotFound, Conflict, PreconditionFailed, Invalid, Unavailable),
        409: {"description": "Not shippable: the problem's `decision` and `reasons` say why, `detail` what to do",
              "content": {"application/problem+json": {"schema": {"type": "object"}}}},
    },
)
def ship(
    key: str,
    body: ShipRequest,
    session: SessionDep,
    state: StateDep,
    principal: Editor,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> ShipResult | JSONResponse:
    """Ship a variant whose decision is `ship` (a win on the primary metrics, every guardrail
    passing): a new phase gives it all of the experiment's traffic (weight 1, the others 0,
    traffic 1, forced units cleared, status running); targeting, layer range and holdout stay.
    The SDK config's revision and ETag move. Audited (action `ship`, with the decision and its
    evidence). A retry of the same ship answers it again (`replayed: true`), unchanged."""
    store = state.analytics

    def results_of(exp: ExperimentRead) -> Results:
        from ablab.platform.analytics import service as analytics

        assert store is not None  # after an earlier ship: its comparison, as the results route reads it
        return analytics.results(store, exp, settings=state.settings, ship=analytics.ship_of(session, exp))

    try:
        shipped = ship_variant(
            session, key=key, request=body, actor=principal.name, results_of=results_of if store is not None else None,
            expected_version=parse_if_match(if_match) if if_match is not None else None,
        )
    except ShipRefused as exc:
        extra: dict[str, Any] = {"decision": exc.decision, "reasons": exc.reasons} if exc.decision is not None else {}
        return problem(exc.status_code, exc.title, exc.message, field=exc.field, **extra)
    response.headers["ETag"] = f'"{shipped.experiment.version}"'
    return shipped


@router.get("/{key}/ship", responses=responses(NotFound))
def ship_status(key: str, session: SessionDep, _: Viewer) -> ShipStatus:
    """The ship in force (the variant, its phase, who shipped it, when, forced or not, and the
    decision's evidence), or `shipped: null` when the current phase is not a ship's."""
    service.get_experiment(session, key)  # 404 for an unknown key
    return ShipStatus(experiment=key, shipped=current_ship(session, key))
