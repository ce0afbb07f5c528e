"""The few distribution functions the engine needs, from ``scipy.special``.

``scipy.stats`` costs about a second to import (it loads every distribution), which
would dominate ``ablab analyze``; these are the same numerical routines underneath.
"""

from __future__ import annotations

import math

from scipy import special


def norm_sf(x):
    return special.ndtr(-x)


def norm_ppf(p):
    return special.ndtri(p)


def t_sf(x, df):
    return special.stdtr(df, -x)


def t_ppf(p, df):
    return special.stdtrit(df, p)


def chi2_sf(x, df):
    return special.chdtrc(df, x)


def binom_cdf(k, n, p) -> float:
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
