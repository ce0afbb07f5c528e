"""Variant-vs-control comparisons on sufficient statistics.

Every test returns a :class:`Comparison` with the absolute and relative difference,
their intervals and a p-value. ``sequential=None`` gives fixed-horizon inference;
passing a tuning ``n`` gives the always-valid mSPRT version (the engine's default).

One scale per test: the p-value tests the absolute difference Δ = t − c, and the relative
interval is Fieller's interval for Δ/c — the set of lifts ρ the same test does not reject,
{ρ : (Δ − ρc)² ≤ k² Var(Δ − ρc)}, with k the critical value of that test (t, z, or the
mSPRT confidence-sequence multiplier). So the relative interval excludes 0 exactly when the
absolute one does, exactly when p < α; it is asymmetric, as a ratio's uncertainty is, and
unbounded (null bounds) when the control mean itself is not distinguishable from zero.
Data problems (too few units, zero variance, zero control mean) come back as an
``error`` code with NaN numbers, never as an exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import _dist
from .quantiles import QuantileEstimate
from .sequential import confidence_sequence_halfwidth, msprt_p_value
from .sufficient import CupedStats, ProportionStats, RatioStats, SampleStats

NAN = math.nan


@dataclass(frozen=True, slots=True)
class Comparison:
    method: str
    control: float
    variant: float
    abs_diff: float
    abs_ci: tuple[float, float]
    rel_diff: float
    rel_ci: tuple[float, float]
    p_value: float
    se: float
    error: str | None = None
    theta: float | None = None  # CUPED: the regression coefficient on the covariate
    variance_reduction: float | None = None  # CUPED: 1 − Var(Δ adjusted) / Var(Δ unadjusted)

    @property
    def ok(self) -> bool:
        return self.error is None


def _failed(method: str, control: float, variant: float, error: str) -> Comparison:
    return Comparison(method, control, variant, NAN, (NAN, NAN), NAN, (NAN, NAN), NAN, NAN, error)


def _finish(
    method: str,
    *,
    control: float,
    variant: float,
    diff: float,
    var_diff: float,
    base: float,
    var_base: float,
    cov_diff_base: float,
    n_total: float,
    df: float,
    alpha: float,
    sequential: float | None,
    p_fixed: float | None = None,
    theta: float | None = None,
    variance_reduction: float | None = None,
) -> Comparison:
    """``base``: the control value a lift is relative to; ``var_base``, ``cov_diff_base``:
    Var(base) and Cov(Δ, base), for Fieller's interval."""
    if not np.isfinite(var_diff) or var_diff <= 0:
        return _failed(method, control, variant, "zero_variance")
    se = math.sqrt(var_diff)
    if sequential is not None:
        hw = confidence_sequence_halfwidth(var_diff, n_total, alpha=alpha, tuning_n=sequential)
        p = msprt_p_value(diff, var_diff, n_total, alpha=alpha, tuning_n=sequential)
        method = f"{method}+msprt"
    else:
        crit = _dist.t_ppf(1 - alpha / 2, df) if np.isfinite(df) else _dist.norm_ppf(1 - alpha / 2)
        hw = crit * se
        if p_fixed is not None:
            p = p_fixed
        elif np.isfinite(df):
            p = 2 * _dist.t_sf(abs(diff) / se, df)
        else:
            p = 2 * _dist.norm_sf(abs(diff) / se)
    rel = diff / base if base and np.isfinite(base) else NAN
    rel_ci = fieller_interval(diff, base, var_diff, var_base, cov_diff_base, hw / se)
    return Comparison(
        method, control, variant, diff, (diff - hw, diff + hw), rel, rel_ci, float(p), se,
        theta=theta, variance_reduction=variance_reduction,
    )


def fieller_interval(a: float, b: float, var_a: float, var_b: float, cov_ab: float, k: float) -> tuple[float, float]:
    """{ρ : (a − ρb)² ≤ k² Var(a − ρb)}: the lifts a/b that a test of critical value k keeps.

    Contains 0 exactly when a² ≤ k² Var a, i.e. when the test of a = 0 does not reject.
    Unbounded, (−inf, inf), when b² ≤ k² Var b (b not distinguishable from 0).
    """
    if not all(np.isfinite(v) for v in (a, b, var_a, var_b, cov_ab, k)) or b == 0:
        return NAN, NAN
    k2 = k * k
    qa = b * b - k2 * var_b
    qb = a * b - k2 * cov_ab
    qc = a * a - k2 * var_a
    if qa <= 0:
        return -math.inf, math.inf
    root = math.sqrt(max(qb * qb - qa * qc, 0.0))
    return (qb - root) / qa, (qb + root) / qa


def welch_test(
    control: SampleStats, variant: SampleStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    mc, mt = control.mean, variant.mean
    if control.n < 2 or variant.n < 2:
        return _failed("welch", mc, mt, "not_enough_data")
    vc, vt = control.mean_variance, variant.mean_variance
    var_diff = vc + vt
    df = var_diff**2 / (vc**2 / (control.n - 1) + vt**2 / (variant.n - 1)) if var_diff > 0 else NAN
    return _finish(
        "welch", control=mc, variant=mt, diff=mt - mc, var_diff=var_diff, base=mc, var_base=vc, cov_diff_base=-vc,
        n_total=control.n + variant.n, df=df, alpha=alpha, sequential=sequential,
    )


def ratio_test(
    control: RatioStats, variant: RatioStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """Delta method over units: the request-level mean of a user-randomized experiment."""
    mc, mt = control.ratio, variant.ratio
    if control.n < 2 or variant.n < 2 or control.sum_y == 0 or variant.sum_y == 0:
        return _failed("delta", mc, mt, "not_enough_data")
    vc, vt = control.mean_variance, variant.mean_variance
    return _finish(
        "delta", control=mc, variant=mt, diff=mt - mc, var_diff=vc + vt, base=mc, var_base=vc, cov_diff_base=-vc,
        n_total=control.n + variant.n, df=math.inf, alpha=alpha, sequential=sequential,
    )


def proportion_test(
    control: ProportionStats, variant: ProportionStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """Two-proportion z-test: pooled variance for the p-value, unpooled for the intervals."""
    pc, pt = control.mean, variant.mean
    if control.n < 1 or variant.n < 1:
        return _failed("two_proportion_z", pc, pt, "not_enough_data")
    pooled = (control.successes + variant.successes) / (control.n + variant.n)
    se_pooled = math.sqrt(pooled * (1 - pooled) * (1 / control.n + 1 / variant.n))
    p_fixed = 2 * _dist.norm_sf(abs(pt - pc) / se_pooled) if se_pooled > 0 else NAN
    vc, vt = control.mean_variance, variant.mean_variance
    return _finish(
        "two_proportion_z", control=pc, variant=pt, diff=pt - pc, var_diff=vc + vt, base=pc, var_base=vc, cov_diff_base=-vc,
        n_total=control.n + variant.n, df=math.inf, alpha=alpha, sequential=sequential, p_fixed=p_fixed,
    )


def cuped_theta(control: CupedStats, variant: CupedStats) -> float:
    """θ minimising Var(Δ − θ Δ_pre), pooled over both arms."""
    var_c, pvar_c, cov_c = control.ratio_moments()
    var_t, pvar_t, cov_t = variant.ratio_moments()
    denom = pvar_c + pvar_t
    return (cov_c + cov_t) / denom if denom > 0 else 0.0


def cuped_test(
    control: CupedStats, variant: CupedStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """CUPED: Δ_adj = (R_t − R_c) − θ (Rpre_t − Rpre_c), delta method for the ratios.

    For unit-level means (y = py = 1) this is exactly Welch's test on y − θ·x.
    """
    if control.n < 3 or variant.n < 3 or 0 in (control.sum_y, variant.sum_y, control.sum_py, variant.sum_py):
        return _failed("cuped", NAN, NAN, "not_enough_data")
    theta = cuped_theta(control, variant)
    var_c, pvar_c, cov_c = control.ratio_moments()
    var_t, pvar_t, cov_t = variant.ratio_moments()
    adj_c = var_c + theta**2 * pvar_c - 2 * theta * cov_c
    adj_t = var_t + theta**2 * pvar_t - 2 * theta * cov_t
    pooled_pre = (control.sum_px + variant.sum_px) / (control.sum_py + variant.sum_py)
    mc = control.ratio - theta * (control.pre_ratio - pooled_pre)
    mt = variant.ratio - theta * (variant.pre_ratio - pooled_pre)
    diff = (variant.ratio - control.ratio) - theta * (variant.pre_ratio - control.pre_ratio)
    var_diff = adj_c + adj_t
    df = var_diff**2 / (adj_c**2 / (control.n - 1) + adj_t**2 / (variant.n - 1)) if var_diff > 0 else NAN
    # relative to the unadjusted control ratio Rc: Cov(Δ_adj, Rc) = −Var Rc + θ Cov(Rc, Rpre_c)
    unadjusted = var_c + var_t
    return _finish(
        "cuped", control=mc, variant=mt, diff=diff, var_diff=var_diff,
        base=control.ratio, var_base=var_c, cov_diff_base=-var_c + theta * cov_c,
        n_total=control.n + variant.n, df=df, alpha=alpha, sequential=sequential,
        theta=theta, variance_reduction=1 - var_diff / unadjusted if unadjusted > 0 else NAN,
    )


def _unit_moments(c: CupedStats) -> tuple[float, float, float, float, float, float]:
    """(n, Σv, Σv², Σc, Σc², Σvc) of a unit-level CupedStats (y = py = 1)."""
    return c.n, c.sum_x, c.sum_x2, c.sum_px, c.sum_px2, c.sum_x_px


def cuped_mean_test(
    control: CupedStats, variant: CupedStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """CUPED on one value per unit (a per-unit mean or total) against a per-unit covariate.

    θ = Cov(v, c) / Var(c) over both arms pooled (GrowthBook's ``compute_theta``); each arm's
    adjusted variance is Var v + θ² Var c − 2θ Cov(v, c); Welch on the adjusted values. With
    no covariate variance θ = 0 and this is plain Welch.
    """
    mom_c, mom_t = _unit_moments(control), _unit_moments(variant)
    if mom_c[0] < 3 or mom_t[0] < 3:
        return _failed("cuped", NAN, NAN, "not_enough_data")

    def var(n: float, s: float, ss: float) -> float:
        return (ss - s * s / n) / (n - 1)

    n, sv, svv, sc, scc, svc = (a + b for a, b in zip(mom_c, mom_t))
    pre_var = var(n, sc, scc)
    theta = (svc - sv * sc / n) / (n - 1) / pre_var if pre_var > 0 and var(n, sv, svv) > 0 else 0.0
    pooled_pre = sc / n

    def arm(m: tuple[float, float, float, float, float, float]) -> tuple[float, float, float, float, float, float]:
        n, sv, svv, sc, scc, svc = m
        cov = (svc - sv * sc / n) / (n - 1)
        adj = var(n, sv, svv) + theta**2 * var(n, sc, scc) - 2 * theta * cov
        return sv / n, sc / n, max(adj, 0.0) / n, var(n, sv, svv) / n, cov / n, n

    mc, pc, vc, uc, cc, nc = arm(mom_c)
    mt, pt, vt, ut, _, nt = arm(mom_t)
    var_diff = vc + vt
    df = var_diff**2 / (vc**2 / (nc - 1) + vt**2 / (nt - 1)) if var_diff > 0 else NAN
    return _finish(
        "cuped", control=mc - theta * (pc - pooled_pre), variant=mt - theta * (pt - pooled_pre),
        diff=(mt - mc) - theta * (pt - pc), var_diff=var_diff, base=mc, var_base=uc, cov_diff_base=-uc + theta * cc,
        n_total=nc + nt, df=df, alpha=alpha, sequential=sequential,
        theta=theta, variance_reduction=1 - var_diff / (uc + ut) if uc + ut > 0 else NAN,
    )


def quantile_test(
    control: QuantileEstimate, variant: QuantileEstimate, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """Difference of quantiles, each with the variance implied by its order-statistic interval."""
    if control.n < 2 or variant.n < 2 or not (control.se > 0 or variant.se > 0):
        return _failed("quantile", control.estimate, variant.estimate, "not_enough_data")
    vc, vt = control.se**2, variant.se**2
    return _finish(
        "quantile", control=control.estimate, variant=variant.estimate, diff=variant.estimate - control.estimate,
        var_diff=vc + vt, base=control.estimate, var_base=vc, cov_diff_base=-vc, n_total=control.n + variant.n, df=math.inf,
        alpha=alpha, sequential=sequential,
    )


def mean_ci(mean: float, mean_variance: float, *, alpha: float = 0.05) -> tuple[float, float]:
    if not np.isfinite(mean_variance) or mean_variance < 0:
        return NAN, NAN
    hw = _dist.norm_ppf(1 - alpha / 2) * math.sqrt(mean_variance)
    return mean - hw, mean + hw
