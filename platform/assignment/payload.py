"""The SDK config payload (``GET /v1/sdk/config``) → the engine's :class:`AssignmentConfig`.

The API builds its own assignment cache through this same function, so the SDK and
``/v1/assign`` cannot disagree.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict

from ablab.platform.assignment.engine import AssignmentConfig, ExperimentSpec, HoldoutSpec, LayerSpec, VariantSpec
from ablab.platform.assignment.targeting import rules_from_stored


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow")


class LayerPayload(_Payload):
    key: str
    salt: str


class HoldoutPayload(_Payload):
    key: str
    salt: str
    fraction: float


class VariantPayload(_Payload):
    key: str
    weight: float
    strategy: dict[str, Any]
    paused: bool = False
    shadow: dict[str, Any] | None = None


class ExperimentPayload(_Payload):
    key: str
    salt: str
    phase: int
    unit: str
    status: str
    traffic: float
    control: str
    layer: str | None = None
    layer_range: list[int] | None = None
    holdout: str | None = None
    targeting: list[dict[str, Any]] = []
    forced: dict[str, str] = {}
    shadow: dict[str, Any] | None = None
    variants: list[VariantPayload]


class PolicyModelPayload(_Payload):
    """A policy variant's current model (``ablab.platform.policy.model.PolicyModel.to_json``)."""

    experiment: str
    variant: str
    version: str
    model: dict[str, Any]


class SdkConfig(_Payload):
    """The published shape of the payload (the API serves the dict as built, unvalidated)."""

    revision: int
    bucket_space: int
    layers: list[LayerPayload]
    holdouts: list[HoldoutPayload]
    experiments: list[ExperimentPayload]
    policy_models: list[PolicyModelPayload] = []


def config_revision(payload: dict[str, Any]) -> str:
    """The registry's revision, plus the policy models' versions when there are any: a refit
    model is a new config (the gateway's plan caches are keyed by it)."""
    models = payload.get("policy_models") or []
    if not models:
        return str(payload["revision"])
    versions = ",".join(sorted(f"{m['experiment']}/{m['variant']}={m['version']}" for m in models))
    return f"{payload['revision']}+{hashlib.sha256(versions.encode()).hexdigest()[:12]}"


def config_from_payload(payload: dict[str, Any]) -> AssignmentConfig:
    """Build the pure engine's config from an SDK config payload (API and SDK share this)."""
    return AssignmentConfig(
        experiments=tuple(
            ExperimentSpec(
                key=e["key"],
                salt=e["salt"],
                phase=e["phase"],
                unit=e["unit"],
                status=e["status"],
                traffic=e["traffic"],
                control=e["control"],
                layer=e.get("layer"),
                layer_range=tuple(e["layer_range"]) if e.get("layer_range") else None,
                holdout=e.get("holdout"),
                targeting=rules_from_stored(e.get("targeting", []), experiment=e["key"]),
                forced=dict(e.get("forced", {})),
                shadow=e.get("shadow"),
                variants=tuple(
                    VariantSpec(key=v["key"], weight=v["weight"], strategy=v["strategy"], paused=v.get("paused", False),
                                shadow=v.get("shadow"))
                    for v in e["variants"]
                ),
            )
            for e in payload["experiments"]
        ),
        layers={layer["key"]: LayerSpec(layer["key"], layer["salt"]) for layer in payload["layers"]},
        holdouts={h["key"]: HoldoutSpec(h["key"], h["salt"], h["fraction"]) for h in payload["holdouts"]},
        bucket_space=payload["bucket_space"],
        revision=config_revision(payload),
        policy_models={(m["experiment"], m["variant"]): m["model"] for m in payload.get("policy_models") or []},
    )
