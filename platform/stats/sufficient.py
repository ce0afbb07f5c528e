"""Sufficient statistics: the only thing the tests need from the data.

Each class is a frozen dataclass whose instances add with ``+``, so 10 s windows,
strata and shards pool without going back to raw events (GrowthBook gbstats style).
Sums run over *randomization units*: for a user-randomized experiment one row per
user, with ``x`` the user's metric total and ``y`` the user's request count, which is
what makes request-level means (ratios over units) get honest, clustered variances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np


def _add(a, b):
    if type(a) is not type(b):
        return NotImplemented
    return type(a)(*(getattr(a, f.name) + getattr(b, f.name) for f in fields(a)))


def _sample_var(n: float, total: float, total_sq: float) -> float:
    if n < 2:
        return math.nan
    return max((total_sq - total * total / n) / (n - 1), 0.0)


def _sample_cov(n: float, sx: float, sy: float, sxy: float) -> float:
    if n < 2:
        return math.nan
    return (sxy - sx * sy / n) / (n - 1)


@dataclass(frozen=True, slots=True)
class SampleStats:
    """One value per unit: count, sum, sum of squares."""

    n: float = 0.0
    sum: float = 0.0
    sum_sq: float = 0.0

    __add__ = _add

    @classmethod
    def from_values(cls, values: np.ndarray) -> SampleStats:
        v = np.asarray(values, dtype=float)
        return cls(float(v.size), float(v.sum()), float(np.dot(v, v)))

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n > 0 else math.nan

    @property
    def variance(self) -> float:
        return _sample_var(self.n, self.sum, self.sum_sq)

    @property
    def mean_variance(self) -> float:
        """Variance of the mean."""
        return self.variance / self.n if self.n > 0 else math.nan


@dataclass(frozen=True, slots=True)
class ProportionStats:
    """Independent Bernoulli trials: trials and successes."""

    n: float = 0.0
    successes: float = 0.0

    __add__ = _add

    @property
    def mean(self) -> float:
        return self.successes / self.n if self.n > 0 else math.nan

    @property
    def mean_variance(self) -> float:
        p = self.mean
        return p * (1 - p) / self.n if self.n > 0 else math.nan


@dataclass(frozen=True, slots=True)
class RatioStats:
    """Ratio metric sum(x)/sum(y) over ``n`` units, with the cross-products the delta method needs."""

    n: float = 0.0
    sum_x: float = 0.0
    sum_x2: float = 0.0
    sum_y: float = 0.0
    sum_y2: float = 0.0
    sum_xy: float = 0.0

    __add__ = _add

    @classmethod
    def from_values(cls, x: np.ndarray, y: np.ndarray) -> RatioStats:
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if x.shape != y.shape:
            raise ValueError(f"x and y differ in shape: {x.shape} vs {y.shape}")
        return cls(float(x.size), float(x.sum()), float(np.dot(x, x)), float(y.sum()), float(np.dot(y, y)), float(np.dot(x, y)))

    @property
    def ratio(self) -> float:
        return self.sum_x / self.sum_y if self.sum_y != 0 else math.nan

    mean = ratio

    @property
    def denominator_total(self) -> float:
        return self.sum_y

    @property
    def mean_variance(self) -> float:
        """Delta-method variance of sum(x)/sum(y) treating units as the i.i.d. draws."""
        if self.n < 2 or self.sum_y == 0:
            return math.nan
        mean_y = self.sum_y / self.n
        r = self.ratio
        var_x = _sample_var(self.n, self.sum_x, self.sum_x2)
        var_y = _sample_var(self.n, self.sum_y, self.sum_y2)
        cov = _sample_cov(self.n, self.sum_x, self.sum_y, self.sum_xy)
        return max(var_x - 2 * r * cov + r * r * var_y, 0.0) / (self.n * mean_y * mean_y)


_CUPED_VARS = ("x", "y", "px", "py")


@dataclass(frozen=True, slots=True)
class CupedStats:
    """A ratio metric x/y plus its pre-period ratio px/py per unit, with all cross-products.

    A unit-level mean metric is the special case ``y = py = 1``. ``sums`` holds
    Σx, Σy, Σpx, Σpy; ``cross`` the 4×4 matrix of Σ(a·b), row-major, as a tuple.
    """

    n: float = 0.0
    sums: tuple[float, ...] = (0.0,) * 4
    cross: tuple[float, ...] = (0.0,) * 16

    def __add__(self, other: CupedStats) -> CupedStats:
        if not isinstance(other, CupedStats):
            return NotImplemented
        return CupedStats(
            self.n + other.n,
            tuple(a + b for a, b in zip(self.sums, other.sums)),
            tuple(a + b for a, b in zip(self.cross, other.cross)),
        )

    @classmethod
    def from_values(cls, x, y, px, py) -> CupedStats:
        m = np.vstack([np.asarray(v, dtype=float) for v in (x, y, px, py)])
        return cls(float(m.shape[1]), tuple(map(float, m.sum(axis=1))), tuple(map(float, (m @ m.T).ravel())))

    @classmethod
    def from_sample(cls, values, covariate) -> CupedStats:
        ones = np.ones(np.asarray(values).shape)
        return cls.from_values(values, ones, covariate, ones)

    @property
    def means(self) -> np.ndarray:
        return np.asarray(self.sums) / self.n

    @property
    def covariance(self) -> np.ndarray:
        s = np.asarray(self.sums)
        c = np.asarray(self.cross).reshape(4, 4)
        return (c - np.outer(s, s) / self.n) / (self.n - 1)

    @property
    def ratio(self) -> float:
        return self.sums[0] / self.sums[1]

    @property
    def pre_ratio(self) -> float:
        return self.sums[2] / self.sums[3]

    def ratio_moments(self) -> tuple[float, float, float]:
        """(Var R, Var R_pre, Cov(R, R_pre)) of the two ratio estimates by the delta method."""
        mx, my, mpx, mpy = self.means
        g = np.array([1 / my, -mx / my**2, 0.0, 0.0])
        h = np.array([0.0, 0.0, 1 / mpy, -mpx / mpy**2])
        cov = self.covariance / self.n
        return float(g @ cov @ g), float(h @ cov @ h), float(g @ cov @ h)


# Mergeable log-bucket histogram for quantiles: bucket i ≥ 1 covers
# [LO·γ^(i-1), LO·γ^i), bucket 0 everything ≤ LO (zeros, clamps). With γ = 1.01 a
# bucket's geometric midpoint is within 0.5% of every value in it.
HIST_GAMMA = 1.01
HIST_LO = 1e-3
HIST_HI = 1e7
HIST_BUCKETS = int(math.ceil(math.log(HIST_HI / HIST_LO) / math.log(HIST_GAMMA))) + 2
_LOG_GAMMA = math.log(HIST_GAMMA)


def histogram_bucket(values: np.ndarray) -> np.ndarray:
    """Bucket index of each value (vectorized); ClickHouse computes the same with SQL."""
    v = np.asarray(values, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        idx = np.ceil(np.log(np.maximum(v, HIST_LO) / HIST_LO) / _LOG_GAMMA)
    idx = np.where(v > HIST_LO, idx, 0)
    return np.clip(idx, 0, HIST_BUCKETS - 1).astype(np.int64)


def histogram_bucket_sql(column: str) -> str:
    """The same bucketing as a ClickHouse expression over ``column``."""
    return (
        f"if({column} > {HIST_LO!r}, least(toInt64(ceil(log({column} / {HIST_LO!r}) / {_LOG_GAMMA!r})), "
        f"{HIST_BUCKETS - 1}), 0)"
    )


def bucket_value(index: np.ndarray | int) -> np.ndarray:
    """Representative value (geometric midpoint) of a bucket."""
    i = np.asarray(index, dtype=float)
    return np.where(i > 0, HIST_LO * HIST_GAMMA ** (i - 0.5), 0.0)


@dataclass(frozen=True, eq=False)
class HistogramStats:
    """Counts over the fixed global log-bucket grid; adds bucket-wise."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(HIST_BUCKETS, dtype=np.int64))

    def __post_init__(self) -> None:
        if self.counts.shape != (HIST_BUCKETS,):
            raise ValueError(f"histogram needs {HIST_BUCKETS} buckets, got shape {self.counts.shape}")

    def __add__(self, other: HistogramStats) -> HistogramStats:
        if not isinstance(other, HistogramStats):
            return NotImplemented
        return HistogramStats(self.counts + other.counts)

    @classmethod
    def from_values(cls, values: np.ndarray) -> HistogramStats:
        return cls(np.bincount(histogram_bucket(values), minlength=HIST_BUCKETS).astype(np.int64))

    @classmethod
    def from_buckets(cls, buckets: np.ndarray, counts: np.ndarray) -> HistogramStats:
        out = np.zeros(HIST_BUCKETS, dtype=np.int64)
        np.add.at(out, np.asarray(buckets, dtype=np.int64), np.asarray(counts, dtype=np.int64))
        return cls(out)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def order_statistic(self, rank: np.ndarray | int) -> np.ndarray:
        """Value of the 1-based ``rank``-th smallest observation (bucket midpoint)."""
        cum = np.cumsum(self.counts)
        r = np.clip(np.asarray(rank), 1, max(self.n, 1))
        return bucket_value(np.searchsorted(cum, r, side="left"))
