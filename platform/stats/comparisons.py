"""Variant-vs-control comparisons on sufficient statistics.

Every test returns a :class:`Comparison` with the absolute and relative difference,
their intervals and a p-value. ``sequential=None`` gives fixed-horizon inference;
passing a tuning ``n`` gives the always-valid mSPRT version (the engine's default).
Relative lifts use the delta method: Var(t/c − 1) ≈ Var t / c² + t² Var c / c⁴.
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
    rel: float,
    var_rel: float,
    n_total: float,
    df: float,
    alpha: float,
    sequential: float | None,
    p_fixed: float | None = None,
) -> Comparison:
    if not np.isfinite(var_diff) or var_diff <= 0:
        return _failed(method, control, variant, "zero_variance")
    se = math.sqrt(var_diff)
    se_rel = math.sqrt(var_rel) if np.isfinite(var_rel) and var_rel > 0 else NAN
    if sequential is not None:
        hw = confidence_sequence_halfwidth(var_diff, n_total, alpha=alpha, tuning_n=sequential)
        hw_rel = (
            confidence_sequence_halfwidth(var_rel, n_total, alpha=alpha, tuning_n=sequential) if math.isfinite(se_rel) else NAN
        )
        p = msprt_p_value(diff, var_diff, n_total, alpha=alpha, tuning_n=sequential)
        method = f"{method}+msprt"
    else:
        crit = _dist.t_ppf(1 - alpha / 2, df) if np.isfinite(df) else _dist.norm_ppf(1 - alpha / 2)
        hw, hw_rel = crit * se, crit * se_rel
        if p_fixed is not None:
            p = p_fixed
        elif np.isfinite(df):
            p = 2 * _dist.t_sf(abs(diff) / se, df)
        else:
            p = 2 * _dist.norm_sf(abs(diff) / se)
    return Comparison(
        method, control, variant, diff, (diff - hw, diff + hw), rel, (rel - hw_rel, rel + hw_rel), float(p), se
    )


def _relative(mc: float, mt: float, vc: float, vt: float, cov_dc: float = 0.0) -> tuple[float, float]:
    """rel = Δ/mc with Δ = mt − mc: delta-method variance, cov_dc = Cov(Δ, mc) beyond the default."""
    if mc == 0 or not np.isfinite(mc):
        return NAN, NAN
    diff = mt - mc
    var_diff = vt + vc
    cov = -vc + cov_dc
    return diff / mc, var_diff / mc**2 + diff**2 * vc / mc**4 - 2 * diff * cov / mc**3


def welch_test(
    control: SampleStats, variant: SampleStats, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    mc, mt = control.mean, variant.mean
    if control.n < 2 or variant.n < 2:
        return _failed("welch", mc, mt, "not_enough_data")
    vc, vt = control.mean_variance, variant.mean_variance
    var_diff = vc + vt
    df = var_diff**2 / (vc**2 / (control.n - 1) + vt**2 / (variant.n - 1)) if var_diff > 0 else NAN
    rel, var_rel = _relative(mc, mt, vc, vt)
    return _finish(
        "welch", control=mc, variant=mt, diff=mt - mc, var_diff=var_diff, rel=rel, var_rel=var_rel,
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
    rel, var_rel = _relative(mc, mt, vc, vt)
    return _finish(
        "delta", control=mc, variant=mt, diff=mt - mc, var_diff=vc + vt, rel=rel, var_rel=var_rel,
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
    rel, var_rel = _relative(pc, pt, vc, vt)
    return _finish(
        "two_proportion_z", control=pc, variant=pt, diff=pt - pc, var_diff=vc + vt, rel=rel, var_rel=var_rel,
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
    if control.n < 3 or variant.n < 3 or 0 in (control.sums[1], variant.sums[1], control.sums[3], variant.sums[3]):
        return _failed("cuped", NAN, NAN, "not_enough_data")
    theta = cuped_theta(control, variant)
    var_c, pvar_c, cov_c = control.ratio_moments()
    var_t, pvar_t, cov_t = variant.ratio_moments()
    adj_c = var_c + theta**2 * pvar_c - 2 * theta * cov_c
    adj_t = var_t + theta**2 * pvar_t - 2 * theta * cov_t
    pooled_pre = (control.sums[2] + variant.sums[2]) / (control.sums[3] + variant.sums[3])
    mc = control.ratio - theta * (control.pre_ratio - pooled_pre)
    mt = variant.ratio - theta * (variant.pre_ratio - pooled_pre)
    diff = (variant.ratio - control.ratio) - theta * (variant.pre_ratio - control.pre_ratio)
    var_diff = adj_c + adj_t
    df = var_diff**2 / (adj_c**2 / (control.n - 1) + adj_t**2 / (variant.n - 1)) if var_diff > 0 else NAN
    # relative to the unadjusted control ratio Rc: Cov(Δ_adj, Rc) = −Var Rc + θ Cov(Rc, Rpre_c)
    rc = control.ratio
    rel = diff / rc if rc else NAN
    cov_d_rc = -var_c + theta * cov_c
    var_rel = var_diff / rc**2 + diff**2 * var_c / rc**4 - 2 * diff * cov_d_rc / rc**3 if rc else NAN
    return _finish(
        "cuped", control=mc, variant=mt, diff=diff, var_diff=var_diff, rel=rel, var_rel=var_rel,
        n_total=control.n + variant.n, df=df, alpha=alpha, sequential=sequential,
    )


def quantile_test(
    control: QuantileEstimate, variant: QuantileEstimate, *, alpha: float = 0.05, sequential: float | None = None
) -> Comparison:
    """Difference of quantiles, each with the variance implied by its order-statistic interval."""
    if control.n < 2 or variant.n < 2 or not (control.se > 0 or variant.se > 0):
        return _failed("quantile", control.estimate, variant.estimate, "not_enough_data")
    vc, vt = control.se**2, variant.se**2
    rel, var_rel = _relative(control.estimate, variant.estimate, vc, vt)
    return _finish(
        "quantile", control=control.estimate, variant=variant.estimate, diff=variant.estimate - control.estimate,
        var_diff=vc + vt, rel=rel, var_rel=var_rel, n_total=control.n + variant.n, df=math.inf,
        alpha=alpha, sequential=sequential,
    )


def mean_ci(mean: float, mean_variance: float, *, alpha: float = 0.05) -> tuple[float, float]:
    if not np.isfinite(mean_variance) or mean_variance < 0:
        return NAN, NAN
    hw = _dist.norm_ppf(1 - alpha / 2) * math.sqrt(mean_variance)
    return mean - hw, mean + hw
