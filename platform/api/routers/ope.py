"""``POST /v1/experiments/{key}/ope``: off-policy evaluation of a candidate policy on the
experiment's logged events in the analytics store (issue 33).

The numbers are ``ablab ope``'s: both hand an Arrow table of the experiment's events to
:func:`ablab.platform.policy.candidate.ope_from_events`. The store is read through the
analytics port's ``logged_events`` (one scan of ``raw_events``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from ablab.platform.analytics import service as analytics
from ablab.platform.api.deps import CurrentExperiment, SessionDep, StateDep, Viewer
from ablab.platform.api.ports import AnalyticsBackend
from ablab.platform.api.problems import responses
from ablab.platform.errors import Invalid, NotFound, Unavailable

router = APIRouter(prefix="/v1/experiments", tags=["results"])
_ERRORS = responses(NotFound, Invalid, Unavailable)


def _store(state: StateDep) -> AnalyticsBackend:
    if state.analytics is None:
        raise Unavailable("the analytics store is not configured in this API process (ABLAB_ANALYTICS=false)", field="analytics")
    return state.analytics


Store = Annotated[AnalyticsBackend, Depends(_store)]


class OpeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: dict[str, Any] = Field(description="The candidate: {kind: fixed, arm} | {kind: rule, ...} | {kind: slo_router, ...}.")
    metric: str | None = Field(default=None, max_length=64,
                               description="Default: the candidate's objective, else the experiment's primary metric.")
    model: dict[str, Any] | None = Field(default=None, description="A fitted model for an slo_router candidate "
                                                                   "(default: cross-fitted on the logs).")


class Estimate(BaseModel):
    estimate: float | None
    ci: list[float | None]
    se: float | None


class OpeResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    experiment: str | None
    metric: str
    candidate: dict[str, Any]
    n: int
    units: int
    ips: Estimate
    snips: Estimate
    dr: Estimate
    ess: float
    support: dict[str, Any]
    logged: list[dict[str, Any]]
    notes: list[str]


@router.post("/{key}/ope", response_model=OpeResult, responses=_ERRORS)
def experiment_ope(_: Viewer, exp: CurrentExperiment, store: Store, session: SessionDep, body: OpeRequest) -> dict[str, Any]:
    """What the candidate policy would have achieved on the logged requests: IPS, SNIPS and
    doubly robust estimates with 95 % intervals over randomization units, the effective sample
    size, and a warning where the candidate picks arms the logs never tried."""
    from ablab.platform.policy.candidate import ope_from_events
    from ablab.platform.policy.model import PolicyModel
    from ablab.platform.policy.spec import PolicyInvalid

    spec = analytics.stats_spec(exp, ship=analytics.ship_of(session, exp))  # after a ship: the logs before it
    model = None
    if body.model is not None:
        try:
            model = PolicyModel.from_json(body.model)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # any malformed document
            raise Invalid(f"model: not a policy model document ({exc!r})", field="model") from exc
    try:
        return ope_from_events(store.logged_events(exp.key), spec, body.policy, metric=body.metric, model=model)
    except PolicyInvalid as exc:
        raise Invalid(f"{exc.field}: {exc}", field=exc.field) from exc
