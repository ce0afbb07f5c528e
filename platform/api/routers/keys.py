"""API keys (admin only). Tokens are shown once; only their hashes are stored.

Creating and revoking are audited (``entity_type: api_key``, keyed by the key's prefix);
a revocation takes effect on every API process at the next request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, status
from pydantic import BaseModel

from ablab.platform.api.deps import MAX_ID, Admin, Limit, Offset, SessionDep, require_any
from ablab.platform.api.problems import responses
from ablab.platform.api.state import Principal
from ablab.platform.auth import create_api_key, key_read, list_api_keys, revoke_api_key_by_id
from ablab.platform.errors import Conflict, Invalid, NotFound
from ablab.platform.registry import service
from ablab.platform.registry.schemas import ApiKeyCreate, ApiKeyCreated, ApiKeyPage, ApiKeyRead, AuditRead, Scope
from ablab.platform.registry.service import record_audit

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED, responses=responses(Conflict, Invalid))
def create_key(body: ApiKeyCreate, session: SessionDep, principal: Admin) -> ApiKeyCreated:
    """A new token, shown once in the response; 409 when an active key has this name."""
    key, token = create_api_key(session, name=body.name, scope=body.scope, expires_at=body.expires_at)
    # Audit the grant, never the token.
    record_audit(session, actor=principal.name, action="create", entity_type="api_key", entity_key=key.prefix,
                 before=None, after=key_read(key).model_dump(mode="json"))
    return ApiKeyCreated(id=key.id, name=key.name, scope=body.scope, prefix=key.prefix, token=token, expires_at=body.expires_at)


@router.get("")
def list_keys(
    session: SessionDep,
    _: Admin,
    include_revoked: Annotated[bool, Query(description="Also list revoked keys.")] = False,
    limit: Limit = 100,
    offset: Offset = 0,
) -> ApiKeyPage:
    """Every key's id, name, prefix, scope and status; never a token or its hash."""
    items, total = list_api_keys(session, include_revoked=include_revoked, limit=limit, offset=offset)
    return ApiKeyPage(items=[key_read(k) for k in items], total=total)


@router.delete("/{key_id}", responses=responses(NotFound))
def revoke_key(
    key_id: Annotated[int, Path(ge=1, le=MAX_ID, description="The key's id, as GET /v1/keys lists it.")],
    session: SessionDep,
    principal: Admin,
) -> ApiKeyRead:
    """Revoke the key: its token fails from the next request on, on every API process."""
    return key_read(revoke_api_key_by_id(session, key_id=key_id, actor=principal.name))


class WhoAmI(BaseModel):
    name: str
    scope: Scope


# Identity and accountability: who the caller is, and who did what.
whoami_router = APIRouter(prefix="/v1", tags=["keys"])


@whoami_router.get("/audit")
def audit(
    session: SessionDep,
    _: Admin,
    entity_type: Annotated[str | None, Query(max_length=32, description="api_key, experiment, layer, holdout, ...")] = None,
    key: Annotated[str | None, Query(max_length=64, description="An experiment, layer or holdout key, or a key's prefix.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[AuditRead]:
    """The audit log, newest first: key grants and revocations, every registry change."""
    return service.audit_log(session, key=key, entity_type=entity_type, limit=limit)


@whoami_router.get("/whoami")
def whoami(principal: Annotated[Principal, Depends(require_any)]) -> WhoAmI:
    """The calling token's holder and scope (the dashboard uses it to show or hide edits)."""
    return WhoAmI(name=principal.name, scope=principal.scope)
