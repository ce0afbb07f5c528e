"""Statistics and attribution engine: pure functions on sufficient statistics.

Nothing in this package does I/O except :mod:`.offline` (reads event files) and
:mod:`.synthetic` (writes seeded test data); the engine itself is data in, numbers out.
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
