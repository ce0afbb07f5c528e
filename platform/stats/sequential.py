"""Always-valid inference: the normal-mixture mSPRT and its confidence sequence.

For an asymptotically normal estimate Δ̂ with variance V from N units, mixing the
likelihood ratio over Δ ~ N(0, τ²) gives

    Λ = sqrt(V / (V + τ²)) · exp(τ² Δ̂² / (2 V (V + τ²)))

and p = min(1, 1/Λ) is valid at any stopping time (Johari et al. 2017), so a look after
every 10 s window keeps the error rate. Inverting Λ ≥ 1/α gives the confidence sequence
(Howard et al. 2021); its half-width shrinks like sqrt(log N / N). τ² = ρ² · s² with
s² = V·N the per-unit variance and ρ² tuned so the sequence is tightest at
``tuning_n`` units (the same parametrisation as GrowthBook's sequential tests).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

DEFAULT_TUNING_N = 5_000.0


def mixture_rho2(alpha: float, tuning_n: float) -> float:
    a = -2.0 * math.log(alpha)
    return (a + math.log(a + 1.0)) / tuning_n


def _tau2(variance: ArrayLike, n_total: ArrayLike, alpha: float, tuning_n: float) -> NDArray[np.float64]:
    tau2: NDArray[np.float64] = mixture_rho2(alpha, tuning_n) * np.asarray(variance, dtype=float) * np.asarray(n_total, dtype=float)
    return tau2


# Vectorized: a float for scalars, an array for arrays (hence ``Any`` out).
def msprt_p_value(
    estimate: ArrayLike, variance: ArrayLike, n_total: ArrayLike, *, alpha: float = 0.05, tuning_n: float = DEFAULT_TUNING_N
) -> Any:
    """Always-valid p-value for H0: Δ = 0 (vectorized over arrays)."""
    est = np.asarray(estimate, dtype=float)
    v = np.asarray(variance, dtype=float)
    tau2 = _tau2(v, n_total, alpha, tuning_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_lambda = 0.5 * np.log(v / (v + tau2)) + tau2 * est**2 / (2 * v * (v + tau2))
    p = np.exp(np.minimum(0.0, -log_lambda))
    return float(p) if p.ndim == 0 else p


def confidence_sequence_halfwidth(
    variance: ArrayLike, n_total: ArrayLike, *, alpha: float = 0.05, tuning_n: float = DEFAULT_TUNING_N
) -> Any:
    v = np.asarray(variance, dtype=float)
    tau2 = _tau2(v, n_total, alpha, tuning_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        hw = np.sqrt(2 * v * (v + tau2) / tau2 * (math.log(1 / alpha) + 0.5 * np.log((v + tau2) / v)))
    return float(hw) if hw.ndim == 0 else hw
