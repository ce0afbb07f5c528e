"""``results.policies`` (issue 33): a policy variant's arms, SLO compliance and model state,
checked against the simulated experiment's events by hand and against the environment's truth."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ablab.platform.analytics.event_files import read_events
from ablab.platform.analytics.offline import analyze_file_events as analyze_events
from ablab.platform.analytics.results import policy_breakdowns
from ablab.platform.policy.breakdown import has_policies, policy_results
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy
from ablab.platform.stats.result_models import PolicyBreakdown, Results
from ablab.platform.stats.spec import parse_spec

N, UNITS = 6000, 600


@pytest.fixture(scope="module")
def sim(env, tmp_path_factory) -> dict:
    router = router_policy(env, explore=0.1)
    decider = Decider(router, fit_after_exploring(router, env))
    events, spec = experiment_events(env, decider, np.random.default_rng(11), key="sim", n=N, n_units=UNITS)
    spec["metrics"] = {"primary": "accuracy"}
    root = tmp_path_factory.mktemp("breakdown")
    (root / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    pd.DataFrame(events).to_parquet(root / "events.parquet", index=False)
    return {"events": events, "spec": parse_spec(spec), "decider": decider, "root": root}


def _router(sim: dict, name: str = "events.jsonl") -> PolicyBreakdown:
    got = policy_results(read_events(sim["root"] / name), sim["spec"])
    assert got is not None and [b.variant for b in got] == ["router"]
    return got[0]


def test_counts_shares_propensities_and_arm_metrics_by_hand(sim) -> None:
    b = _router(sim)
    mine = [e for e in sim["events"] if e["type"] == "inference" and e["variant"] == "router"]
    labels = {e["trace_id"]: e["correct"] for e in sim["events"] if e["type"] == "feedback"}
    assert (b.kind, b.requests, b.units) == ("slo_router", len(mine), len({e["unit_id"] for e in mine}))
    assert b.model_version == sim["decider"].version and not b.exploring and b.objective == "accuracy"
    assert [a.arm for a in b.arms] == ["fast", "helpful", "expert"]
    assert sum(a.requests for a in b.arms) == b.requests
    assert sum(a.share for a in b.arms) == pytest.approx(1.0, abs=1e-12)
    for a in b.arms:
        rows = [e for e in mine if e["arm"] == a.arm]
        assert a.requests == len(rows)
        assert a.share == pytest.approx(len(rows) / len(mine), rel=1e-12)
        assert a.share_ci[0] < a.share < a.share_ci[1]
        # the policy's own probability, as logged (the variant's weight share taken back out)
        assert a.mean_propensity == pytest.approx(np.mean([e["propensity"] for e in rows]), rel=1e-12)
        assert a.slo_compliance == pytest.approx(np.mean([e["ttft_ms"] <= 400 for e in rows]), rel=1e-12)
        m = {x.metric: x for x in a.metrics}
        assert list(m) == ["accuracy", "error_rate", "e2e_ms", "ttft_ms", "cost_usd"]
        assert m["accuracy"].n == len(rows)
        assert m["accuracy"].estimate == pytest.approx(np.mean([labels[e["trace_id"]] for e in rows]), rel=1e-12)
        assert m["ttft_ms"].estimate == pytest.approx(np.mean([e["ttft_ms"] for e in rows]), rel=1e-12)
        assert m["ttft_ms"].ci[0] < m["ttft_ms"].estimate < m["ttft_ms"].ci[1]
        assert m["error_rate"].estimate == 0.0


def test_slo_compliance_is_the_variants_quantile_against_the_bound(sim) -> None:
    b = _router(sim)
    ttft = np.array([e["ttft_ms"] for e in sim["events"] if e["type"] == "inference" and e["variant"] == "router"])
    (slo,) = b.slo
    assert (slo.metric, slo.field, slo.quantile, slo.bound, slo.n) == ("ttft_ms_p95", "ttft_ms", 0.95, 400.0, ttft.size)
    assert slo.observed == float(np.quantile(ttft, 0.95, method="inverted_cdf"))
    assert slo.ci[0] < slo.observed < slo.ci[1]
    assert slo.compliance == pytest.approx(float(np.mean(ttft <= 400)), rel=1e-12)
    assert slo.met is (slo.observed <= 400)


def test_arm_shares_match_the_routers_own_probabilities(sim, env: Environment) -> None:
    """The truth: each arm's expected share is the router's probability averaged over the
    environment's contexts."""
    b = _router(sim)
    plan, level, prob = env.context_grid()
    expected = prob @ sim["decider"].probability_matrix(env.features(plan, level), plan.size)
    for a, p in zip(b.arms, expected):
        half = (a.share_ci[1] - a.share_ci[0]) / 2
        assert abs(a.share - p) < 2.5 * half, (a.arm, a.share, p)


def test_a_router_without_a_model_is_exploring(env) -> None:
    router = router_policy(env, explore=0.1)
    events, spec = experiment_events(env, Decider(router), np.random.default_rng(3), key="cold", n=600, n_units=60)
    (b,) = policy_results(pa.Table.from_pandas(pd.DataFrame(events)), parse_spec(spec)) or []
    assert b.exploring and b.model_version == f"uniform:{router.content_hash}"
    assert any("100.0% of its requests were decided without a model" in n for n in b.notes)
    assert all(a.mean_propensity == pytest.approx(1 / 3) for a in b.arms)


def test_a_rule_has_no_objective_or_slo(sim) -> None:
    rule = {"kind": "rule", "arms": {"fast": {}, "expert": {}}, "default": "fast",
            "rules": [{"when": {"attr.plan": {"eq": "pro"}}, "arm": "expert"}]}
    events = []
    for e in sim["events"]:
        e = dict(e)
        if e.get("variant") == "router":
            e["arm"], e["propensity"], e["policy_version"] = ("expert" if e["dims"]["plan"] == "pro" else "fast"), 1.0, "rule:x"
        events.append(e)
    spec = parse_spec({"key": "sim", "control": "control", "variants": [
        {"key": "control", "weight": 1}, {"key": "router", "weight": 1, "strategy": {"policy": rule}}]})
    (b,) = policy_results(pa.Table.from_pandas(pd.DataFrame(events)), spec) or []
    assert (b.kind, b.objective, b.slo, b.exploring, b.model_version) == ("rule", None, [], False, "rule:x")
    assert all(a.slo_compliance is None and a.mean_propensity == 1.0 for a in b.arms)
    assert [m.metric for m in b.arms[0].metrics] == ["accuracy", "error_rate", "e2e_ms", "ttft_ms", "cost_usd"]


def test_analyze_carries_policies_and_parquet_equals_jsonl(sim) -> None:
    """``ablab analyze`` reads Parquet by column (arm, propensity and policy_version among
    them) and JSON Lines whole: the same breakdown either way."""
    root: Path = sim["root"]
    docs = []
    for name in ("events.jsonl", "events.parquet"):
        result, _ = analyze_events(read_events(root / name), sim["spec"])
        docs.append(result.model_dump(mode="json"))
    assert docs[0]["policies"] == docs[1]["policies"]
    assert docs[0]["policies"] == [_router(sim).model_dump(mode="json")]
    # the policy variant is still compared as any variant
    assert {r["variant"] for r in docs[0]["metrics"]} == {"control", "router"}


def test_policies_absent_without_a_policy_variant(sim) -> None:
    fixed = [{**e, "variant": "treatment"} if e.get("variant") == "router" else e for e in sim["events"]]
    spec = parse_spec({"key": "sim", "control": "control", "variants": [{"key": "control", "weight": 1},
                                                                        {"key": "treatment", "weight": 1}]})
    assert not has_policies(spec) and policy_results(pa.table({"type": ["inference"]}), spec) is None
    result, _ = analyze_events(pa.Table.from_pandas(pd.DataFrame(fixed)), spec)
    doc = result.model_dump(mode="json")
    assert "policies" not in doc and "policies" not in json.loads(result.model_dump_json())
    assert Results.model_validate(doc).policies is None


def test_json_shape_of_a_breakdown(sim) -> None:
    doc = _router(sim).model_dump(mode="json")
    assert list(doc) == ["variant", "kind", "requests", "units", "model_version", "exploring", "objective", "slo",
                         "arms", "notes"]
    assert list(doc["slo"][0]) == ["metric", "field", "quantile", "bound", "n", "observed", "ci", "compliance", "met"]
    assert list(doc["arms"][0]) == ["arm", "requests", "share", "share_ci", "mean_propensity", "slo_compliance", "metrics"]
    assert list(doc["arms"][0]["metrics"][0]) == ["metric", "n", "estimate", "ci"]
    with pytest.raises(ValueError, match="extra"):
        PolicyBreakdown.model_validate({**doc, "surprise": 1})


class _Store:
    """The analytics port's ``logged_events`` alone, counting its reads."""

    def __init__(self, table: pa.Table) -> None:
        self.table, self.reads = table, 0

    def logged_events(self, experiment: str) -> pa.Table:
        self.reads += 1
        return self.table


def test_results_read_logged_events_once_and_only_with_a_policy_variant(sim) -> None:
    store = _Store(read_events(sim["root"] / "events.jsonl"))
    got = policy_breakdowns(store, sim["spec"])  # type: ignore[arg-type]  # the one read it needs
    assert store.reads == 1 and got == [_router(sim)]
    plain = parse_spec({"key": "sim", "control": "control", "variants": [{"key": "control"}, {"key": "t"}]})
    assert policy_breakdowns(store, plain) is None and store.reads == 1  # type: ignore[arg-type]


def test_ablab_analyze_json_carries_the_breakdown(sim) -> None:
    import yaml
    from typer.testing import CliRunner

    from ablab.cli import app

    root: Path = sim["root"]
    spec = {"key": "sim", "control": "control", "metrics": {"primary": "accuracy"},
            "variants": [{"key": v.key, "weight": v.weight, "strategy": dict(v.strategy)} for v in sim["spec"].variants]}
    (root / "exp.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))  # arms in the policy's order
    done = CliRunner().invoke(app, ["analyze", str(root / "events.parquet"), "--config", str(root / "exp.yaml"), "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout[done.stdout.index("{"):])
    assert doc["policies"] == [_router(sim).model_dump(mode="json")]
