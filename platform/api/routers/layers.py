"""Layers (mutually exclusive namespaces) and holdouts: create, list, and delete those no experiment uses."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from ablab.platform.api.deps import Editor, SessionDep, StateDep, Viewer
from ablab.platform.api.problems import responses
from ablab.platform.errors import Conflict, NotFound
from ablab.platform.registry import service
from ablab.platform.registry.schemas import HoldoutCreate, HoldoutRead, LayerCreate, LayerRead

router = APIRouter(prefix="/v1", tags=["layers"])


@router.post("/layers", status_code=status.HTTP_201_CREATED, responses=responses(Conflict))
def create_layer(body: LayerCreate, session: SessionDep, state: StateDep, principal: Editor) -> LayerRead:
    layer = service.create_layer(session, data=body, actor=principal.name)
    return service.layer_read(session, layer, state.settings.bucket_space)


@router.get("/layers")
def list_layers(session: SessionDep, state: StateDep, _: Viewer) -> list[LayerRead]:
    return [service.layer_read(session, layer, state.settings.bucket_space) for layer in service.list_layers(session)]


@router.delete("/layers/{key}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(NotFound, Conflict))
def delete_layer(key: str, session: SessionDep, principal: Editor) -> Response:
    """Delete a layer no experiment is in (409 naming the experiments otherwise, whatever their status). Audited."""
    service.delete_layer(session, key=key, actor=principal.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/holdouts", status_code=status.HTTP_201_CREATED, responses=responses(Conflict))
def create_holdout(body: HoldoutCreate, session: SessionDep, principal: Editor) -> HoldoutRead:
    h = service.create_holdout(session, data=body, actor=principal.name)
    return HoldoutRead(key=h.key, name=h.name, fraction=h.fraction)


@router.get("/holdouts")
def list_holdouts(session: SessionDep, _: Viewer) -> list[HoldoutRead]:
    return service.list_holdouts(session)


@router.delete("/holdouts/{key}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(NotFound, Conflict))
def delete_holdout(key: str, session: SessionDep, principal: Editor) -> Response:
    """Delete a holdout no experiment names (409 naming the experiments otherwise). Audited."""
    service.delete_holdout(session, key=key, actor=principal.name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
