"""Experiments: CRUD with ETag/If-Match, lifecycle, audit history."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any, Literal

from fastapi import APIRouter, BackgroundTasks, Header, Query, Response, status

from ablab.platform.api.deps import Editor, Limit, Offset, SessionDep, StateDep, Viewer, parse_if_match
from ablab.platform.api.problems import responses
from ablab.platform.api.state import AppState
from ablab.platform.errors import Conflict, Invalid, NotFound, PreconditionFailed, PreconditionRequired
from ablab.platform.registry import service
from ablab.platform.registry.models import Experiment
from ablab.platform.registry.schemas import (
    AuditRead,
    ExperimentCreate,
    ExperimentPage,
    ExperimentRead,
    ExperimentUpdate,
    Status,
)

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])
log = logging.getLogger(__name__)


def _versioned(response: Response, exp: Experiment) -> ExperimentRead:
    """The read model, with the version as ETag for the next If-Match."""
    response.headers["ETag"] = f'"{exp.version}"'
    return service.to_read(exp)


def _sync_rollup(state: AppState, exp: ExperimentRead) -> None:
    """Its SLOs and segment choice to the per-unit rollup, so results reads never write. Run as
    a background task, after the registry transaction committed (the store never holds the
    registry's transaction open, and a store failure never undoes the write). A failure is
    logged here and counted by the backend (``ablab_rollup_sync_failures``); until the
    monitor's pass retries, results read ``raw_events`` (the rollup is not current)."""
    store = state.analytics
    if store is None:
        return
    from ablab.platform.analytics.service import sync_rollup

    try:
        sync_rollup(store.sync_rollup, exp, settings=state.settings)
    except Exception:
        log.warning("rollup sync of %s failed; the monitor's pass retries it", exp.key, exc_info=True)


def _optional_version(if_match: str | None) -> int | None:
    return parse_if_match(if_match) if if_match is not None else None


@router.post("", status_code=status.HTTP_201_CREATED, responses=responses(Conflict, Invalid))
def create_experiment(
    body: ExperimentCreate, session: SessionDep, state: StateDep, principal: Editor, response: Response,
    background: BackgroundTasks,
) -> ExperimentRead:
    exp = service.create_experiment(session, data=body, actor=principal.name, bucket_space=state.settings.bucket_space)
    response.headers["Location"] = f"/v1/experiments/{exp.key}"
    read = _versioned(response, exp)
    background.add_task(_sync_rollup, state, read)  # after the commit (SessionDep's scope ends first)
    return read


@router.get("")
def list_experiments(
    session: SessionDep,
    _: Viewer,
    status_filter: Annotated[Status | None, Query(alias="status")] = None,
    owner: Annotated[str | None, Query(max_length=200)] = None,
    q: Annotated[str | None, Query(max_length=200, description="Search in key and name.")] = None,
    archived: Annotated[
        Literal["exclude", "include", "only"], Query(description="Archived experiments: left out (default), listed too, or only them.")
    ] = "exclude",
    limit: Limit = 100,
    offset: Offset = 0,
) -> ExperimentPage:
    which = {"exclude": False, "include": None, "only": True}[archived]
    items, total = service.list_experiments(
        session, status=status_filter, owner=owner, search=q, archived=which, limit=limit, offset=offset
    )
    return ExperimentPage(items=[service.to_read(e) for e in items], total=total)


@router.get("/{key}", responses=responses(NotFound))
def get_experiment(key: str, session: SessionDep, _: Viewer, response: Response) -> ExperimentRead:
    exp = service.get_experiment(session, key)
    return _versioned(response, exp)


@router.patch("/{key}", responses=responses(NotFound, PreconditionFailed, PreconditionRequired, Conflict, Invalid))
def update_experiment(
    key: str,
    body: ExperimentUpdate,
    session: SessionDep,
    state: StateDep,
    principal: Editor,
    response: Response,
    background: BackgroundTasks,
    if_match: Annotated[str | None, Header()] = None,
) -> ExperimentRead:
    exp = service.update_experiment(
        session, key=key, data=body, expected_version=parse_if_match(if_match), actor=principal.name
    )
    read = _versioned(response, exp)
    background.add_task(_sync_rollup, state, read)  # after the commit (SessionDep's scope ends first)
    return read


def _keyed_action(action: str, call: Callable[..., Any], doc: str) -> Callable[..., ExperimentRead]:
    """``POST /v1/experiments/{key}/<action>``: one registry call on the experiment, If-Match optional."""

    def endpoint(
        key: str,
        session: SessionDep,
        principal: Editor,
        response: Response,
        if_match: Annotated[str | None, Header()] = None,
    ) -> ExperimentRead:
        exp = call(session, key=key, actor=principal.name, expected_version=_optional_version(if_match))
        return _versioned(response, exp)

    endpoint.__name__ = f"{action}_experiment"
    endpoint.__doc__ = doc
    return endpoint


for _action in service.TRANSITIONS:
    router.add_api_route(
        f"/{{key}}/{_action}",
        _keyed_action(_action, partial(service.transition, action=_action),
                      f"Lifecycle: {_action} the experiment (If-Match optional)."),
        methods=["POST"],
        responses=responses(NotFound, Conflict, PreconditionFailed),
    )


@router.post("/{key}/variants/{variant}/pause", responses=responses(NotFound, Conflict, PreconditionFailed))
def pause_variant(
    key: str,
    variant: str,
    session: SessionDep,
    principal: Editor,
    response: Response,
    reason: Annotated[str, Query(min_length=1, max_length=500, description="Why; kept in the audit log.")] = "paused by hand",
    if_match: Annotated[str | None, Header()] = None,
) -> ExperimentRead:
    """Stop serving one variant (its units get no assignment) without touching the others."""
    expected = _optional_version(if_match)
    exp = service.pause_variant(session, key=key, variant=variant, reason=reason, actor=principal.name, expected_version=expected)
    return _versioned(response, exp)


@router.post("/{key}/variants/{variant}/resume", responses=responses(NotFound, PreconditionFailed))
def resume_variant(
    key: str,
    variant: str,
    session: SessionDep,
    principal: Editor,
    response: Response,
    if_match: Annotated[str | None, Header()] = None,
) -> ExperimentRead:
    """Serve a paused variant again (a weight change never does this silently)."""
    expected = _optional_version(if_match)
    exp = service.resume_variant(session, key=key, variant=variant, actor=principal.name, expected_version=expected)
    return _versioned(response, exp)


router.add_api_route(
    "/{key}/archive",
    _keyed_action("archive", service.archive_experiment,
                  "Read-only from then on, out of the SDK config and of the default list (`?archived=include` "
                  "shows it); results stay readable. Audited."),
    methods=["POST"], responses=responses(NotFound, Conflict, PreconditionFailed),
    summary="Archive a stopped or never-started experiment",
)
router.add_api_route(
    "/{key}/unarchive", _keyed_action("unarchive", service.unarchive_experiment, "Bring an archived experiment back (audited)."),
    methods=["POST"], responses=responses(NotFound, Conflict, PreconditionFailed),
    summary="Bring an archived experiment back (audited)",
)


@router.delete("/{key}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(NotFound, Conflict, PreconditionFailed))
def delete_experiment(
    key: str, session: SessionDep, principal: Editor, if_match: Annotated[str | None, Header()] = None
) -> Response:
    """Delete an experiment that never ran (409 for one that did: archive it). Audited."""
    service.delete_experiment(session, key=key, actor=principal.name, expected_version=_optional_version(if_match))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{key}/audit", responses=responses(NotFound))
def experiment_audit(
    key: str, session: SessionDep, _: Viewer, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> list[AuditRead]:
    """Who changed what, newest first; a deleted experiment's history stays readable."""
    entries = service.audit_log(session, key=key, entity_type="experiment", limit=limit)
    if not entries:
        service.get_experiment(session, key)  # 404 for a key that never existed
    return entries
