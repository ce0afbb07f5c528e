"""Custom metrics as primary metrics, guardrails, in decisions, the Pareto frontier and attribution."""

import numpy as np
import pytest

from ablab.platform.stats.aggregates import variant_stats_from_units
from ablab.platform.stats.attribution import attribution_results
from ablab.platform.stats.custom_metric import custom_columns
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.render import flat_rows, rich_tables
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.sufficient import HistogramStats
from ablab_testing.metrics import CONTRACT_CUSTOM_METRICS

VARIANTS = [
    {"key": "control", "strategy": {"model": "small"}},
    {"key": "big", "strategy": {"model": "large"}},
]
SPEC = {
    "key": "k",
    "variants": VARIANTS,
    "metrics": {
        "primary": ["judge_score"],
        "custom": [dict(m) for m in CONTRACT_CUSTOM_METRICS],
        "report": ["e2e_ms", "accuracy"],
    },
    "guardrails": [{"metric": "cost_per_1k_out", "margin": 0.5, "relative": True}],
    "analysis": {"mde": {"judge_score": 0.02}, "sequential": False},
}


def _units(rng, spec, n=2000, judge_lift=0.1):
    cols = {c: [] for c in UNIT_COLUMNS}
    for m in spec.custom:
        for c in custom_columns(m).values():
            cols[c] = []
    variants, hists = [], {}
    for v, lift in (("control", 0.0), ("big", judge_lift)):
        variants += [v] * n
        y = (rng.poisson(3, n) + 1).astype(float)
        for c in UNIT_COLUMNS:
            cols[c].append(y if c == "requests" else np.zeros(n))
        g = {}
        g["judge_score"] = {"x": rng.normal(0.6 + lift, 0.2, n) * y, "y": y}
        level = rng.normal(900, 150, n)
        g["e2e_per_user"] = {"x": (level + rng.normal(0, 40, n)) * y, "y": y, "pre_x": level * 2, "pre_y": np.full(n, 2.0)}
        tokens = y * rng.integers(100, 300, n)
        g["cost_per_1k_out"] = {"x": tokens * rng.gamma(5, 2e-6 * (1 + lift), n), "y": tokens}
        ttft = rng.gamma(3, 60, int(y.sum()))
        splits = np.split(ttft, np.cumsum(y.astype(int))[:-1])
        g["ttft_p90"] = {"x": [s.sum() for s in splits], "y": y, "sq": [(s * s).sum() for s in splits]}
        hists[v] = {"ttft_p90": HistogramStats.from_values(ttft)}
        g["tool_calls"] = {"x": rng.poisson(y), "y": y}
        for m in spec.custom:
            for role, c in custom_columns(m).items():
                cols[c].append(np.asarray(g[m.name][role], dtype=float))
    frame = {"variant": np.array(variants), **{k: np.concatenate(v) for k, v in cols.items()}}
    return variant_stats_from_units(frame, custom=spec.custom, histograms=hists, durations={"control": 600.0, "big": 600.0})


def test_custom_primary_metric_decides_and_custom_guardrail_evaluates():
    spec = parse_spec(SPEC)
    out = analyze_results(spec=spec, stats=_units(np.random.default_rng(1), spec)).model_dump(mode="json")
    rows = {(r["metric"], r["variant"]): r for r in out["metrics"]}
    assert {"judge_score", "e2e_per_user", "cost_per_1k_out", "ttft_p90", "tool_calls", "e2e_ms"} <= {m for m, _ in rows}
    judge = rows[("judge_score", "big")]
    assert judge["custom"] and judge["type"] == "mean" and judge["aggregation"] == "request" and judge["cuped"] is None
    assert judge["power"]["mde_rel"] == 0.02 and judge["power"]["n_needed"] > 0 and judge["power"]["n"] == 2000
    assert rows[("e2e_ms", "big")]["custom"] is False and rows[("e2e_ms", "big")]["power"]["mde_rel"] == 0.05
    assert rows[("judge_score", "control")].get("power") is None
    assert rows[("e2e_per_user", "big")]["cuped"]["covariate"] == "pre_period"
    assert rows[("e2e_per_user", "big")]["cuped"]["variance_reduction"] > 0.5
    assert rows[("cost_per_1k_out", "big")]["estimate"] == pytest.approx(1000 * 5 * 2e-6 * 1.1, rel=0.05)  # scaled
    assert rows[("ttft_p90", "big")]["lower_is_better"] and not rows[("tool_calls", "big")]["lower_is_better"]
    [decision] = out["decisions"]
    assert decision["decision"] == "ship" and "judge_score better" in decision["reasons"][0]
    [g] = out["guardrails"]
    assert g["metric"] == "cost_per_1k_out" and g["status"] == "pass"  # +10 % cost within a 50 % margin
    strict = parse_spec({**SPEC, "guardrails": [{"metric": "cost_per_1k_out", "margin": 0.01, "relative": True}]})
    out = analyze_results(spec=strict, stats=_units(np.random.default_rng(1), strict)).model_dump(mode="json")
    assert out["guardrails"][0]["status"] == "fail" and out["decisions"][0]["decision"] == "no_ship"
    assert any(r["metric"] == "judge_score" for r in flat_rows(out))
    assert len(rich_tables(out)) >= 3


def test_custom_metrics_in_attribution_and_the_pareto_frontier():
    spec = parse_spec(SPEC)
    stats = _units(np.random.default_rng(2), spec)
    levels = {"control": {"model": "small"}, "big": {"model": "large"}}
    out = attribution_results(spec=spec, stats=stats, levels=levels, objectives=["judge_score", "cost_per_1k_out"]).model_dump(mode="json")
    assert out["pareto"]["objectives"] == {"judge_score": "max", "cost_per_1k_out": "min"}
    points = {p["variant"]: p for p in out["pareto"]["points"]}
    assert points["big"]["judge_score"] > points["control"]["judge_score"]
    assert points["big"]["on_frontier"] and points["control"]["on_frontier"]  # better judge, but dearer
    assert "judge_score" in out["factorial"]  # a custom primary metric is attributed by default
    effect = out["factorial"]["judge_score"]["effects"][0]
    assert effect["estimate"] == pytest.approx(0.1, abs=0.02)


def test_power_uses_the_cuped_adjusted_variance():
    spec = parse_spec(SPEC)
    plain = parse_spec({**SPEC, "analysis": {**SPEC["analysis"], "cuped": False}})
    stats = _units(np.random.default_rng(4), spec)

    def needed(s):
        out = analyze_results(spec=s, stats=stats).model_dump(mode="json")
        return next(r for r in out["metrics"] if r["metric"] == "e2e_per_user" and r["variant"] == "big")

    adjusted, unadjusted = needed(spec), needed(plain)
    assert unadjusted["cuped"] is None and adjusted["cuped"]["variance_reduction"] > 0.5
    ratio = adjusted["power"]["n_needed"] / unadjusted["power"]["n_needed"]
    assert ratio == pytest.approx(1 - adjusted["cuped"]["variance_reduction"], rel=0.05)
