"""``/v1/factors``: declare, change and delete strategy factors; list every factor with its JSON Schema."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from ablab.platform.api.deps import Editor, SessionDep, Viewer
from ablab.platform.api.problems import responses
from ablab.platform.errors import Conflict, Invalid, NotFound
from ablab.platform.registry.factors import service
from ablab.platform.registry.factors.schemas import FactorCreate, FactorPage, FactorRead, FactorUpdate

router = APIRouter(prefix="/v1/factors", tags=["factors"])


@router.post("", status_code=status.HTTP_201_CREATED, responses=responses(Conflict, Invalid))
def declare_factor(body: FactorCreate, session: SessionDep, principal: Editor, response: Response) -> FactorRead:
    """Declare a factor (201); the same declaration again is a no-op (200)."""
    factor, created = service.declare_factor(session, data=body, actor=principal.name)
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/v1/factors/{factor.name}"
    return factor


@router.get("")
def list_factors(session: SessionDep, _: Viewer) -> FactorPage:
    """Built-in, gateway and declared factors, each with its JSON Schema."""
    items = service.list_factors(session)
    return FactorPage(items=items, total=len(items))


@router.get("/{name}", responses=responses(NotFound))
def get_factor(name: str, session: SessionDep, _: Viewer) -> FactorRead:
    return service.get_factor(session, name)


@router.put("/{name}", responses=responses(NotFound, Conflict, Invalid))
def update_factor(name: str, body: FactorUpdate, session: SessionDep, principal: Editor) -> FactorRead:
    """Replace a declaration; refused while a live experiment sets a level it would refuse."""
    return service.update_factor(session, name=name, data=body, actor=principal.name)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(NotFound, Conflict))
def delete_factor(name: str, session: SessionDep, principal: Editor) -> Response:
    """Delete a declared factor that no experiment sets (409 naming them otherwise; 409 for
    a built-in or gateway factor). Audited."""
    service.delete_factor(session, name=name, actor=principal.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
