"""Layers (mutually exclusive namespaces) and holdouts."""

from __future__ import annotations

from fastapi import APIRouter, status

from ablab.platform.api.deps import Editor, SessionDep, StateDep, Viewer
from ablab.platform.api.problems import responses
from ablab.platform.errors import Conflict
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


@router.post("/holdouts", status_code=status.HTTP_201_CREATED, responses=responses(Conflict))
def create_holdout(body: HoldoutCreate, session: SessionDep, principal: Editor) -> HoldoutRead:
    h = service.create_holdout(session, data=body, actor=principal.name)
    return HoldoutRead(key=h.key, name=h.name, fraction=h.fraction)


@router.get("/holdouts")
def list_holdouts(session: SessionDep, _: Viewer) -> list[HoldoutRead]:
    return service.list_holdouts(session)
