"""The engine's numbers agree with scipy/statsmodels computed on the raw data (1e-6)."""

import math

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportions_ztest

from ablab.platform.stats import (
    CupedStats,
    ProportionStats,
    RatioStats,
    SampleStats,
    benjamini_hochberg,
    cuped_test,
    holm,
    proportion_test,
    ratio_test,
    srm_check,
    welch_test,
)

TOL = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(20261202)


def test_welch_matches_scipy(rng):
    a = rng.lognormal(5, 0.4, 800)
    b = rng.lognormal(5.05, 0.5, 650)
    res = welch_test(SampleStats.from_values(a), SampleStats.from_values(b))
    ref = stats.ttest_ind(b, a, equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert res.p_value == pytest.approx(ref.pvalue, abs=TOL)
    assert res.abs_diff == pytest.approx(b.mean() - a.mean(), abs=TOL)
    assert res.abs_ci[0] == pytest.approx(ci.low, abs=TOL)
    assert res.abs_ci[1] == pytest.approx(ci.high, abs=TOL)


def test_sufficient_stats_pool_by_addition(rng):
    a = rng.normal(10, 2, 1000)
    whole = SampleStats.from_values(a)
    parts = SampleStats.from_values(a[:300]) + SampleStats.from_values(a[300:])
    assert parts.mean == pytest.approx(whole.mean, rel=1e-12)
    assert parts.variance == pytest.approx(np.var(a, ddof=1), rel=1e-9)


def test_two_proportion_matches_statsmodels(rng):
    count = np.array([412, 455])
    nobs = np.array([1000, 1010])
    res = proportion_test(ProportionStats(nobs[0], count[0]), ProportionStats(nobs[1], count[1]))
    z, p = proportions_ztest(count[::-1], nobs[::-1])
    assert res.p_value == pytest.approx(p, abs=TOL)
    pc, pt = count / nobs
    se = math.sqrt(pc * (1 - pc) / nobs[0] + pt * (1 - pt) / nobs[1])
    assert res.abs_ci[1] - res.abs_diff == pytest.approx(stats.norm.ppf(0.975) * se, abs=TOL)


def _linearized_reference(x_c, y_c, x_t, y_t):
    """Delta method done the long way: per-unit linearization of each ratio."""

    def ratio_var(x, y):
        r = x.sum() / y.sum()
        lin = (x - r * y) / y.mean()
        return r, lin.var(ddof=1) / x.size

    rc, vc = ratio_var(x_c, y_c)
    rt, vt = ratio_var(x_t, y_t)
    return rc, vc, rt, vt


def test_ratio_delta_method_matches_linearization(rng):
    y_c = rng.poisson(4, 700) + 1
    y_t = rng.poisson(4, 720) + 1
    x_c = rng.gamma(2, 50, 700) * y_c
    x_t = rng.gamma(2, 53, 720) * y_t
    res = ratio_test(RatioStats.from_values(x_c, y_c), RatioStats.from_values(x_t, y_t))
    rc, vc, rt, vt = _linearized_reference(x_c, y_c, x_t, y_t)
    z = (rt - rc) / math.sqrt(vc + vt)
    assert res.abs_diff == pytest.approx(rt - rc, abs=TOL)
    assert res.p_value == pytest.approx(2 * stats.norm.sf(abs(z)), abs=TOL)
    # relative lift: Fieller's interval for rt/rc, the λ the same z-test keeps:
    # (rt − λ rc)² = z² (vt + λ² vc), solved here with numpy's polynomial roots
    z2 = stats.norm.ppf(0.975) ** 2
    lam = np.sort(np.roots([rc**2 - z2 * vc, -2 * rt * rc, rt**2 - z2 * vt]).real)
    assert res.rel_diff == pytest.approx(rt / rc - 1, abs=TOL)
    assert res.rel_ci[0] == pytest.approx(lam[0] - 1, abs=TOL)
    assert res.rel_ci[1] == pytest.approx(lam[1] - 1, abs=TOL)
    # close to the delta method's symmetric interval at this n, wider on the far side
    var_rel = vt / rc**2 + rt**2 * vc / rc**4
    hw = stats.norm.ppf(0.975) * math.sqrt(var_rel)
    assert res.rel_ci[1] - res.rel_ci[0] == pytest.approx(2 * hw, rel=0.05)


def test_ratio_with_one_request_per_unit_is_welch_normal(rng):
    a, b = rng.normal(100, 10, 500), rng.normal(101, 12, 500)
    ones = np.ones(500)
    res = ratio_test(RatioStats.from_values(a, ones), RatioStats.from_values(b, ones))
    z = (b.mean() - a.mean()) / math.sqrt(a.var(ddof=1) / 500 + b.var(ddof=1) / 500)
    assert res.p_value == pytest.approx(2 * stats.norm.sf(abs(z)), abs=TOL)


def test_cuped_is_welch_on_adjusted_values(rng):
    pre_c, pre_t = rng.normal(50, 10, 900), rng.normal(50, 10, 950)
    y_c = 0.8 * pre_c + rng.normal(0, 4, 900)
    y_t = 0.8 * pre_t + rng.normal(1.0, 4, 950)
    res = cuped_test(CupedStats.from_sample(y_c, pre_c), CupedStats.from_sample(y_t, pre_t))
    cov = lambda u, v: np.cov(u, v, ddof=1)[0, 1]
    theta = (cov(y_c, pre_c) / 900 + cov(y_t, pre_t) / 950) / (pre_c.var(ddof=1) / 900 + pre_t.var(ddof=1) / 950)
    ref = stats.ttest_ind(y_t - theta * pre_t, y_c - theta * pre_c, equal_var=False)
    assert res.p_value == pytest.approx(ref.pvalue, abs=TOL)
    ci = ref.confidence_interval(0.95)
    assert res.abs_ci[0] == pytest.approx(ci.low, abs=TOL)
    assert res.abs_ci[1] == pytest.approx(ci.high, abs=TOL)
    plain = welch_test(SampleStats.from_values(y_c), SampleStats.from_values(y_t))
    assert res.se < 0.5 * plain.se  # ρ = 0.89 → variance shrinks by ~1 − ρ²


def test_srm_matches_scipy_chisquare():
    counts = {"control": 5050, "a": 4890, "b": 2600}
    weights = {"control": 0.4, "a": 0.4, "b": 0.2}
    res = srm_check(counts, weights)
    total = sum(counts.values())
    ref = stats.chisquare([5050, 4890, 2600], [total * 0.4, total * 0.4, total * 0.2])
    assert res.p_value == pytest.approx(ref.pvalue, abs=TOL)
    assert res.flagged is False
    assert srm_check({"control": 5000, "a": 4500}, {"control": 1, "a": 1}).flagged is True


def test_holm_and_bh_match_statsmodels(rng):
    p = rng.uniform(0, 0.2, 17).tolist()
    p[3] = 0.0001
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1].tolist(), abs=TOL)
    assert benjamini_hochberg(p) == pytest.approx(multipletests(p, method="fdr_bh")[1].tolist(), abs=TOL)


def test_corrections_skip_missing_values():
    out = holm([0.01, None, 0.04])
    assert math.isnan(out[1])
    assert out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04)


def test_data_problems_are_error_codes_not_exceptions():
    res = welch_test(SampleStats(1, 5, 25), SampleStats(10, 50, 260))
    assert res.error == "not_enough_data" and math.isnan(res.p_value)
    res = welch_test(SampleStats(10, 50, 250), SampleStats(10, 50, 250))
    assert res.error == "zero_variance"


def test_light_distribution_functions_match_scipy_stats():
    from ablab.platform.stats import _dist

    for q in (0.001, 0.025, 0.5, 0.975, 0.999):
        for n, p in ((10, 0.5), (1000, 0.95), (123_457, 0.99), (7, 0.01)):
            assert _dist.binom_ppf(q, n, p) == stats.binom.ppf(q, n, p)
        assert _dist.t_ppf(q, 17.5) == pytest.approx(stats.t.ppf(q, 17.5), abs=1e-9)
    assert _dist.chi2_sf(7.3, 3) == pytest.approx(stats.chi2.sf(7.3, 3), abs=1e-12)


def test_coverage_homogeneity_matches_chi2_contingency():
    from ablab.platform.stats.corrections import homogeneity_test

    labeled, requests = {"a": 200, "b": 260, "c": 240}, {"a": 1000, "b": 1010, "c": 990}
    table = [[200, 260, 240], [800, 750, 750]]
    assert homogeneity_test(labeled, requests) == pytest.approx(
        stats.chi2_contingency(table, correction=False)[1], abs=TOL
    )
