import numpy as np
import pytest

from ablab.platform.stats import HistogramStats, quantile_ci, quantile_test
from ablab.platform.stats.quantiles import sample_quantile_ci
from ablab.platform.stats.sufficient import HIST_BUCKETS, histogram_bucket


def test_histogram_quantile_within_bucket_error_of_exact_order_statistics():
    rng = np.random.default_rng(11)
    x = rng.lognormal(6, 0.7, 20_000)
    hist = HistogramStats.from_values(x)
    for p in (0.5, 0.95, 0.99):
        h = quantile_ci(hist, p)
        exact = sample_quantile_ci(x, p)
        assert h.estimate == pytest.approx(exact.estimate, rel=0.0051)
        assert h.lo == pytest.approx(exact.lo, rel=0.0051)
        assert h.hi == pytest.approx(exact.hi, rel=0.0051)
        assert h.lo <= h.estimate <= h.hi
    assert np.quantile(x, 0.95, method="inverted_cdf") == pytest.approx(quantile_ci(hist, 0.95).estimate, rel=0.0051)


def test_histograms_merge_by_addition():
    rng = np.random.default_rng(12)
    x = rng.exponential(100, 5000)
    merged = HistogramStats.from_values(x[:2000]) + HistogramStats.from_values(x[2000:])
    assert np.array_equal(merged.counts, HistogramStats.from_values(x).counts)
    assert merged.n == 5000


def test_zero_and_huge_values_are_clamped_not_lost():
    idx = histogram_bucket(np.array([0.0, -5.0, 1e12, np.nan]))
    assert idx[0] == 0 and idx[1] == 0 and idx[2] == HIST_BUCKETS - 1


def test_design_effect_widens_interval():
    rng = np.random.default_rng(13)
    hist = HistogramStats.from_values(rng.lognormal(5, 0.5, 5000))
    plain, clustered = quantile_ci(hist, 0.95), quantile_ci(hist, 0.95, design_effect=4.0)
    assert (clustered.hi - clustered.lo) > 1.5 * (plain.hi - plain.lo)


def test_quantile_difference_detects_a_shift():
    rng = np.random.default_rng(14)
    c = quantile_ci(HistogramStats.from_values(rng.lognormal(5, 0.5, 5000)), 0.95)
    t = quantile_ci(HistogramStats.from_values(rng.lognormal(5.2, 0.5, 5000)), 0.95)
    res = quantile_test(c, t)
    assert res.p_value < 1e-6 and res.rel_diff == pytest.approx(np.exp(0.2) - 1, abs=0.06)
