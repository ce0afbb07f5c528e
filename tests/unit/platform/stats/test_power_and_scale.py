"""Power against statsmodels; one scale per test (relative CI excludes 0 ⇔ p < α)."""

import math

import numpy as np
import pytest
from statsmodels.stats.power import NormalIndPower, TTestIndPower

from ablab.platform.stats.comparisons import (
    cuped_mean_test,
    cuped_test,
    proportion_test,
    quantile_test,
    ratio_test,
    welch_test,
)
from ablab.platform.stats.power import n_per_variant, power_row
from ablab.platform.stats.quantiles import quantile_ci
from ablab.platform.stats.sufficient import CupedStats, HistogramStats, ProportionStats, RatioStats, SampleStats


@pytest.mark.parametrize("alpha, mde, sd_c, sd_t", [(0.05, 0.05, 3.0, 3.5), (0.01, 0.02, 10.0, 10.0), (0.1, 0.02, 1.0, 0.5)])
def test_n_per_variant_matches_statsmodels(alpha, mde, sd_c, sd_t):
    mean_c = 20.0
    delta = mde * mean_c
    n = n_per_variant(sd_c**2, sd_t**2, delta, alpha=alpha)
    effect = delta / math.sqrt((sd_c**2 + sd_t**2) / 2)  # Cohen's d on the pooled sd
    ref = NormalIndPower().solve_power(effect_size=effect, alpha=alpha, power=0.8, ratio=1.0)
    assert n == pytest.approx(ref, rel=1e-6)
    if ref > 50:
        assert n == pytest.approx(TTestIndPower().solve_power(effect_size=effect, alpha=alpha, power=0.8), rel=0.02)


def test_power_row_reads_the_observed_variance_and_projects_time():
    # arms: (estimate, variance of the estimate, units): per-unit variance = var × units
    row = power_row(mde_rel=0.01, alpha=0.05, control=(20.0, 9.0 / 1000, 1000), variant=(21.0, 12.25 / 800, 800),
                    rates=(2.0, 1.6))
    expect = n_per_variant(9.0, 12.25, 0.2)
    assert row["n_needed"] == math.ceil(expect) > 1000 and row["n"] == 800 and row["mde_rel"] == 0.01
    assert row["seconds_to_decision"] == pytest.approx(max((math.ceil(expect) - 1000) / 2.0, (math.ceil(expect) - 800) / 1.6))
    assert power_row(mde_rel=0.01, alpha=0.05, control=(20.0, 9.0 / 1000, 1000), variant=(21.0, 12.25 / 800, 800))[
        "seconds_to_decision"] is None  # rate unknown
    done = power_row(mde_rel=0.5, alpha=0.05, control=(20.0, 9.0 / 1000, 1000), variant=(21.0, 9.0 / 1000, 1000))
    assert done["seconds_to_decision"] == 0.0
    assert power_row(mde_rel=0.05, alpha=0.05, control=(0.0, 1.0, 10), variant=(1.0, 1.0, 10))["n_needed"] is None


def _excludes_zero(ci):
    lo, hi = ci
    return lo > 0 or hi < 0


def _comparisons(rng, sequential):
    kw = {"alpha": 0.05, "sequential": sequential}
    n = int(rng.integers(40, 400))
    shift = rng.normal(0, 0.25 if sequential is None else 0.6)
    a, b = rng.normal(5, 2, n), rng.normal(5 + shift, 2.2, n + 7)
    yield welch_test(SampleStats.from_values(a), SampleStats.from_values(b), **kw)
    ya, yb = rng.poisson(3, n) + 1, rng.poisson(3, n + 7) + 1
    yield ratio_test(RatioStats.from_values(a * ya, ya), RatioStats.from_values(b * yb, yb), **kw)
    pa, pb = rng.uniform(0.05, 0.5), None
    pb = min(max(pa + rng.normal(0, 0.05), 0.01), 0.99)
    if sequential is not None:  # the fixed-horizon z-test's p uses the pooled variance (a score test)
        yield proportion_test(ProportionStats(n, rng.binomial(n, pa)), ProportionStats(n, rng.binomial(n, pb)), **kw)
    pre_a, pre_b = a + rng.normal(0, 1, n), b + rng.normal(0, 1, n + 7)
    yield cuped_mean_test(CupedStats.from_sample(a, pre_a), CupedStats.from_sample(b, pre_b), **kw)
    yield cuped_test(CupedStats.from_values(a * ya, ya, pre_a * ya, ya), CupedStats.from_values(b * yb, yb, pre_b * yb, yb), **kw)
    qa = quantile_ci(HistogramStats.from_values(np.exp(a / 3)), 0.9)
    qb = quantile_ci(HistogramStats.from_values(np.exp(b / 3)), 0.9)
    yield quantile_test(qa, qb, **kw)


@pytest.mark.parametrize("sequential", [None, 5000.0])
def test_relative_ci_excludes_zero_iff_p_below_alpha(sequential):
    rng = np.random.default_rng(4)
    seen = {True: 0, False: 0}
    for _ in range(150):
        for c in _comparisons(rng, sequential):
            if not c.ok or not all(map(math.isfinite, c.rel_ci)):
                continue
            significant = c.p_value < 0.05
            assert _excludes_zero(c.rel_ci) == significant, c
            assert _excludes_zero(c.abs_ci) == significant, c
            seen[significant] += 1
    assert seen[True] > 30 and seen[False] > 30  # both sides of the boundary were exercised
