"""Sufficient statistics: the only thing the tests need from the data.

Each class is a frozen dataclass whose instances add with ``+``, so 10 s windows,
strata and shards pool without going back to raw events (GrowthBook gbstats style).
Sums run over *randomization units*: for a user-randomized experiment one row per
user, with ``x`` the user's metric total and ``y`` the user's request count, which is
what makes request-level means (ratios over units) get honest, clustered variances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
_S = TypeVar("_S", "SampleStats", "ProportionStats", "RatioStats", "CupedStats")


def _add(a: _S, b: _S) -> _S:
    """Field-wise sum of two statistics of the same kind; anything else is refused."""
    if type(a) is not type(b):
        raise TypeError(f"cannot add {type(b).__name__} to {type(a).__name__}")
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

    def __add__(self, other: SampleStats) -> SampleStats:
        return _add(self, other)

    @classmethod
    def from_values(cls, values: ArrayLike) -> SampleStats:
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

    def __add__(self, other: ProportionStats) -> ProportionStats:
        return _add(self, other)

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

    def __add__(self, other: RatioStats) -> RatioStats:
        return _add(self, other)

    @classmethod
    def from_values(cls, x: ArrayLike, y: ArrayLike) -> RatioStats:
        xs = np.asarray(x, dtype=float)
        ys = np.asarray(y, dtype=float)
        if xs.shape != ys.shape:
            raise ValueError(f"x and y differ in shape: {xs.shape} vs {ys.shape}")
        return cls(float(xs.size), float(xs.sum()), float(np.dot(xs, xs)), float(ys.sum()), float(np.dot(ys, ys)), float(np.dot(xs, ys)))

    @property
    def ratio(self) -> float:
        return self.sum_x / self.sum_y if self.sum_y != 0 else math.nan

    @property
    def mean(self) -> float:
        return self.ratio

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


# Each product of two of the four per-unit values (x, y, px, py) that CUPED needs: field → (i, j).
CUPED_PRODUCTS: dict[str, tuple[int, int]] = {
    "sum_x2": (0, 0), "sum_xy": (0, 1), "sum_x_px": (0, 2), "sum_x_py": (0, 3),
    "sum_y2": (1, 1), "sum_y_px": (1, 2), "sum_y_py": (1, 3),
    "sum_px2": (2, 2), "sum_px_py": (2, 3),
    "sum_py2": (3, 3),
}


@dataclass(frozen=True, slots=True)
class CupedStats:
    """A ratio metric x/y plus its covariate ratio px/py per unit, with every cross-product.

    ``x``/``y``: the unit's metric numerator and denominator; ``px``/``py``: the same sums
    over the pre-period (or of the named covariate). A unit-level mean metric is the
    special case ``y = py = 1``.
    """

    n: float = 0.0
    sum_x: float = 0.0
    sum_y: float = 0.0
    sum_px: float = 0.0
    sum_py: float = 0.0
    sum_x2: float = 0.0
    sum_xy: float = 0.0
    sum_x_px: float = 0.0
    sum_x_py: float = 0.0
    sum_y2: float = 0.0
    sum_y_px: float = 0.0
    sum_y_py: float = 0.0
    sum_px2: float = 0.0
    sum_px_py: float = 0.0
    sum_py2: float = 0.0

    def __add__(self, other: CupedStats) -> CupedStats:
        return _add(self, other)

    @classmethod
    def from_values(cls, x: ArrayLike, y: ArrayLike, px: ArrayLike, py: ArrayLike) -> CupedStats:
        m = np.vstack([np.asarray(v, dtype=float) for v in (x, y, px, py)])
        return cls.from_moments(float(m.shape[1]), m.sum(axis=1), m @ m.T)

    @classmethod
    def from_sample(cls, values: ArrayLike, covariate: ArrayLike) -> CupedStats:
        ones = np.ones(np.asarray(values).shape)
        return cls.from_values(values, ones, covariate, ones)

    @classmethod
    def from_moments(cls, n: float, sums: ArrayLike, cross: ArrayLike) -> CupedStats:
        """From Σ(x, y, px, py) and the 4×4 matrix of Σ(a·b), in that order."""
        s = np.asarray(sums, dtype=float)
        c = np.asarray(cross, dtype=float).reshape(4, 4)
        products = {name: float(c[i, j]) for name, (i, j) in CUPED_PRODUCTS.items()}
        return cls(float(n), float(s[0]), float(s[1]), float(s[2]), float(s[3]), **products)

    def scaled(self, k: float) -> CupedStats:
        """The same units with x multiplied by ``k`` (a ratio metric's ``scale``)."""
        if k == 1.0:
            return self
        return replace(
            self, sum_x=k * self.sum_x, sum_x2=k * k * self.sum_x2, sum_xy=k * self.sum_xy,
            sum_x_px=k * self.sum_x_px, sum_x_py=k * self.sum_x_py,
        )

    @property
    def sums(self) -> FloatArray:
        """Σx, Σy, Σpx, Σpy."""
        return np.array([self.sum_x, self.sum_y, self.sum_px, self.sum_py])

    @property
    def cross(self) -> FloatArray:
        """The symmetric 4×4 matrix of Σ(a·b) over (x, y, px, py)."""
        c = np.zeros((4, 4))
        for name, (i, j) in CUPED_PRODUCTS.items():
            c[i, j] = c[j, i] = getattr(self, name)
        return c

    @property
    def means(self) -> FloatArray:
        return self.sums / self.n

    @property
    def covariance(self) -> FloatArray:
        s = self.sums
        return (self.cross - np.outer(s, s) / self.n) / (self.n - 1)

    @property
    def ratio(self) -> float:
        return self.sum_x / self.sum_y if self.sum_y != 0 else math.nan

    @property
    def pre_ratio(self) -> float:
        return self.sum_px / self.sum_py if self.sum_py != 0 else math.nan

    def ratio_moments(self) -> tuple[float, float, float]:
        """(Var R, Var R_pre, Cov(R, R_pre)) of the two ratio estimates by the delta method."""
        mx, my, mpx, mpy = (float(v) for v in self.means)
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


def histogram_bucket(values: ArrayLike) -> NDArray[np.int64]:
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


def bucket_value(index: ArrayLike) -> FloatArray:
    """Representative value (geometric midpoint) of a bucket."""
    i = np.asarray(index, dtype=float)
    out: FloatArray = np.where(i > 0, HIST_LO * HIST_GAMMA ** (i - 0.5), 0.0)
    return out


@dataclass(frozen=True, eq=False)
class HistogramStats:
    """Counts over the fixed global log-bucket grid; adds bucket-wise."""

    counts: NDArray[np.int64] = field(default_factory=lambda: np.zeros(HIST_BUCKETS, dtype=np.int64))

    def __post_init__(self) -> None:
        if self.counts.shape != (HIST_BUCKETS,):
            raise ValueError(f"histogram needs {HIST_BUCKETS} buckets, got shape {self.counts.shape}")

    def __add__(self, other: HistogramStats) -> HistogramStats:
        if not isinstance(other, HistogramStats):
            raise TypeError(f"cannot add {type(other).__name__} to HistogramStats")
        return HistogramStats(self.counts + other.counts)

    @classmethod
    def from_values(cls, values: ArrayLike) -> HistogramStats:
        return cls(np.bincount(histogram_bucket(values), minlength=HIST_BUCKETS).astype(np.int64))

    @classmethod
    def from_buckets(cls, buckets: ArrayLike, counts: ArrayLike) -> HistogramStats:
        out = np.zeros(HIST_BUCKETS, dtype=np.int64)
        np.add.at(out, np.asarray(buckets, dtype=np.int64), np.asarray(counts, dtype=np.int64))
        return cls(out)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def order_statistic(self, rank: ArrayLike) -> FloatArray:
        """Value of the 1-based ``rank``-th smallest observation (bucket midpoint)."""
        cum = np.cumsum(self.counts)
        r = np.clip(np.asarray(rank), 1, max(self.n, 1))
        return bucket_value(np.searchsorted(cum, r, side="left"))
