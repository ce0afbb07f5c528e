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

from .comparisons import Comparison, cuped_test, proportion_test, quantile_test, ratio_test, welch_test
from .corrections import adjust, benjamini_hochberg, holm, srm_check
from .quantiles import QuantileEstimate, quantile_ci
from .sequential import confidence_sequence_halfwidth, msprt_p_value
from .sufficient import CupedStats, HistogramStats, ProportionStats, RatioStats, SampleStats

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
