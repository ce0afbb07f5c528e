"""Results, 10 s time series and attribution of an experiment (from the analytics store)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from ablab.platform import fields
from ablab.platform.analytics import service as analytics
from ablab.platform.analytics.schemas import Attribution, Results, Timeseries
from ablab.platform.api.deps import CurrentExperiment, SessionDep, StateDep, Viewer
from ablab.platform.api.ports import AnalyticsBackend
from ablab.platform.api.problems import responses
from ablab.platform.errors import Invalid, NotFound, Unavailable
from ablab.platform.registry.factors import service as factors

router = APIRouter(prefix="/v1/experiments", tags=["results"])


def _store(state: StateDep) -> AnalyticsBackend:
    if state.analytics is None:
        raise Unavailable("the analytics store is not configured in this API process (ABLAB_ANALYTICS=false)", field="analytics")
    return state.analytics


Store = Annotated[AnalyticsBackend, Depends(_store)]
_ERRORS = responses(NotFound, Invalid, Unavailable)
_METRIC_EXAMPLES = f"e.g. {fields.HEADLINE_LATENCY}, {fields.SLA_LATENCY}, error_rate, accuracy"


@router.get("/{key}/results", response_model=Results, responses=_ERRORS)
def experiment_results(_: Viewer, exp: CurrentExperiment, store: Store, session: SessionDep) -> Results:
    """After a ship, the comparison before it (``window``): later units all get the shipped variant."""
    return analytics.results(store, exp, ship=analytics.ship_of(session, exp))


@router.get("/{key}/timeseries", response_model=Timeseries, responses=_ERRORS)
def experiment_timeseries(
    _: Viewer,
    exp: CurrentExperiment,
    store: Store,
    session: SessionDep,
    metric: Annotated[str, Query(max_length=64, description=_METRIC_EXAMPLES)] = fields.HEADLINE_LATENCY,
) -> dict[str, Any]:
    end = analytics.windows_end(analytics.ship_of(session, exp))  # after a ship: the windows before it
    return analytics.timeseries(store.window_rows(exp.key, end=end), exp, metric=metric)


@router.get("/{key}/attribution", response_model=Attribution, responses=_ERRORS)
def experiment_attribution(_: Viewer, exp: CurrentExperiment, store: Store, session: SessionDep) -> Attribution:
    return analytics.attribution(store, factors.with_declared_defaults(session, exp), ship=analytics.ship_of(session, exp))
