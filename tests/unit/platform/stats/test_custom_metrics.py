"""Experiment-defined metrics agree with scipy / statsmodels / gbstats to 1e-6 (must-show, #18).

Per-unit rows are generated here in the shape the per-unit aggregation emits
(``custom_columns``), go through ``variant_stats_from_units`` and the engine, and are
checked against the reference computed on the raw per-unit arrays.
"""

import math

import numpy as np
import pytest
from gbstats.frequentist.tests import FrequentistConfig, TwoSidedTTest
from gbstats.models.statistics import (
    RatioStatistic,
    RegressionAdjustedStatistic,
    SampleMeanStatistic,
)
from scipy import stats as sps

from ablab.platform.stats.aggregates import variant_stats_from_units
from ablab.platform.stats.custom_metric import custom_columns
from ablab.platform.stats.engine import analyze_results, compare_metric
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.sufficient import HistogramStats

TOL = 1e-6
N = {"control": 1500, "treat": 1400}


def make_spec(custom, *, unit="user", sequential=False, **analysis):
    return parse_spec({
        "key": "k", "unit": unit, "variants": [{"key": "control"}, {"key": "treat"}],
        "metrics": {"custom": custom, "report": ["e2e_ms"]},
        "analysis": {"sequential": sequential, **analysis},
    })


def units_frame(spec, data):
    """data: variant → {metric name → {role → per-unit array}}; built-in columns zero."""
    out = {"variant": []}
    cols = {c: [] for c in UNIT_COLUMNS}
    for m in spec.custom:
        for col in custom_columns(m).values():
            cols[col] = []
    for variant, per_metric in data.items():
        n = N[variant]
        out["variant"] += [variant] * n
        for c in UNIT_COLUMNS:
            cols[c].append(np.zeros(n))
        for m in spec.custom:
            for role, col in custom_columns(m).items():
                cols[col].append(np.asarray(per_metric[m.name][role], dtype=float))
    return {"variant": np.array(out["variant"]), **{k: np.concatenate(v) for k, v in cols.items()}}


@pytest.fixture
def rng():
    return np.random.default_rng(18_2026)


def _requests(rng, n, rate=3.0):
    return rng.poisson(rate, n)


def _unit_sums(rng, reqs, mean, sd):
    """Σ value and Σ value² over each unit's requests (a per-unit mean shifts the values)."""
    unit_mean = rng.normal(mean, sd, reqs.size)
    x = np.array([rng.normal(mu, sd / 2, k).sum() for mu, k in zip(unit_mean, reqs)])
    sq = np.array([(rng.normal(mu, sd / 2, k) ** 2).sum() for mu, k in zip(unit_mean, reqs)])
    return x, reqs.astype(float), sq


def _stats(spec, data, **kw):
    return variant_stats_from_units(units_frame(spec, data), custom=spec.custom, **kw)


def _compare(spec, name, vs):
    return compare_metric(spec, spec.metric_def(name), vs["control"], vs["treat"])


def test_unit_mean_is_welch_over_per_unit_means(rng):
    spec = make_spec([{"name": "per_user", "type": "mean", "column": "measures.x", "aggregation": "unit_mean"}])
    data = {}
    for v, mu in (("control", 10.0), ("treat", 10.4)):
        x, y, _ = _unit_sums(rng, _requests(rng, N[v]), mu, 3.0)
        data[v] = {"per_user": {"x": x, "y": y}}
    c = _compare(spec, "per_user", _stats(spec, data))
    means = {v: data[v]["per_user"]["x"][data[v]["per_user"]["y"] > 0] / data[v]["per_user"]["y"][data[v]["per_user"]["y"] > 0] for v in data}
    ref = sps.ttest_ind(means["treat"], means["control"], equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert c.method == "welch"
    assert c.abs_diff == pytest.approx(means["treat"].mean() - means["control"].mean(), abs=TOL)
    assert c.p_value == pytest.approx(ref.pvalue, abs=TOL)
    assert c.abs_ci == pytest.approx((ci.low, ci.high), abs=TOL)


def test_unit_sum_is_welch_over_per_unit_totals_of_every_unit(rng):
    spec = make_spec([{"name": "tool_calls", "type": "mean", "column": "measures.tool_calls", "aggregation": "unit_sum"}])
    data = {}
    for v, lam in (("control", 1.0), ("treat", 1.1)):
        y = _requests(rng, N[v]).astype(float)
        data[v] = {"tool_calls": {"x": rng.poisson(lam * y), "y": y}}  # units without requests count as 0
    c = _compare(spec, "tool_calls", _stats(spec, data))
    ref = sps.ttest_ind(data["treat"]["tool_calls"]["x"], data["control"]["tool_calls"]["x"], equal_var=False)
    assert c.p_value == pytest.approx(ref.pvalue, abs=TOL)
    assert c.abs_ci == pytest.approx(tuple(ref.confidence_interval(0.95)), abs=TOL)


def _gb_ratio(x, y, k=1.0):
    x = k * np.asarray(x, float)
    y = np.asarray(y, float)
    return RatioStatistic(
        n=x.size, m_statistic=SampleMeanStatistic(n=x.size, sum=x.sum(), sum_squares=(x * x).sum()),
        d_statistic=SampleMeanStatistic(n=y.size, sum=y.sum(), sum_squares=(y * y).sum()),
        m_d_sum_of_products=(x * y).sum(),
    )


@pytest.mark.parametrize("kind", ["mean", "ratio", "proportion"])
def test_request_level_metrics_match_gbstats_ratio_statistic(rng, kind):
    if kind == "ratio":
        m = {"name": "m", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000}
    elif kind == "proportion":
        m = {"name": "m", "type": "proportion", "column": "measures.thumbs_up"}
    else:
        m = {"name": "m", "type": "mean", "column": "score"}
    spec = make_spec([m])
    k = 1000.0 if kind == "ratio" else 1.0
    data = {}
    for v, lift in (("control", 1.0), ("treat", 1.04)):
        y = (_requests(rng, N[v]) + (kind == "ratio")).astype(float)
        if kind == "ratio":
            y = y * rng.integers(50, 400, y.size)  # output tokens
            x = y * rng.gamma(4, 0.5e-5 * lift, y.size)
        elif kind == "proportion":
            x = rng.binomial(y.astype(int), 0.3 * lift).astype(float)
        else:
            x = rng.gamma(3, 2 * lift, y.size) * y
        data[v] = {"m": {"x": x, "y": y}}
    c = _compare(spec, "m", _stats(spec, data))
    a, b = (_gb_ratio(data[v]["m"]["x"], data[v]["m"]["y"], k) for v in ("control", "treat"))
    gb = TwoSidedTTest(a, b, FrequentistConfig(difference_type="absolute"))
    assert c.method == "delta"
    assert c.control == pytest.approx(a.mean, abs=TOL) and c.variant == pytest.approx(b.mean, abs=TOL)
    assert c.abs_diff == pytest.approx(gb.point_estimate, abs=TOL)
    assert c.se**2 == pytest.approx(gb.variance, rel=TOL)
    # the engine reads the delta-method ratio as normal (units are many); gbstats uses a t
    assert c.p_value == pytest.approx(2 * sps.norm.sf(abs(gb.point_estimate) / math.sqrt(gb.variance)), abs=TOL)
    assert c.p_value == pytest.approx(gb.compute_result().p_value, abs=1e-3)
    rel = TwoSidedTTest(a, b, FrequentistConfig(difference_type="relative"))
    assert c.rel_diff == pytest.approx(rel.point_estimate, abs=TOL)


def test_request_randomized_proportion_is_the_two_proportion_z_test(rng):
    from statsmodels.stats.proportion import proportions_ztest

    spec = make_spec([{"name": "m", "type": "proportion", "column": "error"}], unit="request")
    data = {v: {"m": {"x": rng.binomial(1, p, N[v]), "y": np.ones(N[v])}} for v, p in (("control", 0.1), ("treat", 0.13))}
    c = _compare(spec, "m", _stats(spec, data))
    counts = np.array([data["treat"]["m"]["x"].sum(), data["control"]["m"]["x"].sum()])
    _, p = proportions_ztest(counts, np.array([N["treat"], N["control"]]))
    assert c.method == "two_proportion_z" and c.p_value == pytest.approx(p, abs=TOL)


def _gb_ra(post, pre):
    post, pre = np.asarray(post, float), np.asarray(pre, float)
    return RegressionAdjustedStatistic(
        n=post.size, post_statistic=SampleMeanStatistic(n=post.size, sum=post.sum(), sum_squares=(post**2).sum()),
        pre_statistic=SampleMeanStatistic(n=pre.size, sum=pre.sum(), sum_squares=(pre**2).sum()),
        post_pre_sum_of_products=(post * pre).sum(), theta=0,
    )


@pytest.mark.parametrize("aggregation, covariate", [("unit_mean", "pre_period"), ("unit_sum", "pre_period"), ("unit_mean", "e2e_ms")])
def test_unit_level_cuped_matches_gbstats_regression_adjustment(rng, aggregation, covariate):
    spec = make_spec([{"name": "m", "type": "mean", "column": "score", "aggregation": aggregation, "cuped": {"covariate": covariate}}])
    roles = ("pre_x", "pre_y") if covariate == "pre_period" else ("cov_x", "cov_y")
    data, values = {}, {}
    for v, shift in (("control", 0.0), ("treat", 0.3)):
        y = (_requests(rng, N[v]) + 1).astype(float)
        py = (_requests(rng, N[v]) + 1).astype(float)
        level = rng.normal(5, 2, N[v])
        pre_mean = level + rng.normal(0, 0.7, N[v])
        post_mean = 0.9 * level + shift + rng.normal(0, 0.7, N[v])
        x, px = post_mean * y, pre_mean * py
        data[v] = {"m": {"x": x, "y": y, roles[0]: px, roles[1]: py}}
        values[v] = (x / y, px / py) if aggregation == "unit_mean" else (x, px)
    vs = _stats(spec, data)
    c = _compare(spec, "m", vs)
    a, b = _gb_ra(*values["control"]), _gb_ra(*values["treat"])
    gb = TwoSidedTTest(a, b, FrequentistConfig(difference_type="absolute"))  # sets the pooled θ
    res = gb.compute_result()
    assert c.method == "cuped"
    assert c.theta == pytest.approx(a.theta, abs=TOL)
    assert c.abs_diff == pytest.approx(gb.point_estimate, abs=TOL)
    assert c.se**2 == pytest.approx(gb.variance, rel=TOL)
    assert c.p_value == pytest.approx(res.p_value, abs=TOL)
    assert c.abs_ci == pytest.approx(tuple(res.ci), abs=TOL)
    plain = TwoSidedTTest(a.post_statistic, b.post_statistic, FrequentistConfig(difference_type="absolute"))
    assert c.variance_reduction == pytest.approx(1 - gb.variance / plain.variance, abs=TOL)
    # the covariate explains much of the unit-to-unit spread (less of a total, which request counts drive)
    assert c.variance_reduction > (0.3 if aggregation == "unit_mean" else 0.05)

    # the engine reports all of it, and the unadjusted comparison beside
    out = analyze_results(spec=spec, stats=vs).model_dump(mode="json")
    row = next(r for r in out["metrics"] if r["metric"] == "m" and r["variant"] == "treat")
    assert row["cuped"]["covariate"] == covariate
    assert row["cuped"]["theta"] == pytest.approx(a.theta, abs=TOL)
    assert row["cuped"]["unadjusted"]["abs_diff"] == pytest.approx(plain.point_estimate, abs=TOL)
    assert row["cuped"]["unadjusted"]["p_value"] == pytest.approx(plain.compute_result().p_value, abs=TOL)
    assert row["aggregation"] == aggregation and row["custom"] is True and row["type"] == "mean"


def test_request_level_cuped_reports_theta_and_reduction(rng):
    spec = make_spec([{"name": "m", "type": "mean", "column": "score", "cuped": {"covariate": "pre_period"}}])
    data = {}
    for v, shift in (("control", 0.0), ("treat", 0.2)):
        y, py = (_requests(rng, N[v]) + 1).astype(float), (_requests(rng, N[v]) + 1).astype(float)
        level = rng.normal(5, 2, N[v])
        data[v] = {"m": {"x": (level + shift + rng.normal(0, 0.5, N[v])) * y, "y": y, "pre_x": level * py, "pre_y": py}}
    c = _compare(spec, "m", _stats(spec, data))
    assert c.method == "cuped" and c.theta > 0.5 and 0.5 < c.variance_reduction < 1


def test_quantile_from_the_histogram_within_the_sketch_accuracy(rng):
    spec = make_spec([{"name": "ttft_p90", "type": "quantile", "column": "ttft_ms", "quantile": 0.9}])
    data, hists, raw = {}, {}, {}
    for v, scale in (("control", 200.0), ("treat", 220.0)):
        reqs = _requests(rng, N[v]) + 1
        user = rng.lognormal(0, 0.5, N[v])  # users differ: requests cluster
        vals = [rng.gamma(2, scale * u / 2, k) for u, k in zip(user, reqs)]
        raw[v] = np.concatenate(vals)
        data[v] = {"ttft_p90": {"x": [a.sum() for a in vals], "y": reqs, "sq": [(a * a).sum() for a in vals]}}
        hists[v] = {"ttft_p90": HistogramStats.from_values(raw[v])}
    vs = _stats(spec, data, histograms=hists)
    out = analyze_results(spec=spec, stats=vs).model_dump(mode="json")
    for v in N:
        row = next(r for r in out["metrics"] if r["metric"] == "ttft_p90" and r["variant"] == v)
        exact = np.quantile(raw[v], 0.9, method="inverted_cdf")
        assert row["estimate"] == pytest.approx(exact, rel=0.005)  # 1 % log buckets: ±0.5 %
        assert row["type"] == "quantile"
    # the design effect from Σ value² widens the interval for clustered requests
    assert vs["treat"].design_effect("ttft_p90") > 1.2
    treat = next(r for r in out["metrics"] if r["metric"] == "ttft_p90" and r["variant"] == "treat")
    assert treat["method"] == "quantile" and treat["p_value"] is not None
