"""Layers (mutually exclusive bucket ranges) and holdouts (traffic kept out of every experiment)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict
from ablab.platform.registry.audit import bump_revision, flush_new, record_audit
from ablab.platform.registry.models import Experiment, Holdout, Layer
from ablab.platform.registry.schemas import HoldoutCreate, HoldoutRead, LayerCreate, LayerRead, Status


def create_layer(session: Session, *, data: LayerCreate, actor: str) -> Layer:
    if session.scalar(select(Layer.id).where(Layer.key == data.key)) is not None:
        raise Conflict(f"layer '{data.key}' already exists", field="key")
    layer = Layer(key=data.key, name=data.name or data.key, salt=f"layer:{data.key}")
    session.add(layer)
    flush_new(session, f"layer '{data.key}' already exists", field="key")
    record_audit(session, actor=actor, action="create", entity_type="layer", entity_key=data.key, before=None, after=data.model_dump())
    bump_revision(session)
    return layer


def layer_read(session: Session, layer: Layer, bucket_space: int) -> LayerRead:
    rows = session.execute(
        select(Experiment.key, Experiment.layer_lo, Experiment.layer_hi)
        .where(Experiment.layer_id == layer.id, Experiment.status != Status.stopped.value, Experiment.archived_at.is_(None))
        .order_by(Experiment.layer_lo)
    ).all()
    used = sum(hi - lo for _, lo, hi in rows)
    return LayerRead(
        key=layer.key,
        name=layer.name,
        allocated=[{"experiment": k, "range": [lo, hi]} for k, lo, hi in rows],
        free_share=(bucket_space - used) / bucket_space,
    )


def list_layers(session: Session) -> list[Layer]:
    return list(session.scalars(select(Layer).order_by(Layer.key)))


def create_holdout(session: Session, *, data: HoldoutCreate, actor: str) -> Holdout:
    if session.scalar(select(Holdout.id).where(Holdout.key == data.key)) is not None:
        raise Conflict(f"holdout '{data.key}' already exists", field="key")
    holdout = Holdout(key=data.key, name=data.name or data.key, salt=f"holdout:{data.key}", fraction=data.fraction)
    session.add(holdout)
    flush_new(session, f"holdout '{data.key}' already exists", field="key")
    record_audit(session, actor=actor, action="create", entity_type="holdout", entity_key=data.key, before=None, after=data.model_dump())
    bump_revision(session)
    return holdout


def list_holdouts(session: Session) -> list[HoldoutRead]:
    return [HoldoutRead(key=h.key, name=h.name, fraction=h.fraction) for h in session.scalars(select(Holdout).order_by(Holdout.key))]
