import itertools
import math

import numpy as np
import pytest

from ablab.platform.stats.attribution import attribution_results, factorial_analysis, pareto_frontier
from ablab.platform.stats.offline import aggregate_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events


def test_pareto_frontier_minimizes_latency_and_cost_maximizes_accuracy():
    points = {
        "control": {"e2e_ms": 900, "cost_usd": 1.0, "accuracy": 0.80},
        "fast": {"e2e_ms": 600, "cost_usd": 0.9, "accuracy": 0.78},
        "accurate": {"e2e_ms": 950, "cost_usd": 1.2, "accuracy": 0.86},
        "worse": {"e2e_ms": 950, "cost_usd": 1.1, "accuracy": 0.79},
    }
    out = {p["variant"]: p for p in pareto_frontier(points)}
    assert {v for v, p in out.items() if p["on_frontier"]} == {"control", "fast", "accurate"}
    assert out["worse"]["dominated_by"] == ["control"]


def _cells(k):
    return [dict(zip([f"f{i}" for i in range(k)], bits)) for bits in itertools.product([0, 1], repeat=k)]


def test_factorial_recovers_a_known_interaction_and_shapley_sums_to_total():
    rng = np.random.default_rng(0)
    main = {"f0": -80.0, "f1": -40.0, "f2": 10.0}
    interaction = 30.0  # f0 × f1 together save less than the sum
    cells = _cells(3)
    levels = {("v" + "".join(map(str, c.values()))): c for c in cells}
    truth = {v: 900 + sum(main[f] * lv for f, lv in c.items()) + interaction * c["f0"] * c["f1"] for v, c in levels.items()}
    se = 5.0
    recovered, inter_est, f0_est = [], [], []
    for _ in range(200):  # coverage of the interaction's interval by simulation
        est = {v: truth[v] + rng.normal(0, se) for v in levels}
        res = factorial_analysis(levels=levels, estimates=est, variances={v: se**2 for v in levels},
                                 control="v000", lower_is_better=True)
        effects = {e["term"]: e for e in res["effects"]}
        lo, hi = effects["f0=1 × f1=1"]["ci"]
        recovered.append(lo <= interaction <= hi)
        inter_est.append(effects["f0=1 × f1=1"]["estimate"])
        f0_est.append(effects["f0=1"]["estimate"])
        shap = res["shapley"]
        assert shap["sum_of_shares"] == pytest.approx(shap["total"]["estimate"], abs=1e-9)
        assert shap["total"]["estimate"] == pytest.approx(est[shap["best_variant"]] - est["v000"], abs=1e-9)
    assert res["design"] == "saturated"
    # the contrast of 4 cells has sd 2·se; averaged over 200 runs it is unbiased
    assert np.mean(inter_est) == pytest.approx(interaction, abs=3.0)
    assert np.mean(f0_est) == pytest.approx(main["f0"], abs=3.0)
    assert 0.90 <= np.mean(recovered) <= 0.99


def test_shapley_splits_an_interaction_evenly_between_its_factors():
    levels = {"c": {"a": 0, "b": 0}, "a": {"a": 1, "b": 0}, "b": {"a": 0, "b": 1}, "ab": {"a": 1, "b": 1}}
    est = {"c": 100.0, "a": 80.0, "b": 90.0, "ab": 50.0}  # interaction −20
    res = factorial_analysis(levels=levels, estimates=est, variances=dict.fromkeys(est, 1.0), control="c", lower_is_better=True)
    shares = {s["factor"]: s["estimate"] for s in res["shapley"]["shares"]}
    assert shares == pytest.approx({"a": -20 - 10, "b": -10 - 10})
    assert sum(shares.values()) == pytest.approx(-50.0)


def test_partial_design_uses_main_effects_and_still_sums_exactly():
    levels = {"c": {"a": 0, "b": 0}, "a": {"a": 1, "b": 0}, "ab": {"a": 1, "b": 1}}
    est = {"c": 100.0, "a": 80.0, "ab": 65.0}
    res = factorial_analysis(levels=levels, estimates=est, variances=dict.fromkeys(est, 1.0), control="c", lower_is_better=True)
    assert res["shapley"]["sum_of_shares"] == pytest.approx(-35.0, abs=1e-12)
    assert {e["term"] for e in res["effects"]} == {"a=1", "b=1"}


def test_attribute_on_events_from_strategies():
    variants = {
        "control": VariantEffect(weight=1, strategy={}),
        "int8": VariantEffect(weight=1, latency=0.8, strategy={"precision": "int8"}),
        "sparse": VariantEffect(weight=1, latency=0.9, strategy={"sparse_ffn_k": 32}),
        "both": VariantEffect(weight=1, latency=0.72, accuracy=0.78, strategy={"precision": "int8", "sparse_ffn_k": 32}),
    }
    ev = synthetic_events(n_requests=40_000, n_units=4_000, variants=variants, seed=1)
    spec = parse_spec(spec_dict(variants))
    out = attribution_results(spec=spec, stats=aggregate_events(ev, spec).stats).model_dump(mode="json")
    assert out["factors"]["both"] == {"precision": "int8", "sparse_ffn_k": 32}
    e2e = out["factorial"]["e2e_ms"]
    assert e2e["shapley"]["best_variant"] == "both"
    assert math.isclose(e2e["shapley"]["sum_of_shares"], e2e["shapley"]["total"]["estimate"], abs_tol=1e-9)
    assert {p["variant"] for p in out["pareto"]["points"] if p["on_frontier"]} >= {"both"}
