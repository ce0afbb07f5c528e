"""Refitting a served router's model from its experiment's logged events. Pure: an Arrow table
in (the analytics port's ``logged_events``, or an event file), a :class:`~.model.PolicyModel`
out. The API's refresher (``ablab.platform.api.policy_refresh``) calls it per router variant.

The reading is OPE's (:func:`.logs.requests_from_table`), so the model learns from exactly
the requests, features and labels off-policy evaluation weighs: the variant's own requests,
by arm; the features its decisions saw. :class:`~.model.NotEnoughData` (an arm with too few
labelled requests) propagates: the caller keeps the previous model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ablab.platform.stats.spec import ExperimentSpec

from .logs import requests_from_table
from .model import PolicyModel, fit_model
from .spec import SloRouter, objective_of


def fit_variant(table: pa.Table, spec: ExperimentSpec, variant: str, policy: SloRouter, *,
                custom: Mapping[str, Any] | None = None) -> PolicyModel:
    """The model of ``variant``'s router, fitted on its logged requests."""
    objective = objective_of(policy.objective, custom)
    latencies = tuple(dict.fromkeys(s.latency for s in policy.slos()))
    logs = requests_from_table(table, spec, features=policy.features, sources=(objective.source, *latencies))
    own = np.full(len(logs.actions), -1, dtype=np.int64)
    for i, action in enumerate(logs.actions):
        head, _, arm = action.partition(".")
        if head == variant and arm in policy.arms:
            own[i] = policy.arm_names.index(arm)
    arm_index = own[logs.action] if logs.n else np.zeros(0, dtype=np.int64)
    n = logs.n
    values = logs.values
    return fit_model(policy, arm_index, logs.features,
                     {lat: np.asarray(values.get(lat, np.full(n, np.nan)), dtype=float) for lat in latencies},
                     np.asarray(values.get(objective.source, np.full(n, np.nan)), dtype=float),
                     lower_is_better=objective.lower_is_better)
