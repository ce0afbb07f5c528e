"""``attribution.policies`` (issue 33): the policy's gain credited to its arms (an exact sum)
and to its features (Shapley values of doubly robust values), against a simulated environment
whose truth is known: the router's gain comes from the prompt length, not from the plan."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from ablab.platform.analytics.event_files import read_events
from ablab.platform.policy.breakdown import default_metric
from ablab.platform.policy.credit import (
    MAX_FEATURES,
    blind_value,
    blinded,
    decider_probabilities,
    own_logs,
    policy_credits,
    policy_credits_from_events,
    shapley_targets,
)
from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.logs import experiment_policies, policy_features, requests_from_table
from ablab.platform.policy.model import Binning
from ablab.platform.policy.ope import LoggedRequests, estimate
from ablab.platform.policy.simulate import Environment, experiment_events, fit_after_exploring, router_policy
from ablab.platform.stats.result_models import Attribution, PolicyCredit
from ablab.platform.stats.spec import parse_spec

# accuracy[arm][plan][level]: fast is right on short prompts, expert on long ones, helpful (the
# control) in between; the plan changes nothing
PROMPT_ENV = Environment(accuracy=(
    ((0.85, 0.85, 0.45, 0.45), (0.85, 0.85, 0.45, 0.45)),
    ((0.60, 0.60, 0.60, 0.60), (0.60, 0.60, 0.60, 0.60)),
    ((0.45, 0.45, 0.85, 0.85), (0.45, 0.45, 0.85, 0.85)),
))
LOOSE_SLO = 100_000.0  # latency never binds: the router routes on accuracy alone


@pytest.fixture(scope="module")
def sim(tmp_path_factory) -> dict:
    router = router_policy(PROMPT_ENV, explore=0.1, slo_ms=LOOSE_SLO)
    decider = Decider(router, fit_after_exploring(router, PROMPT_ENV))
    events, spec = experiment_events(PROMPT_ENV, decider, np.random.default_rng(21), key="sim", n=10_000, n_units=800)
    path = tmp_path_factory.mktemp("credit") / "events.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events))
    spec = parse_spec(spec)
    table = read_events(path)
    (credit,) = policy_credits_from_events(table, spec) or []
    return {"events": events, "spec": spec, "decider": decider, "table": table, "credit": credit}


def _labels(events: list[dict], variant: str) -> list[float]:
    label = {e["trace_id"]: e["correct"] for e in events if e["type"] == "feedback"}
    return [label[e["trace_id"]] for e in events if e["type"] == "inference" and e["variant"] == variant]


def test_gain_is_the_measured_difference_and_the_arms_add_up_to_it_exactly(sim) -> None:
    c: PolicyCredit = sim["credit"]
    assert (c.variant, c.metric, c.baseline) == ("router", "accuracy", "control")
    gain = np.mean(_labels(sim["events"], "router")) - np.mean(_labels(sim["events"], "control"))
    assert c.gain.estimate == pytest.approx(gain, rel=1e-12)
    assert c.gain.ci[0] < c.gain.estimate < c.gain.ci[1]
    assert [a.arm for a in c.arms] == ["fast", "helpful", "expert"]
    assert sum(a.contribution for a in c.arms) == pytest.approx(c.gain.estimate, abs=1e-12)
    assert sum(a.share for a in c.arms) == pytest.approx(1.0, abs=1e-12)
    control = np.mean(_labels(sim["events"], "control"))
    for a in c.arms:
        assert a.contribution == pytest.approx(a.share * (a.mean - control), rel=1e-12)
        assert a.ci[0] < a.contribution < a.ci[1]


def test_the_gain_and_its_source_match_the_environments_truth(sim) -> None:
    """The router's exact value minus the control's (helpful: 0.60) is inside the measured
    gain's interval; the gain comes from the arms that route by prompt length."""
    c: PolicyCredit = sim["credit"]
    truth = PROMPT_ENV.value(sim["decider"]) - 0.60
    assert truth > 0.15
    assert c.gain.ci[0] < truth < c.gain.ci[1]
    by_arm = {a.arm: a for a in c.arms}
    assert by_arm["helpful"].share < 0.15  # only the explore floor
    assert by_arm["fast"].contribution > 0.05 and by_arm["expert"].contribution > 0.05


def test_shapley_credit_lands_on_the_prompt_length_not_the_plan(sim) -> None:
    c: PolicyCredit = sim["credit"]
    credits = {f.feature: f for f in c.features}
    assert list(credits) == ["prompt_tokens", "attr.plan"]
    prompt, plan = credits["prompt_tokens"], credits["attr.plan"]
    # the truth: the served router's exact value minus its exact value when it sees the median
    # prompt (400 tokens, a short one: everything goes to fast), the plan being irrelevant
    decider: Decider = sim["decider"]
    plan_i, level, prob = PROMPT_ENV.context_grid()
    acc = np.asarray(PROMPT_ENV.accuracy)
    index = [PROMPT_ENV.arms.index(a) for a in decider.arms]
    feats = PROMPT_ENV.features(plan_i, level)
    blind = decider.probability_matrix({**feats, "prompt_tokens": np.full(plan_i.size, 400.0)}, plan_i.size)
    blind_value_ = float(prob @ sum(blind[:, j] * acc[a, plan_i, level] for j, a in enumerate(index)))
    truth = PROMPT_ENV.value(decider) - blind_value_
    assert truth > 0.08
    assert prompt.ci[0] < truth < prompt.ci[1] and prompt.ci[0] > 0.05
    assert plan.ci[0] < 0 < plan.ci[1] or abs(plan.credit) < 0.01
    assert abs(plan.credit) < 0.2 * prompt.credit
    # routing: the router beats the best single arm (each arm is right on only part of the traffic)
    assert c.routing.ci[0] > 0


def test_feature_credits_add_up_to_full_minus_blind(sim) -> None:
    """Σ credits = V(full) − V(blind to every feature), each V by the same doubly robust
    estimator on the policy's own requests."""
    spec = sim["spec"]
    policies = experiment_policies(spec)
    policy = policies["router"]
    logs = requests_from_table(sim["table"], spec, features=policy_features(spec))
    own = own_logs(logs, "router", policy, 0.5, "correct")
    probabilities, _ = decider_probabilities(policy, own, lower_is_better=False, source="correct")
    binning = Binning.fit(policy.features, own.features, own.n)
    blind = {f: blind_value(f, own.features[f]) for f in policy.features}

    def value(target: np.ndarray) -> float:
        return float(estimate(own, target, "correct", binning=binning)["dr"]["estimate"])

    full = value(probabilities(own.features))
    none = value(probabilities(blinded(own.features, blind, own.n)))
    assert sum(f.credit for f in sim["credit"].features) == pytest.approx(full - none, abs=1e-12)
    assert policy_credits(logs, spec, policies) == [sim["credit"]]


def test_shapley_targets_of_a_known_game() -> None:
    """Additive parts go whole to their feature; an interaction is split equally; the sum is
    π(all) − π(none) exactly."""
    parts = {"a": np.array([[0.3, -0.3]]), "b": np.array([[-0.1, 0.1]]), "c": np.zeros((1, 2))}
    both = np.array([[0.2, -0.2]])  # only when a and b are both seen

    def pi(seen: frozenset[str]) -> np.ndarray:
        out = np.array([[0.5, 0.5]]) + sum((parts[f] for f in seen), np.zeros((1, 2)))
        return out + (both if {"a", "b"} <= seen else 0)

    got = shapley_targets(["a", "b", "c"], pi)
    np.testing.assert_allclose(got["a"], parts["a"] + both / 2, atol=1e-15)
    np.testing.assert_allclose(got["b"], parts["b"] + both / 2, atol=1e-15)
    np.testing.assert_allclose(got["c"], 0.0, atol=1e-15)
    np.testing.assert_allclose(sum(got.values()), pi(frozenset("abc")) - pi(frozenset()), atol=1e-15)


def test_blind_values() -> None:
    assert blind_value("prompt_tokens", [100, 400, np.nan, 1200, 3000]) == 800.0
    assert math.isnan(blind_value("max_tokens", [np.nan]))
    assert blind_value("attr.plan", ["pro", "free", None, "pro", "free", ""]) == "free"  # a tie: the first in order
    assert blind_value("attr.plan", [None, ""]) is None


def test_more_than_six_features_get_a_note_and_no_feature_credit() -> None:
    names = [f"attr.f{i}" for i in range(MAX_FEATURES + 1)]
    rule = {"kind": "rule", "arms": {"x": {}, "y": {}}, "default": "x", "explore": 0.2,
            "rules": [{"when": {f: {"eq": "1"} for f in names}, "arm": "y"}]}
    spec = parse_spec({"key": "e", "control": "a", "metrics": {"primary": ["e2e_ms_p95", "accuracy"]},
                       "variants": [{"key": "a"}, {"key": "r", "strategy": {"policy": rule}}]})
    rng = np.random.default_rng(0)
    n = 400
    action = np.r_[np.zeros(n // 2, dtype=np.int64), rng.integers(1, 3, n // 2)]
    logs = LoggedRequests(actions=("a", "r.x", "r.y"), action=action, propensity=np.where(action == 0, 0.5, 0.25),
                          unit=np.arange(n, dtype=np.int64) % 40,
                          features={f: rng.choice(["0", "1"], n).astype(object) for f in names},
                          values={"correct": rng.integers(0, 2, n).astype(float)})
    (c,) = policy_credits(logs, spec, experiment_policies(spec))
    assert c.features == [] and any(f"{MAX_FEATURES + 1} features" in n for n in c.notes)
    # a rule has no objective: the first primary metric with a value per request
    assert c.metric == default_metric(spec, experiment_policies(spec)["r"]) == "accuracy"
    assert c.gain.estimate is not None and c.routing.estimate is not None


def test_attribution_json_shape_and_absence() -> None:
    doc = Attribution(experiment="e", control="a").model_dump(mode="json")
    assert "policies" not in doc
    credit = PolicyCredit(variant="r", metric="accuracy", baseline="a").model_dump(mode="json")
    assert list(credit) == ["variant", "metric", "baseline", "gain", "arms", "routing", "features", "notes"]
    assert list(credit["gain"]) == ["estimate", "ci"]
    assert policy_credits_from_events(pa.table({"type": ["inference"]}),
                                      parse_spec({"key": "e", "control": "a", "variants": [{"key": "a"}, {"key": "b"}]})) is None


def test_a_router_without_enough_logs_is_evaluated_as_uniform(env) -> None:
    router = router_policy(env, explore=0.1)
    events, spec = experiment_events(env, Decider(router), np.random.default_rng(2), key="cold", n=120, n_units=12)
    (c,) = policy_credits_from_events(pa.Table.from_pandas(pd.DataFrame(events)), parse_spec(spec)) or []
    assert any("evaluated as uniform" in n for n in c.notes)
    # a uniform decider sees no feature: every credit is zero
    assert all(f.credit == pytest.approx(0.0, abs=1e-12) for f in c.features)


def test_attribution_of_an_experiment_with_a_policy_variant(sim) -> None:
    """A policy variant's factor level is its whole policy (a mapping): the factorial design
    takes it like any level, and ``attribution.policies`` goes beside it."""
    from ablab.platform.stats.attribution import attribution_results
    from ablab.platform.stats.offline import aggregate_events

    spec = sim["spec"]
    result = attribution_results(spec=spec, stats=aggregate_events(sim["table"], spec).stats)
    effects = result.factorial["accuracy"].effects
    assert [e.factors for e in effects] == [["policy"]] and effects[0].estimate == pytest.approx(
        sim["credit"].gain.estimate, rel=1e-9)  # one factor, two variants: the effect is the measured gain
    result.policies = [sim["credit"]]
    assert Attribution.model_validate(result.model_dump(mode="json")).policies == [sim["credit"]]
