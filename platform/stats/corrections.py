"""Sample-ratio mismatch and multiple-testing corrections (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import _dist

SRM_THRESHOLD = 0.001  # conventional: an SRM at p < 0.001 means the split itself is broken


@dataclass(frozen=True, slots=True)
class SrmResult:
    p_value: float
    statistic: float
    flagged: bool
    observed: dict[str, float]
    expected: dict[str, float]


def srm_check(counts: Mapping[str, float], weights: Mapping[str, float], *, threshold: float = SRM_THRESHOLD) -> SrmResult:
    """Pearson chi-square of observed unit counts against the configured weights."""
    keys = list(weights)
    observed = np.array([float(counts.get(k, 0.0)) for k in keys])
    w = np.array([float(weights[k]) for k in keys])
    total = observed.sum()
    if total <= 0 or len(keys) < 2 or w.sum() <= 0:
        return SrmResult(math.nan, math.nan, False, dict(zip(keys, observed)), {})
    expected = total * w / w.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    p = float(_dist.chi2_sf(stat, len(keys) - 1))
    return SrmResult(p, stat, p < threshold, dict(zip(keys, observed.tolist())), dict(zip(keys, expected.tolist())))


def _clean(p_values: Sequence[float | None]) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    p = np.array([math.nan if v is None else float(v) for v in p_values])
    return p, np.flatnonzero(np.isfinite(p))


def holm(p_values: Sequence[float | None]) -> list[float]:
    """Holm step-down adjusted p-values (FWER); NaN/None entries stay NaN and do not count."""
    p, idx = _clean(p_values)
    out = np.full(p.shape, math.nan)
    m = idx.size
    if m:
        order = idx[np.argsort(p[idx], kind="stable")]
        adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
        out[order] = np.minimum(adj, 1.0)
    adjusted: list[float] = out.tolist()
    return adjusted


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float]:
    """Benjamini–Hochberg step-up adjusted p-values (FDR)."""
    p, idx = _clean(p_values)
    out = np.full(p.shape, math.nan)
    m = idx.size
    if m:
        order = idx[np.argsort(p[idx], kind="stable")]
        scaled = p[order] * m / np.arange(1, m + 1)
        adj = np.minimum.accumulate(scaled[::-1])[::-1]
        out[order] = np.minimum(adj, 1.0)
    adjusted: list[float] = out.tolist()
    return adjusted


def adjust(p_values: Sequence[float | None], method: str) -> list[float]:
    if method == "holm":
        return holm(p_values)
    if method in ("bh", "fdr_bh"):
        return benjamini_hochberg(p_values)
    if method == "none":
        return [math.nan if v is None else float(v) for v in p_values]
    raise ValueError(f"correction must be 'holm', 'bh' or 'none', got {method!r}")


def homogeneity_test(successes: Mapping[str, float], trials: Mapping[str, float]) -> float:
    """Chi-square p-value that a proportion (e.g. label coverage) is equal across groups."""
    keys = [k for k in trials if trials[k] > 0]
    if len(keys) < 2:
        return math.nan
    s = np.array([successes.get(k, 0.0) for k in keys], dtype=float)
    n = np.array([trials[k] for k in keys], dtype=float)
    table = np.vstack([s, n - s])
    if (table.sum(axis=1) == 0).any():
        return 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    return float(_dist.chi2_sf(stat, len(keys) - 1))
