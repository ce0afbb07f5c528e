"""The registry's services under one name, for callers that use several domains.

Each domain lives in its own module: :mod:`.experiments`, :mod:`.layers` (and holdouts),
:mod:`.audit` (the revision counter and audit log) and :mod:`.sdk_config` (what
assignment reads). Services flush; the caller's transaction commits.
"""

from __future__ import annotations

from ablab.platform.registry.audit import audit_log, record_audit, registry_revision
from ablab.platform.registry.experiments import (
    TRANSITIONS,
    archive_experiment,
    create_experiment,
    delete_experiment,
    get_experiment,
    list_experiments,
    pause_variant,
    resume_variant,
    to_read,
    transition,
    unarchive_experiment,
    update_experiment,
)
from ablab.platform.registry.layers import (
    create_holdout,
    create_layer,
    delete_holdout,
    delete_layer,
    layer_read,
    list_holdouts,
    list_layers,
)
from ablab.platform.registry.sdk_config import config_from_payload, sdk_config

__all__ = [
    "TRANSITIONS", "archive_experiment", "audit_log", "config_from_payload", "create_experiment", "create_holdout",
    "create_layer", "delete_experiment", "delete_holdout", "delete_layer", "get_experiment", "layer_read",
    "list_experiments", "list_holdouts", "list_layers", "pause_variant", "record_audit", "registry_revision",
    "resume_variant", "sdk_config", "to_read", "transition", "unarchive_experiment", "update_experiment",
]

# Shipping a winner (issue 33 item 5): its own module, re-exported here beside the lifecycle.
from ablab.platform.registry.ship import (
    ShipRefused,
    ShipRequest,
    current_ship,
    ship_variant,
)

__all__ += ["ShipRefused", "ShipRequest", "current_ship", "ship_variant"]
