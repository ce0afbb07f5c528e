"""Offline analysis: aggregation rules, JSON shape, and the CLI on a generated file."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from ablab.platform.analytics.event_files import read_events, write_events
from ablab.platform.stats.aggregates import variant_stats_from_units
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.offline import aggregate_events, analyze_events
from ablab.platform.stats.spec import SpecError, parse_spec
from ablab.platform.stats.synthetic import VariantEffect, spec_dict, synthetic_events

CONTRACT_METRICS = {"e2e_ms", "ttft_ms", "tpot_ms", "e2e_ms_p95", "ttft_ms_p95", "accuracy", "cost_usd",
                    "cost_per_correct", "goodput", "error_rate"}
ROW_KEYS = {"metric", "variant", "n", "estimate", "ci", "abs_diff", "rel_diff", "rel_ci", "p_value",
            "p_value_adjusted", "method"}


@pytest.fixture(scope="module")
def events():
    return synthetic_events(n_requests=20_000, n_units=2_000, seed=7)


@pytest.fixture(scope="module")
def spec():
    return parse_spec(spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25},
                                guardrails=[{"metric": "ttft_ms_p95", "max": 400}, {"metric": "accuracy", "margin": 0.05}]))


def test_analysis_json_has_the_contract_shape(events, spec):
    result, _ = analyze_events(events, spec)
    result = result.model_dump(mode="json")
    assert result["experiment"] == "exp" and result["control"] == "control"
    assert set(result["srm"]) >= {"p_value", "flagged"}
    assert CONTRACT_METRICS <= {r["metric"] for r in result["metrics"]}
    for row in result["metrics"]:
        assert ROW_KEYS <= set(row)
        assert len(row["ci"]) == 2 and len(row["rel_ci"]) == 2
    acc = [r for r in result["metrics"] if r["metric"] == "accuracy"]
    assert all(0.15 < r["coverage"] < 0.25 for r in acc)  # label_rate 0.2
    assert {d["variant"] for d in result["decisions"]} == {"compressed"}
    assert all(d["decision"] in ("ship", "no_ship", "keep_running") and d["reasons"] for d in result["decisions"])
    json.dumps(result, allow_nan=False)  # strict JSON: no NaN leaks


def test_request_level_means_equal_raw_means(events, spec):
    result, _ = analyze_events(events, spec)
    result = result.model_dump(mode="json")
    inf = events[events["type"] == "inference"]
    for row in (r for r in result["metrics"] if r["metric"] == "e2e_ms"):
        raw = inf.loc[inf["variant"] == row["variant"], "e2e_ms"]
        assert row["estimate"] == pytest.approx(raw.mean(), rel=1e-9)
        assert row["n"] == len(raw)


def test_duplicates_late_labels_billing_and_malformed_rows():
    ev = pd.DataFrame([
        {"type": "inference", "trace_id": "a", "experiment": "x", "variant": "c", "unit_id": "u1", "ts": "2026-12-01T00:00:00Z", "e2e_ms": 100.0, "ttft_ms": 10.0, "cost_usd": 1.0},
        {"type": "inference", "trace_id": "a", "experiment": "x", "variant": "c", "unit_id": "u1", "ts": "2026-12-01T00:00:01Z", "e2e_ms": 999.0, "ttft_ms": 10.0, "cost_usd": 1.0},
        {"type": "inference", "trace_id": "b", "experiment": "x", "variant": "t", "unit_id": "u2", "ts": "2026-12-01T00:00:02Z", "e2e_ms": 200.0, "ttft_ms": 20.0, "cost_usd": 1.0},
        {"type": "inference", "trace_id": "c", "experiment": "x", "variant": "t", "unit_id": "u2", "ts": "2026-12-01T00:00:03Z", "e2e_ms": -5.0},
        {"type": "inference", "trace_id": "d", "experiment": "x", "variant": "zzz", "unit_id": "u3", "ts": "2026-12-01T00:00:03Z", "e2e_ms": 5.0},
        {"type": "inference", "trace_id": "e", "experiment": "other", "variant": "c", "unit_id": "u9", "ts": "2026-12-01T00:00:03Z", "e2e_ms": 5.0},
        {"type": "feedback", "trace_id": "a", "experiment": "x", "ts": "2026-12-01T00:05:00Z", "correct": 0},
        {"type": "feedback", "trace_id": "a", "experiment": "x", "ts": "2026-12-01T00:09:00Z", "correct": 1},
        {"type": "feedback", "trace_id": "b", "experiment": "x", "ts": "2026-12-01T00:09:00Z", "correct": 7},
        {"type": "feedback", "trace_id": "ghost", "experiment": "x", "ts": "2026-12-01T00:09:00Z", "correct": 1},
        {"type": "cost", "trace_id": "b", "experiment": "x", "ts": "2026-12-01T00:00:09Z", "cost_usd": 0.25},
        {"type": "cost", "trace_id": "b", "experiment": "x", "ts": "2026-12-01T00:00:10Z", "cost_usd": 0.25},
        {"type": "bogus", "trace_id": "q", "experiment": "x"},
    ])
    spec = parse_spec({"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}]})
    agg = aggregate_events(ev, spec)
    dq = agg.data_quality
    assert dq["duplicate_inference"] == 1 and dq["other_experiments"] == 1 and dq["orphan_feedback"] == 1
    assert dq["rejected"] == {"negative_latency": 1, "unknown_variant": 1, "bad_feedback": 1, "unknown_type": 1}
    assert set(agg.rejected.column("reject_reason").to_pylist()) == set(dq["rejected"])
    c, t = agg.stats["c"], agg.stats["t"]
    assert c.ratios["e2e_ms"].ratio == 100.0  # the duplicate's 999 is not counted
    assert c.ratios["accuracy"].ratio == 1.0  # the later label wins
    assert t.ratios["cost_usd"].ratio == 0.5  # billing replaces the estimate
    assert t.ratios["coverage"].sum_x == 0  # the malformed label does not count


def test_offline_analysis_keeps_and_refuses_boundary_values_as_the_edge_does():
    """issue 37: `ablab analyze` kept events the edge refuses (1.7e308, a cost over the
    ceiling, a TTFT after the last token), so /results and the offline analysis of the same
    file differed. Each boundary value is kept or refused as ``validate_event`` decides."""
    import math

    from ablab.platform.events import Rejection, validate_event
    from ablab.platform.fields import FIELDS

    base = {"v": 1, "type": "inference", "experiment": "x", "variant": "c", "unit_id": "u1",
            "ts": "2026-12-01T00:00:00Z", "ttft_ms": 10.0, "e2e_ms": 100.0, "tpot_ms": 5.0, "prompt_tokens": 5,
            "output_tokens": 3, "device_s": 0.1, "cost_usd": 0.001, "price_version": "p", "strategy": "s"}
    rows = []
    for name, f in FIELDS.items():
        if "inference" not in f.events:
            continue
        lo, hi = (int(f.lo) - 1, int(f.hi) + 1) if f.type == "int" else (math.nextafter(f.lo, -math.inf), math.nextafter(f.hi, math.inf))
        for value in {f.lo, f.hi, lo, hi, -0.0 if f.type == "float" else 0, 1.7976931348623157e308}:
            event = {**base, "trace_id": f"{name}-{len(rows)}", name: value}
            if name == "e2e_ms":
                event["ttft_ms"] = 0.0
            if name == "ttft_ms":
                event["e2e_ms"] = f.hi
            rows.append(event)
    rows.append({**base, "trace_id": "incoherent", "ttft_ms": 101.0})
    kept = {e["trace_id"] for e in rows if not isinstance(validate_event(json.dumps(e)), Rejection)}
    assert 0 < len(kept) < len(rows)
    spec = parse_spec({"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}]})
    agg = aggregate_events(pd.DataFrame(rows), spec)
    refused = set(agg.rejected.column("trace_id").to_pylist())
    assert {e["trace_id"] for e in rows} - refused == kept
    assert agg.data_quality["rejected"]["ttft_exceeds_e2e"] == 1


def test_shadow_requests_are_not_counted_in_their_variant():
    """issue 34: a shadow request's event (shadow_of set) is compared with its primary,
    never counted as one of the variant's requests."""
    base = {"type": "inference", "experiment": "x", "unit_id": "u1", "ts": "2026-12-01T00:00:00Z", "ttft_ms": 10.0,
            "cost_usd": 0.001}
    ev = pd.DataFrame([{**base, "trace_id": "p1", "variant": "c", "e2e_ms": 100.0, "shadow": "sent"},
                       {**base, "trace_id": "p2", "variant": "t", "e2e_ms": 200.0},
                       {**base, "trace_id": "s1", "variant": "c", "e2e_ms": 900.0, "shadow_of": "p1"}])
    spec = parse_spec({"key": "x", "control": "c", "variants": [{"key": "c"}, {"key": "t"}]})
    agg = aggregate_events(ev, spec)
    assert agg.stats["c"].ratios["e2e_ms"].ratio == 100.0  # the shadow's 900 ms is not the variant's
    assert agg.data_quality.get("rejected", {}) == {}


def test_cli_analyze_json_csv_and_table(tmp_path):
    from ablab.cli import app

    path = write_events(synthetic_events(n_requests=5_000, n_units=500, seed=3), tmp_path / "ev.jsonl")
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(spec_dict(slos={"ttft_ms": 200})))
    runner = CliRunner()
    res = runner.invoke(app, ["analyze", str(path), "--config", str(cfg), "--json", "--csv", str(tmp_path / "o.csv")])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert data["experiment"] == "exp" and len(data["metrics"]) >= 20
    lines = (tmp_path / "o.csv").read_text().splitlines()
    assert lines[0].startswith("experiment,metric,variant") and len(lines) == len(data["metrics"]) + 1
    table = runner.invoke(app, ["analyze", str(path), "--config", str(cfg)])
    assert table.exit_code == 0 and "decisions" in table.stdout
    # JSONL and Parquet give the same answer
    pq = write_events(pd.read_json(path, lines=True), tmp_path / "ev.parquet")
    assert analyze_events(read_events(pq), parse_spec(yaml.safe_load(cfg.read_text())))[0].model_dump(mode="json")["metrics"][1]["estimate"] == pytest.approx(data["metrics"][1]["estimate"], rel=1e-9)


def test_cli_rejects_bad_config_naming_the_field(tmp_path):
    from ablab.cli import app

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"key": "x", "control": "nope", "variants": [{"key": "a"}, {"key": "b"}]}))
    ev = write_events(synthetic_events(n_requests=100, n_units=10), tmp_path / "e.parquet")
    res = CliRunner().invoke(app, ["analyze", str(ev), "--config", str(cfg)])
    assert res.exit_code == 1 and "control" in res.output


@pytest.mark.parametrize("bad, field", [
    ({"variants": [{"key": "a"}, {"key": "b"}]}, "key"),
    ({"key": "k", "variants": [{"key": "a"}]}, "variants"),
    ({"key": "k", "variants": [{"key": "a"}, {"key": "b", "weight": -1}]}, "variants[1].weight"),
    ({"key": "k", "variants": [{"key": "a"}, {"key": "b"}], "guardrails": [{"metric": "latency"}]}, "guardrails[0].metric"),
    ({"key": "k", "variants": [{"key": "a"}, {"key": "b"}], "metrics": ["e2e_ms", "speed"]}, "metrics[1]"),
    ({"key": "k", "variants": [{"key": "a"}, {"key": "b"}], "slos": {"cost_usd": 1}}, "slos.cost_usd"),
    ({"key": "k", "variants": [{"key": "a"}, {"key": "b"}], "unit": "device"}, "unit"),
])
def test_spec_errors_name_the_field(bad, field):
    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(bad)


def test_user_randomized_uses_clustered_variance():
    # strong per-user effects: the delta-method CI must be wider than the naive request-level one
    ev = synthetic_events(n_requests=30_000, n_units=300, seed=5, user_sd=0.8)
    spec = parse_spec(spec_dict())
    user = analyze_events(ev, spec)[0].model_dump(mode="json")
    req = analyze_events(ev.assign(unit_id=ev["trace_id"]), spec)[0].model_dump(mode="json")
    width = lambda res: np.diff([r["abs_ci"] for r in res["metrics"] if r["metric"] == "e2e_ms" and r["variant"] != "control"][0])[0]
    assert width(user) > 2 * width(req)


def test_guardrail_breach_flags_pause_and_no_ship():
    from ablab.platform.stats.decisions import guardrail_breaches

    variants = {"control": VariantEffect(weight=0.5), "slow": VariantEffect(weight=0.5, latency=1.6)}
    ev = synthetic_events(n_requests=20_000, n_units=2_000, variants=variants, seed=9)
    spec = parse_spec(spec_dict(variants, guardrails=[{"metric": "ttft_ms_p95", "max": 300}]))
    result, _ = analyze_events(ev, spec)
    breaches = guardrail_breaches(result)
    assert [b["variant"] for b in breaches] == ["slow"] and "SLA" in breaches[0]["reason"]
    decision = result.decisions[0]
    assert decision.decision == "no_ship" and any("guardrail breached" in r for r in decision.reasons)


def test_srm_flags_and_blocks_shipping():
    variants = {"control": VariantEffect(weight=0.5), "fast": VariantEffect(weight=0.5, latency=0.7)}
    ev = synthetic_events(n_requests=20_000, n_units=4_000, variants=variants, seed=2)
    skewed = {"key": "exp", "control": "control", "variants": [{"key": "control", "weight": 0.6}, {"key": "fast", "weight": 0.4}]}
    result, _ = analyze_events(ev, parse_spec(skewed))
    result = result.model_dump(mode="json")
    assert result["srm"]["flagged"] is True
    assert result["decisions"][0]["decision"] == "no_ship"
    fine, _ = analyze_events(ev, parse_spec(spec_dict(variants)))
    fine = fine.model_dump(mode="json")
    assert fine["srm"]["flagged"] is False and fine["decisions"][0]["decision"] == "ship"


def test_cuped_from_pre_period_events_narrows_the_interval():
    ev = synthetic_events(n_requests=20_000, n_units=2_000, seed=4, pre_period_requests=40_000, user_sd=0.6)
    with_pre = parse_spec(spec_dict(start="2026-12-01T00:00:00Z"))
    without = parse_spec(spec_dict(start="2026-12-01T00:00:00Z", analysis={"cuped": False}))
    a, b = analyze_events(ev, with_pre)[0].model_dump(mode="json"), analyze_events(ev, without)[0].model_dump(mode="json")
    row = lambda res: next(r for r in res["metrics"] if r["metric"] == "e2e_ms" and r["variant"] != "control")
    assert row(a)["method"].startswith("cuped") and row(b)["method"].startswith("delta")
    assert (row(a)["abs_ci"][1] - row(a)["abs_ci"][0]) < 0.8 * (row(b)["abs_ci"][1] - row(b)["abs_ci"][0])
    assert a["data_quality"]["pre_period_events"] == 40_000


def test_engine_accepts_plain_per_unit_arrays():
    units = {
        "variant": np.array(["c"] * 50 + ["t"] * 50),
        **{col: np.ones(100) for col in ("requests", "e2e_ms_n", "ttft_ms_n", "tpot_ms_n")},
        "e2e_ms_sum": np.r_[np.linspace(90, 110, 50), np.linspace(80, 100, 50)],
        **{col: np.zeros(100) for col in ("errors", "ttft_ms_sum", "tpot_ms_sum", "cost_usd_sum", "labeled",
                                         "correct", "labeled_cost_usd_sum", "good")},
    }
    spec = parse_spec({"key": "k", "control": "c", "unit": "request", "variants": [{"key": "c"}, {"key": "t"}],
                       "metrics": ["e2e_ms"], "analysis": {"sequential": False}})
    result = analyze_results(spec=spec, stats=variant_stats_from_units(units)).model_dump(mode="json")
    row = result["metrics"][1]
    assert row["method"] == "welch" and row["abs_diff"] == pytest.approx(-10.0)


def test_parquet_dictionary_ids_equal_plain_strings(tmp_path, spec):
    """read_events decodes id columns to dictionaries; several row groups, and a dictionary
    with an unused entry (a filtered table), must give exactly the plain-string answer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = synthetic_events(n_requests=6_000, n_units=600, seed=3)
    path = write_events(frame, tmp_path / "events.parquet")
    pq.write_table(pq.read_table(path), path, row_group_size=1_000)
    table = read_events(path)
    assert pa.types.is_dictionary(table.schema.field("unit_id").type)
    assert table["unit_id"].num_chunks > 1
    plain = pq.read_table(path, columns=table.column_names)
    want, _ = analyze_events(plain, spec)
    want = want.model_dump(mode="json")
    got, _ = analyze_events(table, spec)
    got = got.model_dump(mode="json")
    assert json.dumps(got, sort_keys=True, default=str) == json.dumps(want, sort_keys=True, default=str)
    # drop one unit's rows but keep its dictionary entry: the fallback path re-encodes
    keep = pa.compute.not_equal(pa.compute.cast(table["unit_id"], pa.string()), plain["unit_id"][0])
    got_f, _ = analyze_events(table.filter(keep), spec)
    got_f = got_f.model_dump(mode="json")
    want_f, _ = analyze_events(plain.filter(keep), spec)
    want_f = want_f.model_dump(mode="json")
    assert json.dumps(got_f, sort_keys=True, default=str) == json.dumps(want_f, sort_keys=True, default=str)
