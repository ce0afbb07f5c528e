"""The few distribution functions the engine needs, from ``scipy.special``.

``scipy.stats`` costs about a second to import (it loads every distribution), which
would dominate ``ablab analyze``; these are the same numerical routines underneath.
"""

from __future__ import annotations

import math
from typing import Any

from numpy.typing import NDArray
from scipy import special

# Each takes a float or an array and answers in kind (scipy's ufuncs), hence ``Any``.
Values = float | NDArray[Any]


def norm_sf(x: Values) -> Any:
    return special.ndtr(-x)


def norm_ppf(p: Values) -> Any:
    return special.ndtri(p)


def t_sf(x: Values, df: Values) -> Any:
    return special.stdtr(df, -x)


def t_ppf(p: Values, df: Values) -> Any:
    return special.stdtrit(df, p)


def chi2_sf(x: Values, df: Values) -> Any:
    return special.chdtrc(df, x)


def binom_cdf(k: int, n: int, p: float) -> float:
    return float(special.bdtr(k, n, p)) if k >= 0 else 0.0


def binom_ppf(q: float, n: int, p: float) -> int:
    """Smallest k with P(X ≤ k) ≥ q for X ~ Binomial(n, p) (scipy.stats.binom.ppf)."""
    if q <= 0:
        return -1
    if q >= 1:
        return n
    k = int(min(n, max(0, math.floor(n * p + float(norm_ppf(q)) * math.sqrt(n * p * (1 - p))))))
    while k < n and binom_cdf(k, n, p) < q:
        k += 1
    while k > 0 and binom_cdf(k - 1, n, p) >= q:
        k -= 1
    return k
