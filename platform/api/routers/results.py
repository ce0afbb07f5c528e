"""Results, 10 s time series and attribution of an experiment (from the analytics store)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ablab.platform.analytics import service as analytics
from ablab.platform.api.deps import SessionDep, StateDep, Viewer
from ablab.platform.api.problems import responses
from ablab.platform.errors import Invalid, NotFound, Unavailable
from ablab.platform.factors import service as factors
from ablab.platform.registry import service as registry

router = APIRouter(prefix="/v1/experiments", tags=["results"])


def _client(state: StateDep) -> Any:
    store = state.extras.get("analytics")
    if store is None:
        raise Unavailable("the analytics store is not configured in this API process (ABLAB_ANALYTICS=false)", field="analytics")
    return store.client


@router.get("/{key}/results", responses=responses(NotFound, Invalid, Unavailable))
def experiment_results(key: str, session: SessionDep, state: StateDep, _: Viewer) -> dict[str, Any]:
    exp = registry.to_read(registry.get_experiment(session, key))
    return analytics.results(_client(state), exp)


@router.get("/{key}/timeseries", responses=responses(NotFound, Invalid, Unavailable))
def experiment_timeseries(
    key: str,
    session: SessionDep,
    state: StateDep,
    _: Viewer,
    metric: Annotated[str, Query(max_length=64, description="e.g. e2e_ms, ttft_ms, error_rate, accuracy")] = "e2e_ms",
) -> dict[str, Any]:
    exp = registry.to_read(registry.get_experiment(session, key))
    return analytics.timeseries(_client(state), exp, metric=metric)


@router.get("/{key}/attribution", responses=responses(NotFound, Invalid, Unavailable))
def experiment_attribution(key: str, session: SessionDep, state: StateDep, _: Viewer) -> dict[str, Any]:
    exp = factors.with_declared_defaults(session, registry.to_read(registry.get_experiment(session, key)))
    return analytics.attribution(_client(state), exp)
