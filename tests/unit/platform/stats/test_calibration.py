"""Calibration by simulation: error rates and coverage of the engine's tests.

Seeded, vectorized: 1,000 simulated experiments per check, a few seconds in all.
"""

import numpy as np
import pytest
from scipy import stats

from ablab.platform.stats import (
    HistogramStats,
    ProportionStats,
    SampleStats,
    msprt_p_value,
    proportion_test,
    quantile_ci,
    welch_test,
)

SIMS = 1000
ALPHA = 0.05


def _arms(rng, n, effect=0.0):
    # skewed, latency-like data: lognormal around 400 ms
    a = rng.lognormal(np.log(400), 0.5, (SIMS, n))
    b = rng.lognormal(np.log(400), 0.5, (SIMS, n)) + effect
    return a, b


def test_fixed_horizon_aa_false_positive_rate_is_nominal():
    rng = np.random.default_rng(1)
    a, b = _arms(rng, 500)
    rejections = sum(
        welch_test(SampleStats.from_values(a[i]), SampleStats.from_values(b[i])).p_value < ALPHA for i in range(SIMS)
    )
    assert 0.03 <= rejections / SIMS <= 0.07


def test_fixed_horizon_proportion_aa_false_positive_rate_is_nominal():
    rng = np.random.default_rng(2)
    n = 2000
    sc, st = rng.binomial(n, 0.3, SIMS), rng.binomial(n, 0.3, SIMS)
    rejections = sum(proportion_test(ProportionStats(n, c), ProportionStats(n, t)).p_value < ALPHA for c, t in zip(sc, st))
    assert 0.03 <= rejections / SIMS <= 0.07


def _sequential_peeking_fpr(rng, windows, per_window):
    a, b = _arms(rng, windows * per_window)
    # cumulative sufficient statistics after every window, all sims at once
    def cum(x):
        x = x.reshape(SIMS, windows, per_window)
        return x.sum(axis=2).cumsum(axis=1), (x**2).sum(axis=2).cumsum(axis=1)

    (sa, qa), (sb, qb) = cum(a), cum(b)
    n = per_window * np.arange(1, windows + 1)
    var_a = (qa - sa**2 / n) / (n - 1) / n
    var_b = (qb - sb**2 / n) / (n - 1) / n
    p = msprt_p_value(sb / n - sa / n, var_a + var_b, 2 * n, alpha=ALPHA)
    naive = 2 * stats.norm.sf(np.abs(sb / n - sa / n) / np.sqrt(var_a + var_b))
    return (p.min(axis=1) < ALPHA).mean(), (naive.min(axis=1) < ALPHA).mean()


def test_sequential_with_a_look_after_every_window_keeps_the_error_rate():
    rng = np.random.default_rng(3)
    fpr_sequential, fpr_naive = _sequential_peeking_fpr(rng, windows=30, per_window=100)
    assert fpr_sequential <= 0.05
    assert fpr_naive > 0.10  # peeking at fixed-horizon p-values would inflate it: the check has teeth


def test_engine_sequential_p_value_is_the_msprt_one():
    rng = np.random.default_rng(4)
    a, b = rng.normal(0, 1, 400), rng.normal(0.3, 1, 400)
    res = welch_test(SampleStats.from_values(a), SampleStats.from_values(b), sequential=5000.0)
    expected = msprt_p_value(b.mean() - a.mean(), a.var(ddof=1) / 400 + b.var(ddof=1) / 400, 800)
    assert res.method == "welch+msprt"
    assert res.p_value == pytest.approx(expected, rel=1e-9)
    # the confidence sequence and the always-valid p-value agree on significance
    assert (res.p_value < ALPHA) == (res.abs_ci[0] > 0 or res.abs_ci[1] < 0)


def test_ci_coverage_of_a_known_effect():
    rng = np.random.default_rng(5)
    true_effect = 20.0
    a, b = _arms(rng, 500, effect=true_effect)
    covered = 0
    rel_covered = 0
    true_mean = 400 * np.exp(0.5**2 / 2)
    for i in range(SIMS):
        res = welch_test(SampleStats.from_values(a[i]), SampleStats.from_values(b[i]))
        covered += res.abs_ci[0] <= true_effect <= res.abs_ci[1]
        rel_covered += res.rel_ci[0] <= true_effect / true_mean <= res.rel_ci[1]
    assert 0.93 <= covered / SIMS <= 0.97
    assert 0.93 <= rel_covered / SIMS <= 0.97


def test_confidence_sequence_covers_uniformly_over_looks():
    rng = np.random.default_rng(6)
    from ablab.platform.stats import confidence_sequence_halfwidth

    windows, per = 20, 100
    a = rng.normal(0, 1, (SIMS, windows * per)).reshape(SIMS, windows, per)
    means = a.sum(axis=2).cumsum(axis=1) / (per * np.arange(1, windows + 1))
    n = per * np.arange(1, windows + 1)
    hw = confidence_sequence_halfwidth(1.0 / n, n)
    ever_missed = (np.abs(means) > hw).any(axis=1).mean()
    assert ever_missed <= 0.05


def test_p95_interval_covers_the_true_quantile():
    rng = np.random.default_rng(7)
    true_p95 = np.exp(np.log(300) + 0.6 * stats.norm.ppf(0.95))
    x = rng.lognormal(np.log(300), 0.6, (SIMS, 1000))
    covered = 0
    for i in range(SIMS):
        q = quantile_ci(HistogramStats.from_values(x[i]), 0.95)
        covered += q.lo <= true_p95 <= q.hi
    # order-statistic intervals are conservative (≥ nominal), bucketing adds ≤ 0.5 %
    assert 0.93 <= covered / SIMS <= 0.985
