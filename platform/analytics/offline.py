"""``ablab analyze``: the results of an event file, as ``GET …/results`` gives them from the store.

The engine's part is :func:`ablab.platform.stats.offline.analyze_events` (pure statistics over
an Arrow table). A policy variant's arms and SLOs (issue 33) come from the policy package, which
itself reads the stats package, so they are joined here, one layer above both, from the same
reading of logged requests the live route uses (:func:`ablab.platform.policy.breakdown.policy_results`).
"""

from __future__ import annotations

from typing import Any

from ablab.platform.policy.breakdown import has_policies, policy_results
from ablab.platform.stats.offline import OfflineAggregates, analyze_events, to_table
from ablab.platform.stats.result_models import Results
from ablab.platform.stats.spec import ExperimentSpec


def analyze_file_events(events: Any, spec: ExperimentSpec) -> tuple[Results, OfflineAggregates]:
    """The results of ``events`` (an Arrow table or frame) and what was aggregated."""
    table = to_table(events)  # once: a frame's conversion copies every column
    policies = policy_results(table, spec) if has_policies(spec) else None
    return analyze_events(table, spec, policies=policies)
