"""Experiments: create, update, lifecycle, pause and archive. Services flush; the caller's
transaction commits (see ``db.transaction``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from ablab.platform.errors import Conflict, Invalid, NotFound, PreconditionFailed
from ablab.platform.registry.audit import bump_revision, flush_new, record_audit
from ablab.platform.registry.factors.service import check_strategies
from ablab.platform.registry.models import Experiment, Holdout, Layer, Variant, aware, utcnow
from ablab.platform.registry.schemas import (
    ExperimentCreate,
    ExperimentRead,
    ExperimentUpdate,
    Status,
    VariantIn,
    VariantOut,
    shadow_out,
)

# Lifecycle: action → (allowed source states, target state).
TRANSITIONS: dict[str, tuple[frozenset[Status], Status]] = {
    "start": (frozenset({Status.draft, Status.paused}), Status.running),
    "pause": (frozenset({Status.running}), Status.paused),
    "stop": (frozenset({Status.draft, Status.running, Status.paused}), Status.stopped),
}


def _snapshot(exp: Experiment) -> dict[str, Any]:
    return to_read(exp).model_dump(mode="json")


def to_read(exp: Experiment) -> ExperimentRead:
    return ExperimentRead(
        key=exp.key,
        name=exp.name,
        hypothesis=exp.hypothesis,
        owner=exp.owner,
        unit=exp.unit,
        status=exp.status,
        traffic=exp.traffic,
        control=exp.control,
        phase=exp.phase,
        layer=exp.layer.key if exp.layer else None,
        layer_range=(exp.layer_lo, exp.layer_hi) if exp.layer_id is not None else None,
        holdout=exp.holdout.key if exp.holdout else None,
        variants=[
            VariantOut(
                key=v.key,
                weight=v.weight,
                strategy=v.strategy,
                strategy_hash=v.strategy_hash,
                paused=v.paused,
                paused_reason=v.paused_reason,
                shadow=shadow_out(v.shadow),
            )
            for v in exp.variants
        ],
        metrics=exp.metrics,
        guardrails=exp.guardrails,
        targeting=exp.targeting,
        forced=exp.forced,
        shadow=shadow_out(exp.shadow),
        version=exp.version,
        created_at=aware(exp.created_at),
        updated_at=aware(exp.updated_at),
        started_at=aware(exp.started_at),
        stopped_at=aware(exp.stopped_at),
        archived_at=aware(exp.archived_at),
    )


def _variants(items: list[VariantIn]) -> list[Variant]:
    return [
        Variant(
            key=v.key,
            position=i,
            weight=v.weight,
            strategy=v.strategy.model_dump(mode="json"),
            strategy_hash=v.strategy.content_hash,
            shadow=v.shadow.stored() if v.shadow is not None else None,
        )
        for i, v in enumerate(items)
    ]


def _allocate(session: Session, layer: Layer, share: float | None, bucket_space: int) -> tuple[int, int]:
    """First-fit contiguous range of the layer's buckets not held by a live experiment."""
    held = sorted(
        session.execute(
            select(Experiment.layer_lo, Experiment.layer_hi).where(
                Experiment.layer_id == layer.id, Experiment.status != Status.stopped.value, Experiment.archived_at.is_(None)
            )
        ).all()
    )
    gaps, cursor = [], 0
    for lo, hi in held:
        if lo > cursor:
            gaps.append((cursor, lo))
        cursor = max(cursor, hi)
    if cursor < bucket_space:
        gaps.append((cursor, bucket_space))
    if not gaps:
        raise Conflict(f"layer '{layer.key}' has no free buckets; stop an experiment in it first", field="layer")
    if share is None:
        lo, hi = max(gaps, key=lambda g: g[1] - g[0])
        return lo, hi
    need = max(1, round(share * bucket_space))
    for lo, hi in gaps:
        if hi - lo >= need:
            return lo, lo + need
    free = sum(hi - lo for lo, hi in gaps) / bucket_space
    raise Conflict(
        f"layer '{layer.key}' has no free range of {share:.2%}; largest free share is "
        f"{max(hi - lo for lo, hi in gaps) / bucket_space:.2%} ({free:.2%} in all)",
        field="layer_share",
    )



def get_experiment(session: Session, key: str) -> Experiment:
    exp = session.scalar(select(Experiment).where(Experiment.key == key))
    if exp is None:
        raise NotFound(f"experiment '{key}' does not exist", field="key")
    return exp


def list_experiments(
    session: Session,
    *,
    status: Status | None = None,
    owner: str | None = None,
    search: str | None = None,
    archived: bool | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Experiment], int]:
    """``archived``: None lists every experiment, False only live ones, True only archived ones."""
    query = select(Experiment)
    if archived is not None:
        query = query.where(Experiment.archived_at.is_not(None) if archived else Experiment.archived_at.is_(None))
    if status is not None:
        query = query.where(Experiment.status == status.value)
    if owner:
        query = query.where(Experiment.owner == owner)
    if search:
        pattern = f"%{search.lower()}%"
        query = query.where(or_(func.lower(Experiment.key).like(pattern), func.lower(Experiment.name).like(pattern)))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    items = session.scalars(query.order_by(Experiment.created_at.desc(), Experiment.id.desc()).limit(limit).offset(offset))
    return list(items), total


def _custom_metrics(exp: Experiment, data: ExperimentUpdate) -> dict[str, Any]:
    """The custom metrics an update leaves the experiment with (a policy's objective may name one)."""
    if data.metrics is not None:
        return {m.name: m for m in data.metrics.custom}
    from ablab.platform.stats.spec import validate_custom  # the spec's own reading of stored metrics

    return {m.name: m for m in validate_custom((exp.metrics or {}).get("custom") or [])}


def create_experiment(session: Session, *, data: ExperimentCreate, actor: str, bucket_space: int) -> Experiment:
    if session.scalar(select(Experiment.id).where(Experiment.key == data.key)) is not None:
        raise Conflict(f"experiment '{data.key}' already exists", field="key")
    check_strategies(session, data.variants, shadow=data.shadow, custom={m.name: m for m in data.metrics.custom})
    layer = holdout = None
    lo = hi = None
    if data.layer is not None:
        layer = session.scalar(select(Layer).where(Layer.key == data.layer))
        if layer is None:
            raise Invalid(f"layer '{data.layer}' does not exist; create it with POST /v1/layers", field="layer")
        lo, hi = _allocate(session, layer, data.layer_share, bucket_space)
    if data.holdout is not None:
        holdout = session.scalar(select(Holdout).where(Holdout.key == data.holdout))
        if holdout is None:
            raise Invalid(f"holdout '{data.holdout}' does not exist; create it with POST /v1/holdouts", field="holdout")
    exp = Experiment(
        key=data.key,
        name=data.name,
        hypothesis=data.hypothesis,
        owner=data.owner or actor,
        unit=data.unit.value,
        status=Status.draft.value,
        traffic=data.traffic,
        control=data.control,
        salt=data.key,
        phase=1,
        layer=layer,
        layer_lo=lo,
        layer_hi=hi,
        holdout=holdout,
        targeting=[r.model_dump(mode="json") for r in data.targeting],
        forced=dict(data.forced),
        metrics=data.metrics.model_dump(mode="json"),
        guardrails=[g.model_dump(mode="json") for g in data.guardrails],
        shadow=data.shadow.stored() if data.shadow is not None else None,
        variants=_variants(data.variants),
    )
    session.add(exp)
    flush_new(session, f"experiment '{data.key}' already exists", field="key")
    record_audit(session, actor=actor, action="create", entity_type="experiment", entity_key=exp.key, before=None, after=_snapshot(exp))
    bump_revision(session)
    return exp


def _check_version(exp: Experiment, expected_version: int) -> None:
    if exp.version != expected_version:
        raise PreconditionFailed(
            f"experiment '{exp.key}' is at version {exp.version}, not {expected_version}: "
            "someone changed it first; GET it again and reapply your change",
            field="If-Match",
        )


def update_experiment(
    session: Session, *, key: str, data: ExperimentUpdate, expected_version: int, actor: str
) -> Experiment:
    exp = get_experiment(session, key)
    _check_version(exp, expected_version)
    _refuse_if_archived(exp, "change")
    if exp.status == Status.stopped.value:
        raise Conflict(f"experiment '{key}' is stopped; stopped experiments are read-only "
                       "(create a new experiment to test again)", field="status")
    before = _snapshot(exp)
    fields = data.model_fields_set - {"new_phase"}
    if not fields:
        raise Invalid("the update changes nothing; send at least one field", field="body")

    control = data.control if data.control is not None else exp.control
    check_strategies(session, data.variants, shadow=data.shadow, custom=_custom_metrics(exp, data))
    if data.variants is not None:
        current = [(v.key, v.weight, v.strategy_hash) for v in exp.variants]
        proposed = [(v.key, v.weight, v.strategy.content_hash) for v in data.variants]
        if current == proposed:
            # The same variants: a shadow may change without a new phase (it moves no unit).
            for row, given in zip(exp.variants, data.variants):
                shadow = given.shadow.stored() if given.shadow is not None else None
                if row.shadow != shadow:
                    row.shadow = shadow
                    exp.updated_at = utcnow()  # a variant row changed: the experiment's version moves too
        else:
            if not data.new_phase:
                raise Conflict(
                    "changing variants or weights reshuffles units between variants; "
                    "send new_phase: true to start a new phase on purpose",
                    field="variants",
                )
            # A paused variant (often paused by a guardrail) stays paused through a new
            # phase; only an explicit resume puts it back into traffic.
            paused = {v.key: v.paused_reason for v in exp.variants if v.paused}
            # Delete the old rows before inserting the new ones: (experiment, key) is unique.
            exp.variants.clear()
            session.flush()
            exp.variants.extend(_variants(data.variants))
            for v in exp.variants:
                if v.key in paused:
                    v.paused, v.paused_reason = True, paused[v.key]
            exp.phase += 1
    if control not in {v.key for v in exp.variants}:
        raise Invalid(f"control '{control}' is not one of the variants", field="control")
    if data.control is not None and data.control != exp.control and exp.status != Status.draft.value:
        raise Conflict("the control of a started experiment cannot change", field="control")
    exp.control = control
    if data.forced is not None:
        keys = {v.key for v in exp.variants}
        for unit, variant in data.forced.items():
            if variant not in keys:
                raise Invalid(f"forced unit '{unit}' names unknown variant '{variant}'", field="forced")
        exp.forced = dict(data.forced)
    for name in ("name", "hypothesis", "owner", "traffic"):
        if name in fields and getattr(data, name) is not None:
            setattr(exp, name, getattr(data, name))
    if data.targeting is not None:
        exp.targeting = [r.model_dump(mode="json") for r in data.targeting]
    if data.metrics is not None:
        exp.metrics = data.metrics.model_dump(mode="json")
    if data.guardrails is not None:
        exp.guardrails = [g.model_dump(mode="json") for g in data.guardrails]
    if "shadow" in fields:  # null removes it
        exp.shadow = data.shadow.stored() if data.shadow is not None else None
    _flush_versioned(session, exp)
    action = "update+new_phase" if data.new_phase and exp.phase != before["phase"] else "update"
    record_audit(session, actor=actor, action=action, entity_type="experiment", entity_key=key, before=before, after=_snapshot(exp))
    bump_revision(session)
    return exp


def _flush_versioned(session: Session, exp: Experiment) -> None:
    key = exp.key  # read before the flush: after a failed flush the instance is unusable
    try:
        session.flush()
    except StaleDataError as exc:  # another writer committed between our read and write
        raise PreconditionFailed(
            f"experiment '{key}' was changed concurrently; GET it again and reapply your change",
            field="If-Match",
        ) from exc


def transition(
    session: Session, *, key: str, action: str, actor: str, expected_version: int | None = None, reason: str = ""
) -> Experiment:
    exp = get_experiment(session, key)
    if expected_version is not None:
        _check_version(exp, expected_version)
    _refuse_if_archived(exp, action)
    sources, target = TRANSITIONS[action]
    if Status(exp.status) not in sources:
        if exp.status == Status.stopped.value:
            raise Conflict(f"cannot {action} experiment '{key}': it is stopped, which is final; create a new "
                           "experiment to test again, or archive this one", field="status")
        allowed = ", ".join(sorted(a for a, (src, _) in TRANSITIONS.items() if Status(exp.status) in src)) or "none"
        raise Conflict(f"cannot {action} experiment '{key}' while it is {exp.status} (allowed: {allowed})", field="status")
    before = _snapshot(exp)
    exp.status = target.value
    now = utcnow()
    if target is Status.running and exp.started_at is None:
        exp.started_at = now
    if target is Status.stopped:
        exp.stopped_at = now
    _flush_versioned(session, exp)
    after = _snapshot(exp)
    if reason:
        after["reason"] = reason
    record_audit(session, actor=actor, action=action, entity_type="experiment", entity_key=key, before=before, after=after)
    bump_revision(session)
    return exp


def pause_variant(
    session: Session, *, key: str, variant: str, reason: str, actor: str, expected_version: int | None = None
) -> Experiment:
    """Stop serving one variant (its units get no assignment); used by guardrail automation."""
    exp, target = _variant_to_change(session, key, variant, expected_version, "pause")
    if variant == exp.control:
        raise Conflict("the control variant cannot be paused; pause the experiment instead", field="variant")
    if target.paused:
        return exp
    before = _snapshot(exp)
    target.paused = True
    target.paused_reason = reason
    exp.updated_at = utcnow()  # bumps the experiment's version too
    _flush_versioned(session, exp)
    record_audit(session, actor=actor, action="pause_variant", entity_type="experiment", entity_key=key, before=before, after=_snapshot(exp))
    bump_revision(session)
    return exp


def resume_variant(session: Session, *, key: str, variant: str, actor: str, expected_version: int | None = None) -> Experiment:
    """Put a paused variant back into traffic; the audit log keeps why it had been paused."""
    exp, target = _variant_to_change(session, key, variant, expected_version, "resume")
    if not target.paused:
        return exp
    before = _snapshot(exp)
    target.paused = False
    target.paused_reason = None
    exp.updated_at = utcnow()
    _flush_versioned(session, exp)
    record_audit(session, actor=actor, action="resume_variant", entity_type="experiment", entity_key=key, before=before, after=_snapshot(exp))
    bump_revision(session)
    return exp


def _refuse_if_archived(exp: Experiment, what: str) -> None:
    if exp.archived_at is not None:
        raise Conflict(f"cannot {what} experiment '{exp.key}': it is archived, so read-only; "
                       f"unarchive it first (POST /v1/experiments/{exp.key}/unarchive)", field="archived")


def _variant_to_change(
    session: Session, key: str, variant: str, expected_version: int | None, verb: str
) -> tuple[Experiment, Variant]:
    """The experiment and its variant ``variant``, checked for a pause or resume: the version
    the caller saw, not finished, the variant exists."""
    exp = get_experiment(session, key)
    if expected_version is not None:
        _check_version(exp, expected_version)
    _refuse_if_finished(exp, f"{verb} a variant of")
    target = next((v for v in exp.variants if v.key == variant), None)
    if target is None:
        raise NotFound(f"experiment '{key}' has no variant '{variant}'", field="variant")
    return exp, target


def _refuse_if_finished(exp: Experiment, what: str) -> None:
    _refuse_if_archived(exp, what)
    if exp.status == Status.stopped.value:
        raise Conflict(f"cannot {what} experiment '{exp.key}': it is stopped, which is final, and its variants "
                       "stay as they were; create a new experiment to test again", field="status")


def archive_experiment(session: Session, *, key: str, actor: str, expected_version: int | None = None) -> Experiment:
    """Retire a stopped (or never started) experiment: read-only, out of the SDK config and
    of the default list, its results kept. Archiving an archived experiment changes nothing."""
    exp = get_experiment(session, key)
    if expected_version is not None:
        _check_version(exp, expected_version)
    if exp.archived_at is not None:
        return exp
    if exp.status in (Status.running.value, Status.paused.value):
        raise Conflict(f"experiment '{key}' is {exp.status}; stop it first (POST /v1/experiments/{key}/stop), "
                       "then archive it", field="status")
    before = _snapshot(exp)
    exp.archived_at = utcnow()
    _flush_versioned(session, exp)
    record_audit(session, actor=actor, action="archive", entity_type="experiment", entity_key=key, before=before, after=_snapshot(exp))
    bump_revision(session)
    return exp


def unarchive_experiment(session: Session, *, key: str, actor: str, expected_version: int | None = None) -> Experiment:
    exp = get_experiment(session, key)
    if expected_version is not None:
        _check_version(exp, expected_version)
    if exp.archived_at is None:
        return exp
    if exp.layer_id is not None and exp.status != Status.stopped.value:
        _check_range_free(session, exp)
    before = _snapshot(exp)
    exp.archived_at = None
    _flush_versioned(session, exp)
    record_audit(session, actor=actor, action="unarchive", entity_type="experiment", entity_key=key, before=before, after=_snapshot(exp))
    bump_revision(session)
    return exp


def _check_range_free(session: Session, exp: Experiment) -> None:
    """An archived draft gave its layer range back; it may return only if no one took it."""
    overlapping = session.scalar(
        select(Experiment.key).where(
            Experiment.layer_id == exp.layer_id, Experiment.id != exp.id, Experiment.status != Status.stopped.value,
            Experiment.archived_at.is_(None), Experiment.layer_lo < exp.layer_hi, Experiment.layer_hi > exp.layer_lo,
        )
    )
    if overlapping is not None:
        raise Conflict(f"experiment '{overlapping}' now holds part of this draft's layer range; "
                       "create a new experiment instead", field="layer")


def delete_experiment(session: Session, *, key: str, actor: str, expected_version: int | None = None) -> None:
    """Delete an experiment that never ran (no results to keep); one that ran is archived instead."""
    exp = get_experiment(session, key)
    if expected_version is not None:
        _check_version(exp, expected_version)
    if exp.started_at is not None:
        raise Conflict(f"experiment '{key}' ran (started {exp.started_at:%Y-%m-%d %H:%M} UTC), so its results are kept; "
                       f"stop and archive it instead (POST /v1/experiments/{key}/archive)", field="status")
    before = _snapshot(exp)
    session.delete(exp)
    _flush_versioned(session, exp)
    record_audit(session, actor=actor, action="delete", entity_type="experiment", entity_key=key, before=before, after=None)
    bump_revision(session)
