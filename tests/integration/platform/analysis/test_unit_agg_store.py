"""The one per-unit plan rendered twice — ClickHouse SQL over ``raw_events`` (real chDB) and
numpy over the same events — gives the same per-unit columns, per-segment rows and
histograms: built-ins, custom metrics over a judge score, a custom measure, a ratio, a
quantile and a pre-period covariate, with score-only labels, relabels, duplicates, errors
spelled as the store keeps them, and a dimension with more values than a breakdown shows.

chDB allows one data directory per process, so the store side runs in a child process.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.offline import aggregate_events, analyze_events
from ablab.platform.stats.spec import ExperimentSpec, parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab_testing import run_child_json

pytestmark = pytest.mark.integration

CUSTOM_YAML = [
    {"name": "judge", "type": "mean", "column": "score"},
    {"name": "tools", "type": "mean", "column": "measures.tool_calls", "aggregation": "unit_mean",
     "cuped": {"covariate": "pre_period"}},
    {"name": "tok_cost", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
    {"name": "steps_p90", "type": "quantile", "column": "measures.steps", "quantile": 0.9},
    {"name": "judge_adj", "type": "mean", "column": "score", "cuped": {"covariate": "e2e_ms"}},
]
START = "2026-12-01T00:00:00+00:00"


def spec_under_test() -> ExperimentSpec:
    data = spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25}, start=START)
    data["metrics"] = {**(data.get("metrics") or {}), "custom": CUSTOM_YAML, "segments": ["dims.domain", "dims.lang"]}
    return parse_spec(data)


CUSTOM = spec_under_test().custom


def make_events(seed: int = 3) -> pd.DataFrame:
    ev = synthetic_events(n_requests=6_000, n_units=500, seed=seed, pre_period_requests=1_500)
    ev["ts"] = ev["ts"].dt.floor("ms")
    rng = np.random.default_rng(seed)
    inf = ev["type"] == "inference"
    n = len(ev)
    measures, dims = [None] * n, [None] * n
    for i in np.flatnonzero(inf):
        m = {}
        if rng.random() < 0.8:
            m["tool_calls"] = float(rng.poisson(2))
        if rng.random() < 0.6:
            m["steps"] = float(rng.gamma(2.0, 3.0))
        measures[i] = m
        d = {}
        if rng.random() < 0.9:
            d["domain"] = f"d{int(rng.zipf(1.6)) % 27}"  # 27 values: the tail folds into "(other)"
        if rng.random() < 0.5:
            d["lang"] = str(rng.choice(["en", "de", "fr"]))
        dims[i] = d
    ev["measures"], ev["dims"] = measures, dims
    # judge scores: most labels carry both, some a score only, a few a correct only
    fb = ev["type"] == "feedback"
    ev["score"] = np.where(fb, rng.uniform(0, 10, n).round(3), np.nan)
    only_score = fb & (rng.random(n) < 0.25)
    ev["correct"] = ev["correct"].astype("Float64").mask(only_score)
    ev.loc[fb & ~only_score & (rng.random(n) < 0.1), "score"] = np.nan
    # relabels: a later score for some traces wins
    later = ev[fb].sample(frac=0.1, random_state=seed).copy()
    later["ts"] = later["ts"] + pd.Timedelta(seconds=5)
    later["score"] = rng.uniform(0, 10, len(later)).round(3)
    later["correct"] = pd.array([pd.NA] * len(later), dtype="Float64")
    # a billing record replaces one request's cost
    bill = ev[inf].iloc[[3]].copy()
    bill["type"], bill["cost_usd"] = "cost", 0.25
    bill["measures"], bill["dims"] = None, None
    return pd.concat([ev, later, bill], ignore_index=True)


CHILD = textwrap.dedent("""
    import json, pickle, sys
    import numpy as np
    from ablab.streaming.store import apply_ddl, make_client
    from ablab.streaming.store.reads import StoreReads
    from ablab.platform.analytics.results import aggregates_from_raw, results_from_raw

    store, events_path, here = sys.argv[1:4]
    sys.path.insert(0, here)
    from test_unit_agg_store import spec_under_test
    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    ev = pickle.load(open(events_path, "rb"))
    spec = spec_under_test()
    from ablab_testing import insert_synthetic_raw

    insert_synthetic_raw(client, ev)
    agg = aggregates_from_raw(StoreReads(client), spec)
    names = dict(client.query("SELECT DISTINCT cityHash64(unit_id), unit_id FROM raw_events").result_rows)
    units = {k: (v.tolist() if k != "unit_id" else [names[int(u)] for u in v]) for k, v in agg.units.items()}
    segs = {d: {val: {var: {"units": s.units, "ratios": {m: [r.sum_x, r.sum_y, r.sum_x2, r.sum_y2, r.sum_xy]
                                                           for m, r in s.ratios.items()}}
                      for var, s in by_var.items()} for val, by_var in vals.items()} for d, vals in agg.segments.items()}
    hists = {v: {k: h.counts.tolist() for k, h in hs.items()} for v, hs in agg.histograms.items()}
    print(json.dumps({"units": units, "segments": segs, "histograms": hists, "results": results_from_raw(StoreReads(client), spec).model_dump(mode="json")}))
""")


def test_sql_and_numpy_renderings_agree(tmp_path):
    import pickle

    events = make_events()
    spec = spec_under_test()
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(events))
    store = run_child_json(CHILD, str(tmp_path / "chdb"), str(tmp_path / "in.pkl"), str(Path(__file__).parent),
                           timeout=300)
    offline = aggregate_events(events, spec)

    # per-unit columns, matched by (variant, unit)
    plan = ua.plan(spec)
    names = [c.name for c in (*plan.columns, *plan.pre_columns)]
    assert {"c__judge__x", "c__tools__x", "pre__c__tools__x", "c__tok_cost__y", "c__steps_p90__sq", "c__judge_adj__cov_x"} <= set(names)
    unit_labels = pd.unique(events["unit_id"].dropna())
    off = pd.DataFrame({k: offline.units[k] for k in ["variant", *names]})
    off["unit_id"] = unit_labels[offline.units["unit_id"]]
    got = pd.DataFrame(store["units"])
    both = off.merge(got, on=["variant", "unit_id"], suffixes=("_np", "_sql"), how="outer", indicator=True)
    assert (both["_merge"] == "both").all() and len(both) == len(off) == len(got)
    for name in names:
        np.testing.assert_allclose(both[f"{name}_sql"], both[f"{name}_np"], rtol=1e-9, atol=1e-9, err_msg=name)
    assert off["c__judge__y"].sum() > 0 and off["pre__c__tools__y"].sum() > 0 and off["errors"].sum() > 0

    # histograms (built-in latencies and the quantile metric's)
    for variant, hists in store["histograms"].items():
        for key, counts in hists.items():
            assert counts == offline.histograms[variant][key].counts.tolist(), (variant, key)
    assert "steps_p90" in store["histograms"]["control"]

    # segments: the same values ("(other)" and "(none)" included) and the same sums
    assert set(store["segments"]) == set(offline.segments) == {"dims.domain", "dims.lang"}
    domain = offline.segments["dims.domain"]
    assert ua.OTHER in domain and ua.NONE in domain and len(domain) == ua.MAX_SEGMENT_VALUES + 2
    for dim, values in offline.segments.items():
        assert set(store["segments"][dim]) == set(values)
        for value, by_variant in values.items():
            for variant, stats in by_variant.items():
                s = store["segments"][dim][value][variant]
                assert s["units"] == stats.units
                for metric, r in stats.ratios.items():
                    np.testing.assert_allclose(s["ratios"][metric], [r.sum_x, r.sum_y, r.sum_x2, r.sum_y2, r.sum_xy],
                                               rtol=1e-9, atol=1e-9, err_msg=f"{dim}={value} {variant} {metric}")

    # and the engine's output from both: every metric row (custom ones included) and the breakdown
    want, _ = analyze_events(events, spec)
    want = want.model_dump(mode="json")
    got = store["results"]
    rows = {(r["metric"], r["variant"]): r for r in got["metrics"]}
    assert set(rows) == {(r["metric"], r["variant"]) for r in want["metrics"]}
    assert {r["metric"] for r in want["metrics"] if r.get("custom")} == {m.name for m in CUSTOM}
    assert all(r["n"] > 0 and r["estimate"] is not None for r in want["metrics"] if r.get("custom")), \
        [(r["metric"], r["variant"], r["n"]) for r in want["metrics"] if r.get("custom")]
    for w in want["metrics"]:
        _close(rows[(w["metric"], w["variant"])], w, ("n", "estimate", "abs_diff", "rel_diff", "p_value"))
    assert [s["dimension"] for s in got["segments"]] == [s["dimension"] for s in want["segments"]]
    for g, w in zip(got["segments"], want["segments"]):
        seg_rows = {(r["value"], r["metric"], r["variant"]): r for r in g["rows"]}
        assert set(seg_rows) == {(r["value"], r["metric"], r["variant"]) for r in w["rows"]}
        for r in w["rows"]:
            _close(seg_rows[(r["value"], r["metric"], r["variant"])], r, ("n", "estimate", "abs_diff", "p_value", "p_value_adjusted"))
        assert [h["flagged"] for h in g["heterogeneity"]] == [h["flagged"] for h in w["heterogeneity"]]


def _close(got, want, names):
    for name in names:
        if want.get(name) is None:
            assert got.get(name) is None, (want.get("metric"), name)
        else:
            assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-12), (want.get("metric"), want.get("variant"), name)
