"""What assignment needs from the registry: the SDK config payload (its compiled form is
:func:`ablab.platform.assignment.payload.config_from_payload`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform.assignment.payload import config_from_payload  # noqa: F401 - the payload's reader, beside its writer
from ablab.platform.registry.audit import registry_revision
from ablab.platform.registry.layers import list_layers
from ablab.platform.registry.models import Experiment, Holdout
from ablab.platform.registry.schemas import Status


class PublishedModels:
    """Policy variants' current models (docs/policies.md, "Model refresh"), published by the
    API's refresher (``ablab.platform.api.policy_refresh``) and carried by the SDK config as
    ``policy_models``. Keyed by (experiment salt, variant): a salt is drawn per experiment, so
    a model never outlives its experiment or reaches another database's namesake. In memory:
    a restarted API refits (the same logs fit the same version)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    def publish(self, salt: str, variant: str, version: str, model: dict[str, Any]) -> bool:
        """Whether this is a new version for the variant."""
        with self._lock:
            if (held := self._models.get((salt, variant))) is not None and held[0] == version:
                return False
            self._models[(salt, variant)] = (version, model)
            return True

    def get(self, salt: str, variant: str) -> tuple[str, dict[str, Any]] | None:
        return self._models.get((salt, variant))


POLICY_MODELS = PublishedModels()


def _policy_models(experiments: Sequence[Experiment]) -> list[dict[str, Any]]:
    out = []
    for e in experiments:
        for v in e.variants:
            if isinstance((v.strategy or {}).get("policy"), dict) and (held := POLICY_MODELS.get(e.salt, v.key)):
                out.append({"experiment": e.key, "variant": v.key, "version": held[0], "model": held[1]})
    return out


def sdk_config(session: Session, *, bucket_space: int) -> dict[str, Any]:
    """Everything an SDK needs to assign locally; the input of :func:`config_from_payload`.
    ``policy_models`` (present when a policy variant has a model) holds each one's current
    model: ``{experiment, variant, version, model}``."""
    experiments = session.scalars(
        select(Experiment)
        .where(Experiment.status != Status.stopped.value, Experiment.archived_at.is_(None))
        .order_by(Experiment.key)
    ).all()
    models = _policy_models(experiments)
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
