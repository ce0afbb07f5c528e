"""Segment breakdowns: a planted heterogeneous effect is flagged; A/A over 10 segments keeps FWER ≤ α."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from ablab.platform.stats.aggregates import VariantStats, variant_stats_from_units
from ablab.platform.stats.custom_metric import custom_columns
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.metrics import UNIT_COLUMNS
from ablab.platform.stats.segments import cochran_q, segment_breakdown
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.sufficient import RatioStats, SampleStats


def spec_for(metric, **analysis):
    return parse_spec({
        "key": "k", "variants": [{"key": "control"}, {"key": "treat"}],
        "metrics": {"custom": [metric], "primary": [metric["name"]], "report": [metric["name"]], "segments": ["dims.domain"]},
        "analysis": {"sequential": False, **analysis},
    })


def test_cochran_q_matches_the_textbook_formula():
    d, se = [0.1, 0.3, -0.05, 0.2], [0.05, 0.08, 0.06, 0.1]
    q, df, p = cochran_q(d, se)
    w = 1 / np.square(se)
    ref = float((w * (np.array(d) - (w * d).sum() / w.sum()) ** 2).sum())
    assert q == pytest.approx(ref, rel=1e-12) and df == 3
    assert p == pytest.approx(sps.chi2.sf(ref, 3), abs=1e-9)
    assert math.isnan(cochran_q([0.1], [0.1])[0])


def _segment_units(rng, spec, n, mean, lift):
    m = spec.custom[0]
    cols = custom_columns(m)
    out = {"variant": np.array(["control"] * n + ["treat"] * n), **{c: np.zeros(2 * n) for c in UNIT_COLUMNS}}
    y = (rng.poisson(3, 2 * n) + 1).astype(float)
    unit_mean = np.concatenate([rng.normal(mean, 2, n), rng.normal(mean * (1 + lift), 2, n)])
    out[cols["x"]] = unit_mean * y + rng.normal(0, 1, 2 * n) * np.sqrt(y)
    out[cols["y"]] = y
    return variant_stats_from_units(out, custom=spec.custom)


def test_planted_heterogeneous_effect_is_flagged():
    rng = np.random.default_rng(7)
    spec = spec_for({"name": "judge", "type": "mean", "column": "score"})
    lifts = {"code": 0.15, "chat": 0.0, "math": 0.0, "legal": 0.0, "(none)": 0.0}
    per_segment = {"dims.domain": {v: _segment_units(rng, spec, 800, 10.0, lift) for v, lift in lifts.items()}}
    [dim] = segment_breakdown(spec, per_segment)
    assert dim["dimension"] == "dims.domain"
    [het] = dim["heterogeneity"]
    assert het["metric"] == "judge" and het["variant"] == "treat" and het["df"] == 4
    assert het["flagged"] and het["p_value"] < 1e-6
    by_value = {r["value"]: r for r in dim["rows"] if r["variant"] == "treat"}
    assert by_value["code"]["p_value_adjusted"] < 0.05 and by_value["code"]["rel_diff"] == pytest.approx(0.15, abs=0.05)
    assert all(by_value[v]["p_value_adjusted"] >= by_value[v]["p_value"] for v in lifts)
    # each treatment row carries its comparison's standard error: Cochran's Q is rebuilt from the rows
    rows = [by_value[v] for v in lifts]
    assert all(r["se"] > 0 for r in rows) and all(r["se"] is None for r in dim["rows"] if r["variant"] == "control")
    assert cochran_q([r["abs_diff"] for r in rows], [r["se"] for r in rows])[0] == pytest.approx(het["q"], rel=1e-12)

    # the same lift everywhere: an effect, but no heterogeneity
    per_segment = {"dims.domain": {v: _segment_units(rng, spec, 800, 10.0, 0.05) for v in lifts}}
    [dim] = segment_breakdown(spec, per_segment)
    assert not dim["heterogeneity"][0]["flagged"]

    # analyze_results carries the breakdown; without segments the list is empty
    stats = _segment_units(rng, spec, 800, 10.0, 0.0)
    out = analyze_results(spec=spec, stats=stats, segments=per_segment).model_dump(mode="json")
    assert out["segments"][0]["dimension"] == "dims.domain" and len(out["segments"][0]["rows"]) == 10
    assert all("se" in r for r in out["segments"][0]["rows"])  # in the JSON, null for the control
    assert analyze_results(spec=spec, stats=stats).model_dump(mode="json")["segments"] == []


@pytest.mark.parametrize("correction", ["holm"])
def test_aa_breakdown_over_ten_segments_keeps_family_wise_error(correction):
    rng = np.random.default_rng(20261204)
    spec = spec_for({"name": "per_user", "type": "mean", "column": "score", "aggregation": "unit_mean"}, correction=correction)
    sims, k, n, alpha = 800, 10, 60, spec.alpha
    any_adjusted = any_raw = 0
    for _ in range(sims):
        by_value = {}
        for j in range(k):
            arms = {}
            for v in ("control", "treat"):
                vals = rng.exponential(2.0, n)  # skewed per-unit means, the same in both arms
                arms[v] = VariantStats(float(n), {"per_user": RatioStats()}, samples={"per_user": SampleStats.from_values(vals)})
            by_value[f"seg{j}"] = arms
        [dim] = segment_breakdown(spec, {"dims.domain": by_value})
        rows = [r for r in dim["rows"] if r["variant"] == "treat"]
        any_adjusted += any(r["p_value_adjusted"] < alpha for r in rows)
        any_raw += any(r["p_value"] < alpha for r in rows)
    tolerance = 3 * math.sqrt(sims * alpha * (1 - alpha))
    assert any_adjusted <= alpha * sims + tolerance  # FWER ≤ α within binomial noise
    assert any_raw > 0.25 * sims  # uncorrected, ~1 − 0.95¹⁰ = 40 % of A/A tests call some segment
