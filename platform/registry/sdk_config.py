"""What assignment needs from the registry: the SDK config payload (its compiled form is
:func:`ablab.platform.assignment.payload.config_from_payload`), and the policy models it
carries (docs/policies.md, "Model refresh"): stored in the config DB's ``policy_models`` by
the API's refresher, so a restarted API serves the models it had, and read here only when the
registry revision moves (the API caches the payload and its ETag by revision)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Select, delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ablab.platform.assignment.payload import config_from_payload  # noqa: F401 - the payload's reader, beside its writer
from ablab.platform.registry.audit import registry_revision
from ablab.platform.registry.layers import list_layers
from ablab.platform.registry.models import Experiment, Holdout, PolicyModelRow, aware
from ablab.platform.registry.schemas import Status

KEEP_VERSIONS = 8
"""Versions kept per variant: the served one and the seven before it, so a propensity logged
under a recent older version can be recomputed (``GET /v1/experiments/{key}/policy-models``)
while the table stays bounded whatever the refit interval."""


def _rows(experiment_id: int, variant: str) -> Select[tuple[PolicyModelRow]]:
    return select(PolicyModelRow).where(PolicyModelRow.experiment_id == experiment_id, PolicyModelRow.variant == variant)


def publish_model(session: Session, experiment_id: int, variant: str, version: str, model: dict[str, Any]) -> bool:
    """Make ``version`` the variant's served model, in the caller's transaction (the refresher
    bumps the registry revision in the same one); whether it is new. A version published
    before (the logs went back to an earlier state) becomes the newest again. Another API
    process publishing the same version at once is not an error: it is then not new here."""
    latest = session.scalars(_rows(experiment_id, variant).order_by(PolicyModelRow.id.desc()).limit(1)).first()
    if latest is not None and latest.version == version:
        return False
    try:
        with session.begin_nested():
            session.execute(delete(PolicyModelRow).where(PolicyModelRow.experiment_id == experiment_id,
                                                         PolicyModelRow.variant == variant,
                                                         PolicyModelRow.version == version))
            session.add(PolicyModelRow(experiment_id=experiment_id, variant=variant, version=version, model=model))
            session.flush()
    except IntegrityError:
        return False
    stale = session.scalars(select(PolicyModelRow.id).where(PolicyModelRow.experiment_id == experiment_id,
                                                            PolicyModelRow.variant == variant)
                            .order_by(PolicyModelRow.id.desc()).offset(KEEP_VERSIONS)).all()
    if stale:
        session.execute(delete(PolicyModelRow).where(PolicyModelRow.id.in_(stale)))
    return True


class PolicyModelVersion(BaseModel):
    """One kept model of a policy variant; ``model`` (``PolicyModel.to_json()``) only when asked
    for by version."""

    model_config = ConfigDict(extra="forbid")
    variant: str
    version: str
    created_at: datetime
    served: bool = Field(description="the variant's newest model: the one the SDK config carries")
    model: dict[str, Any] | None = None


class PolicyModels(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiment: str
    items: list[PolicyModelVersion] = Field(description="newest first within each variant, variants by name")


def policy_models(session: Session, experiment: Experiment, *, variant: str | None = None,
                  version: str | None = None) -> PolicyModels:
    """The experiment's kept models (``version``: that one, with its model; none: every one)."""
    query = select(PolicyModelRow).where(PolicyModelRow.experiment_id == experiment.id)
    if variant is not None:
        query = query.where(PolicyModelRow.variant == variant)
    rows = session.scalars(query.order_by(PolicyModelRow.variant, PolicyModelRow.id.desc())).all()
    newest = {r.variant: r.id for r in reversed(rows)}  # the first of each variant (newest first)
    return PolicyModels(experiment=experiment.key, items=[
        PolicyModelVersion(variant=r.variant, version=r.version, created_at=aware(r.created_at) or r.created_at,
                           served=newest[r.variant] == r.id, model=r.model if version is not None else None)
        for r in rows if version is None or r.version == version
    ])


def _policy_models(session: Session, experiments: Sequence[Experiment]) -> list[dict[str, Any]]:
    """Each policy variant's newest model (one query, and none without a policy variant)."""
    wanted = {(e.id, v.key): (e.key, v.key) for e in experiments for v in e.variants
              if isinstance((v.strategy or {}).get("policy"), dict)}
    if not wanted:
        return []
    newest = (select(func.max(PolicyModelRow.id))
              .where(PolicyModelRow.experiment_id.in_({exp_id for exp_id, _ in wanted}))
              .group_by(PolicyModelRow.experiment_id, PolicyModelRow.variant))
    out = []
    for row in session.scalars(select(PolicyModelRow).where(PolicyModelRow.id.in_(newest))):
        if (named := wanted.get((row.experiment_id, row.variant))) is not None:
            out.append({"experiment": named[0], "variant": named[1], "version": row.version, "model": row.model})
    return sorted(out, key=lambda m: (m["experiment"], m["variant"]))


def sdk_config(session: Session, *, bucket_space: int) -> dict[str, Any]:
    """Everything an SDK needs to assign locally; the input of :func:`config_from_payload`.
    ``policy_models`` (present when a policy variant has a model) holds each one's newest
    model: ``{experiment, variant, version, model}``."""
    experiments = session.scalars(
        select(Experiment)
        .where(Experiment.status != Status.stopped.value, Experiment.archived_at.is_(None))
        .order_by(Experiment.key)
    ).all()
    models = _policy_models(session, experiments)
    return {
        **({"policy_models": models} if models else {}),
        "revision": registry_revision(session),
        "bucket_space": bucket_space,
        "layers": [{"key": layer.key, "salt": layer.salt} for layer in list_layers(session)],
        "holdouts": [{"key": h.key, "salt": h.salt, "fraction": h.fraction} for h in session.scalars(select(Holdout))],
        "experiments": [
            {
                "key": e.key,
                "salt": e.salt,
                "phase": e.phase,
                "unit": e.unit,
                "status": e.status,
                "traffic": e.traffic,
                "control": e.control,
                "layer": e.layer.key if e.layer else None,
                "layer_range": [e.layer_lo, e.layer_hi] if e.layer_id is not None else None,
                "holdout": e.holdout.key if e.holdout else None,
                "targeting": e.targeting,
                "forced": e.forced,
                **({"shadow": e.shadow} if e.shadow else {}),
                "variants": [
                    {"key": v.key, "weight": v.weight, "strategy": v.strategy, "paused": v.paused,
                     **({"shadow": v.shadow} if v.shadow else {})}
                    for v in e.variants
                ],
            }
            for e in experiments
        ],
    }
