"""Layers (mutually exclusive bucket ranges) and holdouts (traffic kept out of every experiment)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict, NotFound
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


def _in_use(kind: str, key: str, users: list[str]) -> Conflict:
    shown = ", ".join(users[:20]) + (f" and {len(users) - 20} more" if len(users) > 20 else "")
    return Conflict(f"{kind} '{key}' is used by experiment{'s' if len(users) > 1 else ''} {shown}; an experiment keeps "
                    f"its {kind} for good, stopped and archived ones included (their results and assignments are read "
                    f"through it), so the {kind} stays while they exist; an experiment that never ran can be deleted "
                    "first (DELETE /v1/experiments/{key})", field="key")


def _delete_unused(session: Session, row: Layer | Holdout, kind: str, users: Callable[[], list[str]]) -> None:
    """Delete ``row`` unless an experiment names it (409 naming them)."""
    if found := users():
        raise _in_use(kind, row.key, found)
    key = row.key
    try:
        with session.begin_nested():
            session.delete(row)
            session.flush()
    except IntegrityError as exc:
        # A concurrent writer put an experiment in it after our read: the foreign key
        # refuses the delete, and it is the same 409, not a 500.
        raise _in_use(kind, key, users() or ["(one created meanwhile)"]) from exc


def delete_layer(session: Session, *, key: str, actor: str) -> None:
    """Delete a layer no experiment is in; the key may be created again afterwards.

    Every experiment counts, whatever its status: a stopped or archived one still names its
    layer and bucket range (its row points at the layer's), and its results are read as
    assigned through that layer.
    """
    layer = session.scalar(select(Layer).where(Layer.key == key))
    if layer is None:
        raise NotFound(f"layer '{key}' does not exist; GET /v1/layers lists them", field="key")
    before = {"key": layer.key, "name": layer.name}
    layer_id = layer.id
    _delete_unused(session, layer, "layer", lambda: list(session.scalars(
        select(Experiment.key).where(Experiment.layer_id == layer_id).order_by(Experiment.key))))
    record_audit(session, actor=actor, action="delete", entity_type="layer", entity_key=key, before=before, after=None)
    bump_revision(session)


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


def delete_holdout(session: Session, *, key: str, actor: str) -> None:
    """Delete a holdout no experiment names (a holdout keeps traffic out of the experiments
    that name it, and only those); the same rule and reasons as :func:`delete_layer`."""
    holdout = session.scalar(select(Holdout).where(Holdout.key == key))
    if holdout is None:
        raise NotFound(f"holdout '{key}' does not exist; GET /v1/holdouts lists them", field="key")
    before = {"key": holdout.key, "name": holdout.name, "fraction": holdout.fraction}
    holdout_id = holdout.id
    _delete_unused(session, holdout, "holdout", lambda: list(session.scalars(
        select(Experiment.key).where(Experiment.holdout_id == holdout_id).order_by(Experiment.key))))
    record_audit(session, actor=actor, action="delete", entity_type="holdout", entity_key=key, before=before, after=None)
    bump_revision(session)
