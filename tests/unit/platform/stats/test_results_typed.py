"""What a statistician reads off a row, checked against independent computations: every
comparison's ``se`` is the one its interval and p-value use, and a CUPED row's adjusted arm
estimates are Ȳ − θ(X̄ − X̄ pooled) with θ the pooled OLS slope (statsmodels). Also: the
engine builds the closed models, and the named sufficient statistics refuse to pool
mismatched pieces."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import statsmodels.api as sm
from pydantic import ValidationError
from scipy import stats as sps

from ablab.platform.stats.aggregates import OPTIONAL_COLUMNS, VariantStats, variant_stats_from_units
from ablab.platform.stats.custom_metric import custom_columns
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.result_models import MetricRow, Results
from ablab.platform.stats.sequential import confidence_sequence_halfwidth
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.sufficient import CUPED_PRODUCTS, CupedStats, RatioStats, SampleStats

ALPHA = 0.05
Z = sps.norm.ppf(1 - ALPHA / 2)


def _units(rng: np.random.Generator, n: int, variants: tuple[str, ...] = ("a", "b")) -> dict[str, np.ndarray]:
    """Per-unit rows with every built-in column (and pre-period columns for CUPED)."""
    out: dict[str, list[np.ndarray]] = {"variant": []}
    for i, v in enumerate(variants):
        out["variant"].append(np.full(n, v))
        requests = (rng.poisson(4, n) + 1).astype(float)
        level = rng.gamma(8, 100, n)  # a unit's own latency level, stable across periods
        cols = {c: rng.uniform(0, 1, n) * requests for c in UNIT_COLUMNS if c not in OPTIONAL_COLUMNS}
        cols.update(requests=requests, errors=rng.binomial(requests.astype(int), 0.05 + 0.02 * i).astype(float),
                    labeled=requests, correct=rng.binomial(requests.astype(int), 0.7).astype(float))
        for lat in ("e2e_ms", "ttft_ms", "tpot_ms"):
            cols[f"{lat}_n"] = requests
            cols[f"{lat}_sum"] = (level * (1 + 0.03 * i) + rng.normal(0, 30, n)) * requests
            cols[f"{lat}_sq"] = cols[f"{lat}_sum"] ** 2 / requests
            cols[f"pre_{lat}_n"] = requests
            cols[f"pre_{lat}_sum"] = (level + rng.normal(0, 30, n)) * requests
        for c, values in cols.items():
            out.setdefault(c, []).append(values)
    return {k: np.concatenate(v) for k, v in out.items()}


def _spec(**analysis: object) -> object:
    return parse_spec({
        "key": "se", "control": "a", "unit": "user",
        "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1}],
        "metrics": ["e2e_ms", "error_rate", "accuracy", "cost_per_correct"],
        "analysis": {"sequential": False, "cuped": False, **analysis},
    })


def _treated(result: Results, metric: str) -> MetricRow:
    return next(r for r in result.rows(metric) if r.variant != result.control)


def test_fixed_horizon_normal_rows_have_ci_estimate_pm_z_se_and_the_matching_p_value() -> None:
    rng = np.random.default_rng(1)
    units = _units(rng, 800)
    result = analyze_results(spec=_spec(), stats=variant_stats_from_units(units))
    for metric in ("e2e_ms", "error_rate", "accuracy", "cost_per_correct"):
        row = _treated(result, metric)
        assert row.method == "delta" and row.se is not None and row.se > 0, metric
        assert row.abs_diff is not None and row.p_value is not None
        assert row.abs_ci == pytest.approx([row.abs_diff - Z * row.se, row.abs_diff + Z * row.se], rel=1e-9), metric
        assert row.p_value == pytest.approx(2 * sps.norm.sf(abs(row.abs_diff) / row.se), rel=1e-9), metric
    # the se is the delta-method one, computed here from the unit rows directly
    row = _treated(result, "e2e_ms")

    def ratio_var(x: np.ndarray, y: np.ndarray) -> float:
        r = x.sum() / y.sum()
        return float(np.var(x - r * y, ddof=1) / (len(x) * y.mean() ** 2))

    by = {v: units["variant"] == v for v in ("a", "b")}
    expected = math.sqrt(sum(ratio_var(units["e2e_ms_sum"][m], units["e2e_ms_n"][m]) for m in by.values()))
    assert row.se == pytest.approx(expected, rel=1e-9)
    # control rows compare nothing
    assert all(r.se is None for r in result.metrics if r.variant == "a")


def test_request_randomized_welch_and_proportion_rows_use_their_se() -> None:
    rng = np.random.default_rng(2)
    n = 600
    variant = np.repeat(np.array(["a", "b"]), n)
    latency = np.concatenate([rng.normal(1000, 200, n), rng.normal(1030, 200, n)])
    err = np.concatenate([rng.binomial(1, 0.05, n), rng.binomial(1, 0.08, n)]).astype(float)
    units: dict[str, np.ndarray] = {"variant": variant}
    for c in UNIT_COLUMNS:
        if c not in OPTIONAL_COLUMNS:
            units[c] = np.ones(2 * n)
    units.update(e2e_ms_sum=latency, errors=err)
    spec = replace(_spec(), unit="request", metrics=("e2e_ms", "error_rate"))
    result = analyze_results(spec=spec, stats=variant_stats_from_units(units))

    welch = _treated(result, "e2e_ms")
    a, b = latency[:n], latency[n:]
    t = sps.ttest_ind(b, a, equal_var=False)
    se = math.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
    assert welch.method == "welch" and welch.se == pytest.approx(se, rel=1e-9)
    assert welch.p_value == pytest.approx(t.pvalue, rel=1e-6)  # the p-value is |Δ|/se on Welch's t
    lo, hi = welch.abs_ci
    assert welch.abs_diff is not None and lo is not None and hi is not None
    k = (hi - welch.abs_diff) / welch.se
    assert k == pytest.approx(sps.t.ppf(1 - ALPHA / 2, t.df), rel=1e-6)  # ± t(df)·se

    prop = _treated(result, "error_rate")
    pa, pb = err[:n].mean(), err[n:].mean()
    se = math.sqrt(pa * (1 - pa) / n + pb * (1 - pb) / n)
    assert prop.method == "two_proportion_z" and prop.se == pytest.approx(se, rel=1e-9)
    assert prop.abs_ci == pytest.approx([pb - pa - Z * se, pb - pa + Z * se], rel=1e-9)


def test_sequential_rows_ci_is_the_confidence_sequence_of_se() -> None:
    rng = np.random.default_rng(3)
    units = _units(rng, 500)
    spec = _spec(sequential=True)
    result = analyze_results(spec=spec, stats=variant_stats_from_units(units))
    row = _treated(result, "e2e_ms")
    assert row.method == "delta+msprt" and row.se is not None and row.abs_diff is not None
    hw = float(confidence_sequence_halfwidth(row.se**2, 1000, alpha=ALPHA, tuning_n=spec.tuning_n))
    assert row.abs_ci == pytest.approx([row.abs_diff - hw, row.abs_diff + hw], rel=1e-9)


def test_cuped_rows_carry_each_arms_adjusted_estimate_as_ols_gives_it() -> None:
    spec = parse_spec({
        "key": "cu", "control": "a", "variants": [{"key": "a"}, {"key": "b"}],
        "metrics": {"primary": ["per_user"], "report": ["e2e_ms"], "custom": [
            {"name": "per_user", "type": "mean", "column": "e2e_ms", "aggregation": "unit_mean",
             "cuped": {"covariate": "pre_period"}}]},
        "analysis": {"sequential": False},
    })
    (metric,) = spec.custom
    rng = np.random.default_rng(4)
    units = _units(rng, 700)
    cols = custom_columns(metric)
    y = units["requests"]
    level = units["e2e_ms_sum"] / y
    units[cols["x"]], units[cols["y"]] = units["e2e_ms_sum"], y
    pre_y = np.full(y.size, 2.0)
    units[cols["pre_x"]], units[cols["pre_y"]] = (level * 0.9 + rng.normal(0, 20, y.size)) * pre_y, pre_y
    result = analyze_results(spec=spec, stats=variant_stats_from_units(units, custom=spec.custom))
    row = _treated(result, "per_user")
    assert row.method == "cuped" and row.cuped is not None

    v = units[cols["x"]] / units[cols["y"]]
    c = units[cols["pre_x"]] / units[cols["pre_y"]]
    fit = sm.OLS(v, sm.add_constant(c)).fit()  # θ: the slope of v on the covariate, both arms pooled
    theta = float(fit.params[1])
    arm = {k: units["variant"] == k for k in ("a", "b")}
    adjusted = {k: float(v[m].mean() - theta * (c[m].mean() - c.mean())) for k, m in arm.items()}
    assert row.cuped.theta == pytest.approx(theta, rel=1e-9)
    assert row.cuped.control_adjusted == pytest.approx(adjusted["a"], rel=1e-9)
    assert row.cuped.variant_adjusted == pytest.approx(adjusted["b"], rel=1e-9)
    assert row.estimate_cuped == row.cuped.variant_adjusted
    assert row.abs_diff == pytest.approx(adjusted["b"] - adjusted["a"], rel=1e-9)
    # se: Welch on the adjusted values v − θc, the one the interval and p-value use
    se = math.sqrt(sum(float(np.var(v[m] - theta * c[m], ddof=1)) / m.sum() for m in arm.values()))
    assert row.se == pytest.approx(se, rel=1e-9)
    assert row.cuped.unadjusted is not None and row.cuped.unadjusted.se is not None
    assert row.cuped.unadjusted.se > row.se  # the covariate explains variance

    # a ratio metric (built-in e2e_ms over pre-period columns): the arms' difference is abs_diff
    ratio = _treated(result, "e2e_ms")
    assert ratio.method == "cuped" and ratio.cuped is not None
    assert ratio.cuped.variant_adjusted is not None and ratio.cuped.control_adjusted is not None
    assert ratio.abs_diff == pytest.approx(ratio.cuped.variant_adjusted - ratio.cuped.control_adjusted, rel=1e-9)


def test_the_engine_builds_closed_models_whose_json_reads_back() -> None:
    rng = np.random.default_rng(5)
    stats = variant_stats_from_units(_units(rng, 200))
    spec = _spec()
    built = analyze_results(spec=spec, stats=stats)
    assert isinstance(built, Results) and all(isinstance(r, MetricRow) for r in built.metrics)
    as_json = built.model_dump(mode="json")
    assert Results.model_validate(as_json).model_dump(mode="json") == as_json  # what a client checks it against
    assert as_json["metrics"][0]["power"] is None and _treated(built, "e2e_ms").model_dump(mode="json")["power"]
    assert "shadows" not in as_json and "data_quality" not in as_json  # left out when there are none
    with pytest.raises(ValidationError, match="surprise"):
        Results.model_validate({**as_json, "surprise": 1})
    with pytest.raises(ValidationError, match="surprise"):
        analyze_results(spec=spec, stats=stats, extra={"surprise": 1})
    # NaN is null and numpy numbers are Python ones
    row = MetricRow(metric="m", variant="v", estimate=float("nan"), n=np.int64(3), ci=[np.float64(1.5), math.inf])
    assert row.estimate is None and row.n == 3 and type(row.n) is int and row.ci == [1.5, None]


def test_cuped_stats_are_named_and_add_field_by_field() -> None:
    rng = np.random.default_rng(6)
    x, y, px, py = (rng.uniform(1, 2, 50) for _ in range(4))
    c = CupedStats.from_values(x, y, px, py)
    assert (c.n, c.sum_x, c.sum_py) == (50.0, pytest.approx(x.sum()), pytest.approx(py.sum()))
    assert c.sum_x_px == pytest.approx(float(x @ px)) and c.sum_y_py == pytest.approx(float(y @ py))
    assert len(CUPED_PRODUCTS) == 10  # the symmetric 4×4 products, each once
    m = np.vstack([x, y, px, py])
    assert np.allclose(c.cross, m @ m.T)
    half = CupedStats.from_values(x[:20], y[:20], px[:20], py[:20]) + CupedStats.from_values(x[20:], y[20:], px[20:], py[20:])
    assert np.allclose(np.array(half.cross), np.array(c.cross)) and half.sum_x == pytest.approx(c.sum_x)
    scaled = c.scaled(1000.0)
    assert scaled.sum_x == pytest.approx(1000 * c.sum_x) and scaled.sum_x2 == pytest.approx(1e6 * c.sum_x2)
    assert scaled.sum_y == c.sum_y and scaled.sum_x_px == pytest.approx(1000 * c.sum_x_px)
    with pytest.raises(TypeError):
        c + SampleStats(1.0, 2.0, 4.0)  # type: ignore[operator]  # the refusal is what is tested


def test_variant_stats_refuse_to_pool_mismatched_statistics() -> None:
    one = VariantStats(10.0, {"e2e_ms": RatioStats(10, 5, 5, 10, 10, 5)}, samples={"judge": SampleStats(10, 5, 3)})
    pooled = one + one
    assert pooled.units == 20 and pooled.ratios["e2e_ms"].sum_x == 10 and pooled.samples["judge"].n == 20
    other = VariantStats(10.0, {"e2e_ms": RatioStats(10, 5, 5, 10, 10, 5)})  # no "judge" sample
    with pytest.raises(ValueError, match=r"samples: keys differ \(\['judge'\]"):
        one + other
    with pytest.raises(ValueError, match="ratios"):
        one + VariantStats(10.0, {"ttft_ms": RatioStats()}, samples={"judge": SampleStats()})


def test_attribution_is_built_as_the_closed_models_too() -> None:
    from ablab.platform.stats.attribution import attribution_results
    from ablab.platform.stats.result_models import Attribution

    rng = np.random.default_rng(7)
    stats = variant_stats_from_units(_units(rng, 300))
    spec = _spec()
    built = attribution_results(spec=spec, stats=stats)
    assert isinstance(built, Attribution) and {p.variant for p in built.pareto.points} == {"a", "b"}
    as_json = built.model_dump(mode="json")
    assert Attribution.model_validate(as_json).model_dump(mode="json") == as_json
    # a Pareto point's objectives are its open keys, JSON-ready like every other number
    assert all(isinstance((p.model_extra or {}).get("e2e_ms"), float) for p in built.pareto.points)
