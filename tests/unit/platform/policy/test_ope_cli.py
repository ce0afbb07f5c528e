"""``ablab ope``: the offline face of off-policy evaluation, on event files of a simulated
experiment (a fixed control and a router variant that logs arm, propensity and version)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from ablab.cli import app
from ablab.platform.analytics.event_files import read_events
from ablab.platform.policy.candidate import ope_from_events
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.simulate import experiment_events
from ablab.platform.stats.spec import parse_spec

runner = CliRunner()


@pytest.fixture(scope="module")
def files(env, router, model, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ope")
    events, spec = experiment_events(env, Decider(router, model), np.random.default_rng(5), key="sim", n=3000, n_units=300)
    spec["metrics"] = {"primary": "accuracy"}
    (root / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    pd.DataFrame(events).to_parquet(root / "events.parquet", index=False)
    (root / "exp.yaml").write_text(yaml.safe_dump(spec))
    # today's fixed-variant logs: no arm, no propensity (the weights give it), weights 1:3
    fixed = [{k: v for k, v in e.items() if k not in ("arm", "propensity", "policy_version")} for e in events]
    for e in fixed:
        if e.get("variant") == "router":
            e["variant"] = "treatment"
    (root / "fixed.jsonl").write_text("\n".join(json.dumps(e) for e in fixed))
    (root / "fixed.yaml").write_text(yaml.safe_dump({"key": "sim", "control": "control", "metrics": {"primary": "accuracy"},
                                                     "variants": [{"key": "control", "weight": 1}, {"key": "treatment", "weight": 3}]}))
    for name, policy in {
        "control": {"kind": "fixed", "arm": "control"},
        "expert": {"kind": "fixed", "arm": "expert"},
        "nope": {"kind": "fixed", "arm": "nope"},
        "rule": {"kind": "rule", "arms": {"fast": {}, "helpful": {}, "expert": {}}, "default": "helpful",
                 "rules": [{"when": {"prompt_tokens": {"gt": 1000}}, "arm": "fast"}]},
        "bad": {"kind": "rule", "arms": {"fast": {}}, "default": "fast",
                "rules": [{"when": {"prompt_tokens": {"lt": 0}}, "arm": "fast"}]},
    }.items():
        (root / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    return {"root": root}


def _ope(files, events: str, config: str, policy: str, *extra: str):
    root = files["root"]
    return runner.invoke(app, ["ope", str(root / events), "--config", str(root / config), "--policy", str(root / policy),
                               "--json", *extra])


def test_json_equals_the_shared_function_and_parquet_equals_jsonl(files) -> None:
    root = files["root"]
    res = _ope(files, "events.jsonl", "exp.yaml", "rule.yaml")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    spec = parse_spec(yaml.safe_load((root / "exp.yaml").read_text()))
    assert doc == json.loads(json.dumps(ope_from_events(read_events(root / "events.jsonl"), spec,
                                                         yaml.safe_load((root / "rule.yaml").read_text()))))
    assert {e: doc[e]["estimate"] is not None for e in ("ips", "snips", "dr")} == {"ips": True, "snips": True, "dr": True}
    assert doc["n"] == 3000 and doc["metric"] == "accuracy"
    assert {row["arm"] for row in doc["logged"]} == {"control", "router.fast", "router.helpful", "router.expert"}
    via_parquet = json.loads(_ope(files, "events.parquet", "exp.yaml", "rule.yaml").stdout)
    for e in ("ips", "snips", "dr"):
        assert via_parquet[e]["estimate"] == pytest.approx(doc[e]["estimate"], abs=1e-12)
        assert via_parquet[e]["ci"] == pytest.approx(doc[e]["ci"], abs=1e-12)


def test_a_bare_arm_name_finds_the_router_arm(files, env) -> None:
    doc = json.loads(_ope(files, "events.jsonl", "exp.yaml", "expert.yaml").stdout)
    assert doc["candidate"]["kind"] == "fixed" and 0 < doc["ess"] < doc["n"]
    measured = next(r for r in doc["logged"] if r["arm"] == "router.expert")
    # the router served expert where expert is good (pro units, short prompts), so its measured
    # mean overstates "always expert"; the estimates re-weigh to every context and cover the truth
    truth = float(np.dot(np.outer(env.plan_p, env.level_p).ravel(), np.asarray(env.accuracy)[2].ravel()))
    assert measured["estimate"] > truth + 0.05
    for e in ("ips", "snips", "dr"):
        assert doc[e]["ci"][0] <= truth <= doc[e]["ci"][1], (e, doc[e], truth)


def test_todays_fixed_variant_logs_use_the_weight_shares(files) -> None:
    doc = json.loads(_ope(files, "fixed.jsonl", "fixed.yaml", "control.yaml").stdout)
    control = next(r for r in doc["logged"] if r["arm"] == "control")
    # every weight is 1/0.25 = 4 on control rows and 0 elsewhere: SNIPS is control's own mean
    assert doc["snips"]["estimate"] == pytest.approx(control["estimate"], abs=1e-12)
    assert doc["ess"] == pytest.approx(control["n"])
    assert doc["ips"]["estimate"] == pytest.approx(4 * control["estimate"] * control["n"] / doc["n"], abs=1e-12)


def test_refusals_name_the_field(files) -> None:
    res = _ope(files, "events.jsonl", "exp.yaml", "nope.yaml")
    assert res.exit_code == 1 and "arm: 'nope' is never logged" in res.output
    res = _ope(files, "events.jsonl", "exp.yaml", "bad.yaml")
    assert res.exit_code == 1 and "policy.rules.0.when.prompt_tokens" in res.output
    res = _ope(files, "events.jsonl", "exp.yaml", "rule.yaml", "--metric", "ttft_ms_p95")
    assert res.exit_code == 1 and "metric:" in res.output
    res = _ope(files, "missing.jsonl", "exp.yaml", "rule.yaml")
    assert res.exit_code == 1 and "does not exist" in res.output


def test_a_model_of_another_policy_is_refused(files, model, tmp_path) -> None:
    root = files["root"]
    (tmp_path / "model.json").write_text(model.to_json())
    other = {"kind": "slo_router", "arms": {"fast": {}, "helpful": {}, "expert": {}}, "features": ["prompt_tokens"],
             "slo": {"ttft_ms_p95": 300}, "objective": "accuracy", "explore": 0.05}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    res = runner.invoke(app, ["ope", str(root / "events.jsonl"), "--config", str(root / "exp.yaml"),
                              "--policy", str(tmp_path / "other.yaml"), "--model", str(tmp_path / "model.json")])
    assert res.exit_code == 1 and "model: model" in res.output and "fitted for policy" in res.output


def test_the_logging_router_with_its_own_model_is_estimated_at_its_measured_value(files, router, model, tmp_path) -> None:
    root = files["root"]
    (tmp_path / "model.json").write_text(model.to_json())
    (tmp_path / "router.yaml").write_text(yaml.safe_dump(router.model_dump(mode="json")))
    res = runner.invoke(app, ["ope", str(root / "events.jsonl"), "--config", str(root / "exp.yaml"),
                              "--policy", str(tmp_path / "router.yaml"), "--model", str(tmp_path / "model.json"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["candidate"]["model"] == model.version
    # the candidate is the router variant's own policy: its weights are 1/share on router rows,
    # 0 on control, so SNIPS is the router variant's measured accuracy exactly
    router_rows = [r for r in doc["logged"] if r["arm"].startswith("router.")]
    measured = sum(r["estimate"] * r["n"] for r in router_rows) / sum(r["n"] for r in router_rows)
    assert doc["snips"]["estimate"] == pytest.approx(measured, abs=1e-12)
    assert doc["support"]["warning"] is None


def test_a_bad_policy_variant_in_the_config_names_its_field(files, tmp_path) -> None:
    root = files["root"]
    spec = yaml.safe_load((root / "exp.yaml").read_text())
    spec["variants"][1]["strategy"]["policy"]["explore"] = 2
    (tmp_path / "bad-exp.yaml").write_text(yaml.safe_dump(spec))
    res = runner.invoke(app, ["ope", str(root / "events.jsonl"), "--config", str(tmp_path / "bad-exp.yaml"),
                              "--policy", str(root / "control.yaml")])
    assert res.exit_code == 1 and "variants[1].strategy.policy.explore" in res.output, res.output
