"""Quantile estimates with distribution-free confidence intervals.

Method: the order-statistic interval. For the p-quantile of n observations the ranks
l, u with Binomial(n, p) probability α/2 below and above bound the true quantile with
probability ≥ 1 − α, whatever the distribution. The ranks are read off a mergeable
log-bucket histogram (:class:`HistogramStats`, 1 % buckets), so the bounds carry at most
±0.5 % relative bucketing error, and windows/shards merge by adding counts.

When requests cluster in users, the indicator 1{x ≤ q} is correlated within a user;
``design_effect`` (≥ 1, e.g. the clustered/naive variance ratio of the mean) shrinks the
effective n used for the ranks, which widens the interval accordingly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from . import _dist
from .sufficient import HistogramStats


@dataclass(frozen=True, slots=True)
class QuantileEstimate:
    n: int
    quantile: float
    estimate: float
    lo: float
    hi: float
    se: float  # implied by the interval: (hi − lo) / (2 z); feeds the difference test


def _rank_bounds(n: int, p: float, alpha: float, design_effect: float) -> tuple[float, float]:
    n_eff = max(n / max(design_effect, 1.0), 1.0)
    scale = n / n_eff
    lo = _dist.binom_ppf(alpha / 2, math.floor(n_eff), p) * scale
    hi = (_dist.binom_ppf(1 - alpha / 2, math.floor(n_eff), p) + 1) * scale
    return max(1.0, math.floor(lo)), min(float(n), math.ceil(hi))


def quantile_ci(
    hist: HistogramStats, quantile: float, *, alpha: float = 0.05, design_effect: float = 1.0
) -> QuantileEstimate:
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    n = hist.n
    if n == 0:
        return QuantileEstimate(0, quantile, math.nan, math.nan, math.nan, math.nan)
    rank = max(1, math.ceil(n * quantile))  # the 'inverted CDF' definition
    lo_rank, hi_rank = _rank_bounds(n, quantile, alpha, design_effect)
    est, lo, hi = (float(v) for v in hist.order_statistic(np.array([rank, lo_rank, hi_rank])))
    z = _dist.norm_ppf(1 - alpha / 2)
    return QuantileEstimate(n, quantile, est, lo, hi, (hi - lo) / (2 * z))


def sample_quantile_ci(values: ArrayLike, quantile: float, *, alpha: float = 0.05) -> QuantileEstimate:
    """Exact order statistics of a raw sample (reference for the histogram version)."""
    v = np.sort(np.asarray(values, dtype=float))
    n = v.size
    rank = max(1, math.ceil(n * quantile))
    lo_rank, hi_rank = _rank_bounds(n, quantile, alpha, 1.0)
    z = _dist.norm_ppf(1 - alpha / 2)
    lo, hi = v[int(lo_rank) - 1], v[int(hi_rank) - 1]
    return QuantileEstimate(n, quantile, float(v[rank - 1]), float(lo), float(hi), float(hi - lo) / (2 * z))
