"""The per-unit rollup serves custom metrics and segment breakdowns exactly: fed through the
loader's own step (:func:`ablab.streaming.store.rollup.feed`) in batches — one batch fed twice
(a replay), labels that arrive batches after their requests and some before them, relabels, a
billing record — the rollup's per-unit columns and per-segment rows equal the raw scan's and
``ablab analyze``'s (numpy) to 1e-9, and so do the results. What the rollup cannot give (a
quantile of a measure, a ratio of two nullable sources, requests before ``start``) is routed
to the raw scan.

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
from ablab.platform.stats.synthetic import spec_dict
from ablab_testing import run_child_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROLLUP_CUSTOM = [
    {"name": "judge", "type": "mean", "column": "score"},
    {"name": "right", "type": "proportion", "column": "correct"},
    {"name": "tools", "type": "mean", "column": "measures.tool_calls", "aggregation": "unit_mean",
     "cuped": {"covariate": "pre_period"}},
    {"name": "steps", "type": "mean", "column": "measures.steps", "aggregation": "unit_sum"},
    {"name": "tok_cost", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
    {"name": "out_per_cost", "type": "ratio", "numerator": "output_tokens", "denominator": "cost_usd"},
    {"name": "judge_adj", "type": "mean", "column": "score", "cuped": {"covariate": "e2e_ms"}},
    {"name": "ttft_req", "type": "mean", "column": "ttft_ms"},
]


def rollup_spec(custom=ROLLUP_CUSTOM, **extra) -> ExperimentSpec:
    data = spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25}, **extra)
    data["metrics"] = {**(data.get("metrics") or {}), "custom": list(custom), "segments": ["dims.domain", "dims.lang"]}
    return parse_spec(data)


def rollup_events() -> pd.DataFrame:
    from test_unit_agg_store import make_events

    ev = make_events(seed=5)
    inf = ev["type"] == "inference"
    # no pre-period here (the rollup holds all-time sums); a unit whose requests never carry "lang"
    lonely = ev.loc[inf, "unit_id"].iloc[0]
    ev["dims"] = [({k: v for k, v in d.items() if k != "lang"} if u == lonely and isinstance(d, dict) else d)
                  for d, u in zip(ev["dims"], ev["unit_id"])]
    return ev


CHILD = textwrap.dedent("""
    import json, pickle, sys
    import numpy as np
    from ablab.streaming.store import apply_ddl, make_client, rollup
    from ablab.streaming.store.reads import StoreReads
    from ablab.platform.analytics import results as res
    from ablab.streaming.loader.rows import RAW_COLUMNS

    store, events_path, here = sys.argv[1:4]
    sys.path.insert(0, here)
    from test_rollup_custom import rollup_spec, ROLLUP_CUSTOM
    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    ev = pickle.load(open(events_path, "rb"))
    spec = rollup_spec()
    from ablab.platform.stats import unit_agg as ua
    plan = ua.plan(spec)
    from ablab_testing import raw_frame

    ev = raw_frame(ev)
    client.insert_df("raw_events", ev)
    for col in RAW_COLUMNS:
        if col not in ev.columns:
            ev[col] = None
    rollup.set_slos(client, spec.key, spec.slos, segments=True)  # the spec declares a breakdown
    # the loader's step in shuffled batches: labels before and after their requests, a replay
    rows = [tuple(None if (isinstance(v, float) and v != v) or v is None or v is np.nan
                  else (v.to_pydatetime() if hasattr(v, "to_pydatetime") else v) for v in r)
            for r in ev[list(RAW_COLUMNS)].astype(object).where(ev[list(RAW_COLUMNS)].notna(), None).itertuples(index=False)]
    order = np.random.default_rng(1).permutation(len(rows))
    batches = np.array_split(order, 6)
    for i, b in enumerate(batches):
        rollup.feed(client, [rows[j] for j in b])
        if i == 2:
            rollup.feed(client, [rows[j] for j in b])  # a replayed batch
    out = {"applies": res.rollup_applies(spec), "current": res.rollup_current(StoreReads(client), spec)}

    def dump(agg):
        cols = [c.name for c in (*plan.columns, *plan.pre_columns)]
        units = {k: [str(x) for x in agg.units[k]] for k in ("variant", "unit_id")}
        units.update({k: np.asarray(agg.units[k], dtype=float).tolist() for k in cols})
        segs = {d: {val: {var: {"units": s.units, "ratios": {m: [r.sum_x, r.sum_y, r.sum_x2, r.sum_y2, r.sum_xy]
                                                               for m, r in s.ratios.items()}}
                          for var, s in by_var.items()} for val, by_var in vals.items()} for d, vals in agg.segments.items()}
        return {"units": units, "segments": segs}

    names = dict(client.query("SELECT DISTINCT cityHash64(unit_id), unit_id FROM raw_events").result_rows)
    agg = res.aggregates(StoreReads(client), spec)
    out["source"] = agg.source
    raw = res.aggregates_from_raw(StoreReads(client), spec)
    for side, a in (("rollup", agg), ("raw", raw)):  # both key units by a 64-bit hash
        a.units["unit_id"] = np.asarray([names[int(u)] for u in a.units["unit_id"]], dtype=object)
        out[side] = dump(a)
    out["results"] = res.results(StoreReads(client), spec).model_dump(mode="json")
    # what the rollup cannot give goes to the raw scan
    q = rollup_spec([*ROLLUP_CUSTOM, {"name": "steps_p90", "type": "quantile", "column": "measures.steps", "quantile": 0.9}])
    two = rollup_spec([{"name": "tpp", "type": "ratio", "numerator": "output_tokens", "denominator": "prompt_tokens"}])
    late = rollup_spec(start="2026-12-01T00:00:00+00:00")
    out["routed"] = [res.aggregates(StoreReads(client), s).source for s in (q, two, late)]
    print(json.dumps(out))
""")


def test_rollup_serves_custom_metrics_and_segments(tmp_path):
    import pickle

    events = rollup_events()
    spec = rollup_spec()
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(events))
    store = run_child_json(CHILD, str(tmp_path / "chdb"), str(tmp_path / "in.pkl"), str(Path(__file__).parent), timeout=580)
    assert store["applies"] and store["current"] and store["source"] == "rollup"
    # a quantile of a measure, a ratio of two nullable sources, requests before start: raw scan
    assert store["routed"] == ["raw", "raw", "raw"]

    offline = aggregate_events(events, spec)
    plan = ua.plan(spec)
    names = [c.name for c in (*plan.columns, *plan.pre_columns)]
    assert {"c__judge__x", "c__right__y", "c__tok_cost__x", "c__out_per_cost__y", "c__judge_adj__cov_x"} <= set(names)
    unit_labels = pd.unique(events["unit_id"].dropna())
    off = pd.DataFrame({k: offline.units[k] for k in ["variant", *names]})
    off["unit_id"] = unit_labels[offline.units["unit_id"]]
    for side in ("rollup", "raw"):
        got = pd.DataFrame(store[side]["units"])
        both = off.merge(got, on=["variant", "unit_id"], suffixes=("_np", "_st"), how="outer", indicator=True)
        assert (both["_merge"] == "both").all() and len(both) == len(off) == len(got), side
        for name in names:
            np.testing.assert_allclose(both[f"{name}_st"], both[f"{name}_np"], rtol=1e-9, atol=1e-9, err_msg=f"{side} {name}")
    assert off["c__judge__y"].sum() > 0 and off["c__tok_cost__y"].sum() > 0 and off["errors"].sum() > 0

    domain = offline.segments["dims.domain"]
    assert ua.OTHER in domain and ua.NONE in domain and len(domain) == ua.MAX_SEGMENT_VALUES + 2
    for side in ("rollup", "raw"):
        assert set(store[side]["segments"]) == set(offline.segments) == {"dims.domain", "dims.lang"}
        for dim, values in offline.segments.items():
            assert set(store[side]["segments"][dim]) == set(values), (side, dim)
            for value, by_variant in values.items():
                assert set(store[side]["segments"][dim][value]) == set(by_variant)
                for variant, stats in by_variant.items():
                    s = store[side]["segments"][dim][value][variant]
                    assert s["units"] == stats.units, (side, dim, value, variant)
                    for metric, r in stats.ratios.items():
                        np.testing.assert_allclose(s["ratios"][metric], [r.sum_x, r.sum_y, r.sum_x2, r.sum_y2, r.sum_xy],
                                                   rtol=1e-9, atol=1e-9, err_msg=f"{side} {dim}={value} {variant} {metric}")

    want, _ = analyze_events(events, spec)
    want = want.model_dump(mode="json")
    got = store["results"]
    rows = {(r["metric"], r["variant"]): r for r in got["metrics"]}
    assert set(rows) == {(r["metric"], r["variant"]) for r in want["metrics"]}
    for w in want["metrics"]:
        for name in ("n", "estimate", "abs_diff", "rel_diff", "p_value"):
            if w.get(name) is None:
                assert rows[(w["metric"], w["variant"])].get(name) is None
            else:
                assert rows[(w["metric"], w["variant"])][name] == pytest.approx(w[name], rel=1e-6, abs=1e-12), (w["metric"], name)
    for g, w in zip(got["segments"], want["segments"], strict=True):
        seg_rows = {(r["value"], r["metric"], r["variant"]): r for r in g["rows"]}
        assert set(seg_rows) == {(r["value"], r["metric"], r["variant"]) for r in w["rows"]}
        for r in w["rows"]:
            for name in ("n", "estimate", "p_value"):
                if r.get(name) is not None:
                    assert seg_rows[(r["value"], r["metric"], r["variant"])][name] == pytest.approx(r[name], rel=1e-6, abs=1e-12)
