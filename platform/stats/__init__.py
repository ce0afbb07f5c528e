"""Statistics and attribution engine: pure functions on sufficient statistics.

Entry points (the API and the CLI call these; everything else is their machinery):

- :func:`engine.analyze_results` — per-variant statistics → the CONTRACTS "Analysis output"
  (:class:`.result_models.Results`; the edges write its ``model_dump(mode="json")``);
- :func:`attribution.attribution_results` — Pareto frontier, factor effects, Shapley shares;
- :func:`timeseries.timeseries` — 10 s window rows → per-variant series;
- :func:`decisions.guardrail_breaches` — which variants to pause, and why;
- :func:`allocator.thompson_weights` — SLA-constrained Thompson sampling weights;
- :func:`offline.analyze_events` — the engine fed from events (an Arrow table); the store
  path (:mod:`ablab.platform.analytics.results`) renders the same per-unit plan
  (:mod:`.unit_agg`) as SQL.

Nothing here does I/O: files are read by :mod:`ablab.platform.analytics.event_files`, the
store by :mod:`ablab.platform.analytics.results`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use: the SDK and the gateway read the metric and custom-metric definitions
# (pure Python and numpy) in a light install that has no scipy, which the tests below need.
_HOME = {
    "Comparison": "comparisons", "cuped_test": "comparisons", "proportion_test": "comparisons",
    "quantile_test": "comparisons", "ratio_test": "comparisons", "welch_test": "comparisons",
    "adjust": "corrections", "benjamini_hochberg": "corrections", "holm": "corrections", "srm_check": "corrections",
    "QuantileEstimate": "quantiles", "quantile_ci": "quantiles",
    "confidence_sequence_halfwidth": "sequential", "msprt_p_value": "sequential",
    "CupedStats": "sufficient", "HistogramStats": "sufficient", "ProportionStats": "sufficient",
    "RatioStats": "sufficient", "SampleStats": "sufficient",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "Comparison",
    "CupedStats",
    "HistogramStats",
    "ProportionStats",
    "QuantileEstimate",
    "RatioStats",
    "SampleStats",
    "adjust",
    "benjamini_hochberg",
    "confidence_sequence_halfwidth",
    "cuped_test",
    "holm",
    "msprt_p_value",
    "proportion_test",
    "quantile_ci",
    "quantile_test",
    "ratio_test",
    "srm_check",
    "welch_test",
]
