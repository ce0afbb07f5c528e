"""FastAPI dependencies: the transaction-owning session and the authenticated principal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Header, Query, Request
from sqlalchemy.orm import Session

from ablab.platform.api.state import AppState, Principal
from ablab.platform.auth import allows
from ablab.platform.errors import Forbidden, Invalid, PreconditionRequired, Unauthorized
from ablab.platform.registry import service as registry
from ablab.platform.registry.db import transaction
from ablab.platform.registry.schemas import ExperimentRead, Scope

# Integer columns are 64-bit at most; a larger offset or id used to reach the database and
# fail there (500). Bounded here, it is a 422 naming the parameter.
MAX_OFFSET = 1_000_000_000
MAX_ID = 2**62

Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Rows to skip.")]
Limit = Annotated[int, Query(ge=1, le=500)]


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.ablab
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    """The dependency owns the transaction: commit on success, roll back on error."""
    with transaction(state.sessions) as session:
        yield session


# scope="function": commit before the response leaves, so a client that reads its own
# write right after a 201 always sees it.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def current_experiment(key: str, session: SessionDep) -> ExperimentRead:
    """The experiment named by the route's ``{key}`` (404 naming the key when there is none)."""
    return registry.to_read(registry.get_experiment(session, key))


CurrentExperiment = Annotated[ExperimentRead, Depends(current_experiment)]


def _principal(state: AppState, authorization: str | None) -> Principal:
    if not authorization:
        raise Unauthorized("missing bearer token: send 'Authorization: Bearer <token>' (ablab keys create)", field="Authorization")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("the Authorization header must be 'Bearer <token>'", field="Authorization")
    principal = state.tokens.resolve(token.strip())
    if principal is None:
        raise Unauthorized("unknown or revoked token", field="Authorization")
    return principal


def require(scope: Scope) -> Callable[..., Principal]:
    def dependency(state: StateDep, authorization: Annotated[str | None, Header()] = None) -> Principal:
        principal = _principal(state, authorization)
        if not allows(principal.scope, scope):
            raise Forbidden(f"this route needs the '{scope.value}' scope; the token has '{principal.scope.value}'", field="Authorization")
        return principal

    return dependency


def require_any(state: StateDep, authorization: Annotated[str | None, Header()] = None) -> Principal:
    """Any valid token, whatever its scope."""
    return _principal(state, authorization)


Viewer = Annotated[Principal, Depends(require(Scope.viewer))]
Editor = Annotated[Principal, Depends(require(Scope.editor))]
Admin = Annotated[Principal, Depends(require(Scope.admin))]
Sdk = Annotated[Principal, Depends(require(Scope.sdk))]


def parse_if_match(if_match: str | None) -> int:
    if if_match is None:
        raise PreconditionRequired("send If-Match with the version you read (the ETag of GET)", field="If-Match")
    value = if_match.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    if not value.isdigit():
        raise Invalid(f"If-Match must be an experiment version such as \"3\", not {if_match!r}", field="If-Match")
    return int(value)
