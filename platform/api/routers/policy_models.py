"""``GET /v1/experiments/{key}/policy-models``: the policy models the registry keeps for an
experiment's ``slo_router`` variants (docs/policies.md, "Model refresh"), so a propensity
logged under any kept ``policy_version`` can be recomputed from its event's features with
that version's model. The newest per variant is the one the SDK config serves."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ablab.platform.api.deps import SessionDep, Viewer
from ablab.platform.api.problems import responses
from ablab.platform.errors import NotFound
from ablab.platform.registry import service
from ablab.platform.registry.sdk_config import PolicyModels, policy_models

router = APIRouter(prefix="/v1/experiments", tags=["experiments"])

Name = Annotated[str | None, Query(min_length=1, max_length=64)]


@router.get("/{key}/policy-models", response_model=PolicyModels, responses=responses(NotFound))
def list_policy_models(key: str, session: SessionDep, _: Viewer, variant: Name = None,
                       version: Annotated[str | None, Query(min_length=1, max_length=64,
                                                            description="One kept version, with its model JSON.")] = None,
                       ) -> PolicyModels:
    """The kept model versions of the experiment's policy variants (`variant`: one of them),
    newest first, each with `created_at` and whether the SDK config serves it; with `version`,
    that version alone with its `model` (`PolicyModel.to_json()`), 404 naming `version` when it
    is not kept (older versions are dropped: 8 are kept per variant)."""
    exp = service.get_experiment(session, key)  # 404 for an unknown key
    found = policy_models(session, exp, variant=variant, version=version)
    if version is not None and not found.items:
        raise NotFound(f"experiment '{key}' keeps no policy model of version '{version}'"
                       + (f" for variant '{variant}'" if variant is not None else ""), field="version")
    return found
