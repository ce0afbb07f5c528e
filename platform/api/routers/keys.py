"""API keys (admin only). Tokens are shown once; only their hashes are stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, status

from pydantic import BaseModel

from ablab.platform.api.deps import Admin, Principal, SessionDep, require_any
from ablab.platform.auth import create_api_key
from ablab.platform.registry.schemas import ApiKeyCreate, ApiKeyCreated, Scope
from ablab.platform.registry.service import record_audit

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED)
def create_key(body: ApiKeyCreate, session: SessionDep, principal: Admin) -> ApiKeyCreated:
    key, token = create_api_key(session, name=body.name, scope=body.scope)
    # Audit the grant, never the token.
    record_audit(session, actor=principal.name, action="create", entity_type="api_key", entity_key=key.prefix, before=None, after={"name": key.name, "scope": key.scope})
    return ApiKeyCreated(name=key.name, scope=body.scope, prefix=key.prefix, token=token)


class WhoAmI(BaseModel):
    name: str
    scope: Scope


whoami_router = APIRouter(prefix="/v1", tags=["keys"])


@whoami_router.get("/whoami")
def whoami(principal: Annotated[Principal, Depends(require_any)]) -> WhoAmI:
    """The calling token's holder and scope (the dashboard uses it to show or hide edits)."""
    return WhoAmI(name=principal.name, scope=principal.scope)
