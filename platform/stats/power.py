"""Power: how many units per variant a metric needs to detect its minimum effect, and when.

For a two-sided test at level α with power 1 − β on the difference of two arm means, the
units needed per variant (equal allocation) are

    n = (z_{1−α/2} + z_{1−β})² · (σ_c² + σ_t²) / δ²,     δ = mde_rel · |control estimate|

where σ² is the *per-unit* variance of the metric in each arm, read off the data as
Var(arm estimate) × units (for a request-level mean that is the delta-method variance of
the unit-linearised value; for a quantile, the order-statistic variance). That closed form
ignores the test rejecting in the wrong direction; a few Newton steps on the exact
two-sided power Φ(u − z) + Φ(−u − z) = 1 − β, u = δ √(n / (σ_c² + σ_t²)), then give what
statsmodels' ``NormalIndPower`` solves. It is the fixed-horizon sample size: the always-
valid (mSPRT) test the engine runs by default needs more, so a projection reached is the
earliest a decision can come, not a promise. Pure.
"""

from __future__ import annotations

import math
from typing import Any

from . import _dist

POWER = 0.8


def n_per_variant(sigma2_control: float, sigma2_variant: float, delta: float, *, alpha: float = 0.05, power: float = POWER) -> float:
    """Units per variant to detect an absolute difference ``delta`` (NaN when unknowable)."""
    if not (delta and math.isfinite(delta) and math.isfinite(sigma2_control) and math.isfinite(sigma2_variant)):
        return math.nan
    z = _dist.norm_ppf(1 - alpha / 2)
    u = z + _dist.norm_ppf(power)  # the closed form; Newton on the far tail's share
    for _ in range(20):
        f = _dist.norm_sf(z - u) + _dist.norm_sf(z + u) - power
        step = f / (_pdf(u - z) - _pdf(u + z))
        u -= step
        if abs(step) < 1e-12:
            break
    return float(u * u * (sigma2_control + sigma2_variant) / (delta * delta))


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def power_row(
    *,
    mde_rel: float,
    alpha: float,
    control: tuple[float, float, float],
    variant: tuple[float, float, float],
    rates: tuple[float | None, float | None] = (None, None),
    power: float = POWER,
) -> dict[str, Any]:
    """``{mde_rel, n_needed, n, seconds_to_decision}`` of one metric × treatment.

    ``control``/``variant``: (estimate, variance of the estimate, units behind it);
    ``rates``: units per second arriving in each arm (None when unknown).
    ``n`` is the smaller arm; ``seconds_to_decision`` the time until both arms reach
    ``n_needed`` at the current rates: 0 once they have, None when a rate is unknown.
    """
    (est_c, var_c, n_c), (_, var_t, n_t) = control, variant
    sigma2_c, sigma2_t = var_c * n_c, var_t * n_t
    needed = n_per_variant(sigma2_c, sigma2_t, mde_rel * abs(est_c), alpha=alpha, power=power)
    n_needed = math.ceil(needed) if math.isfinite(needed) else None
    n = min(n_c, n_t)
    seconds: float | None = None
    if n_needed is not None:
        if n >= n_needed:
            seconds = 0.0
        else:
            known = [r for r in rates if r is not None and r > 0]
            if len(known) == len(rates):  # both arms' rates are known
                seconds = max(max(n_needed - have, 0.0) / rate for have, rate in zip((n_c, n_t), known))
    return {"mde_rel": mde_rel, "n_needed": n_needed, "n": n, "seconds_to_decision": seconds}
