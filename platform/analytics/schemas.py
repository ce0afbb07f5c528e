"""The shapes of an experiment's results, time series and attribution, under the name the
API and the dashboard client import them by.

They are defined beside the engine that builds them (:mod:`ablab.platform.stats.result_models`:
``platform.stats`` cannot import this package); this module only names them for the edges.
"""

from __future__ import annotations

from ablab.platform.stats.result_models import (
    Attribution,
    Coverage,
    CoverageArm,
    Cuped,
    Decision,
    Effect,
    Factorial,
    Guardrail,
    Heterogeneity,
    Inference,
    Interval,
    MetricRow,
    Number,
    Pareto,
    ParetoPoint,
    Point,
    Power,
    Results,
    Segment,
    SegmentRow,
    Series,
    ShadowCoverage,
    ShadowRow,
    Srm,
    Timeseries,
    Unadjusted,
    WindowPoint,
)

__all__ = [
    "Attribution", "Coverage", "CoverageArm", "Cuped", "Decision", "Effect", "Factorial", "Guardrail", "Heterogeneity",
    "Inference", "Interval", "MetricRow", "Number", "Pareto", "ParetoPoint", "Point", "Power", "Results", "Segment",
    "SegmentRow", "Series", "ShadowCoverage", "ShadowRow", "Srm", "Timeseries", "Unadjusted", "WindowPoint",
]
