"""What assignment needs from the registry: the SDK config payload (its compiled form is
:func:`ablab.platform.assignment.payload.config_from_payload`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform.assignment.payload import config_from_payload  # noqa: F401 - the payload's reader, beside its writer
from ablab.platform.registry.audit import registry_revision
from ablab.platform.registry.layers import list_layers
from ablab.platform.registry.models import Experiment, Holdout
from ablab.platform.registry.schemas import Status


def sdk_config(session: Session, *, bucket_space: int) -> dict[str, Any]:
    """Everything an SDK needs to assign locally; the input of :func:`config_from_payload`."""
    experiments = session.scalars(
        select(Experiment)
        .where(Experiment.status != Status.stopped.value, Experiment.archived_at.is_(None))
        .order_by(Experiment.key)
    ).all()
    return {
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
