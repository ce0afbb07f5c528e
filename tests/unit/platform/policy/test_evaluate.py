"""Decisions: probabilities that sum to 1, the exploration floor, determinism, the uniform
start, rules, and the vectorized path equal to the per-request one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablab.platform.policy.evaluate import Decider, recompute_propensity
from ablab.platform.policy.model import Binning, NotEnoughData, PolicyModel, fit_model
from ablab.platform.policy.simulate import router_policy
from ablab.platform.policy.spec import parse_policy


def test_without_a_model_the_router_is_uniform_and_says_so(router) -> None:
    d = Decider(router).decide({"prompt_tokens": 10}, "trace-1")
    assert d.uniform and d.model_version == f"uniform:{router.content_hash}"
    assert d.probabilities == pytest.approx((1 / 3,) * 3) and d.propensity == pytest.approx(1 / 3)


def test_probabilities_keep_the_floor_and_sum_to_one(router, model) -> None:
    decider = Decider(router, model)
    for pt in (0, 100, 400, 1200, 3000, 10**6, None):
        for plan in ("free", "pro", "enterprise", None):
            p = decider.probabilities({"prompt_tokens": pt, "attr.plan": plan})
            assert math.fsum(p) == pytest.approx(1.0, abs=1e-12)
            assert min(p) == pytest.approx(router.explore)
            assert max(p) == pytest.approx(1 - router.explore * (len(p) - 1))


def test_the_router_picks_what_the_environment_rewards(router, model) -> None:
    # the environment (simulate.Environment): expert is best on pro but misses the SLO past
    # ~600 tokens; helpful is best on free up to 1200; only fast meets the SLO at 3000
    d = Decider(router, model)

    def best(pt: int, plan: str) -> str:
        p = d.probabilities({"prompt_tokens": pt, "attr.plan": plan})
        return d.arms[int(np.argmax(p))]

    assert best(100, "pro") == "expert" and best(400, "pro") == "expert"
    assert best(100, "free") == "helpful" and best(1200, "free") == "helpful"
    assert best(3000, "pro") == "fast" and best(3000, "free") == "fast"


def test_decisions_are_deterministic_and_follow_the_probabilities(router, model) -> None:
    d = Decider(router, model, salt="exp:router")
    features = {"prompt_tokens": 100, "attr.plan": "pro"}
    assert d.decide(features, "t-42") == Decider(router, PolicyModel.from_json(model.to_json()), salt="exp:router").decide(
        features, "t-42")
    arms = [d.decide(features, f"t-{i}").arm for i in range(20_000)]
    share = {a: arms.count(a) / len(arms) for a in d.arms}
    for a, p in zip(d.arms, d.probabilities(features)):
        assert share[a] == pytest.approx(p, abs=0.01)


def test_model_json_round_trip_keeps_the_version(router, model) -> None:
    text = model.to_json()
    again = PolicyModel.from_json(text)
    assert again.version == model.version and again.to_json() == text
    with pytest.raises(ValueError, match="does not match"):
        PolicyModel.from_json(text.replace('"trained_on":', '"trained_on":1'))
    other = router_policy(explore=0.1)
    with pytest.raises(ValueError, match="fitted for policy"):
        Decider(other, model)


def test_a_model_needs_every_arm(router) -> None:
    n = 300
    arm = np.zeros(n, dtype=np.int64)  # only the first arm was ever served
    with pytest.raises(NotEnoughData, match="helpful"):
        fit_model(router, arm, {"prompt_tokens": np.full(n, 10.0)}, {"ttft_ms": np.full(n, 100.0)}, np.ones(n),
                  lower_is_better=False)


def test_propensity_recomputed_from_logged_features_and_version(router, model) -> None:
    stored = {model.version: model.to_json()}  # what the API serves by version
    d = Decider(router, model, salt="s")
    rng = np.random.default_rng(3)
    for i in range(300):
        features = {"prompt_tokens": int(rng.integers(0, 4000)), "attr.plan": str(rng.choice(["free", "pro"]))}
        dec = d.decide(features, f"t{i}")
        logged = {"arm": dec.arm, "propensity": dec.propensity, "policy_version": dec.model_version, **features}
        again = recompute_propensity(router, PolicyModel.from_json(stored[logged["policy_version"]]),
                                     {k: logged[k] for k in ("prompt_tokens", "attr.plan")}, logged["arm"])
        assert again == logged["propensity"]


def test_vectorized_probabilities_equal_the_per_request_ones(router, model) -> None:
    rule = parse_policy({"kind": "rule", "arms": {"fast": {}, "helpful": {}, "expert": {}}, "explore": 0.02,
                         "rules": [{"when": {"prompt_tokens": {"gt": 1000}}, "arm": "fast"},
                                   {"when": {"attr.plan": {"in": ["pro"]}, "prompt_tokens": {"ne": 7}}, "arm": "expert"}],
                         "default": "helpful"})
    rng = np.random.default_rng(0)
    n = 500
    pt = rng.integers(0, 3000, n).astype(float)
    pt[::17] = np.nan
    pt[::23] = 7
    plan = np.array([None, "free", "pro", "x"], dtype=object)[rng.integers(0, 4, n)]
    for decider in (Decider(router, model), Decider(rule), Decider(router)):
        matrix = decider.probability_matrix({"prompt_tokens": pt, "attr.plan": plan}, n)
        rows = [decider.probabilities({"prompt_tokens": None if np.isnan(x) else x, "attr.plan": p}) for x, p in zip(pt, plan)]
        assert np.array_equal(matrix, np.asarray(rows))


def test_rules_take_the_first_match_and_absent_features_fail_conditions() -> None:
    rule = Decider(parse_policy({"kind": "rule", "arms": {"a": {}, "b": {}, "c": {}},
                                 "rules": [{"when": {"prompt_tokens": {"ge": 100}}, "arm": "a"},
                                           {"when": {"attr.plan": {"eq": "pro"}}, "arm": "b"}],
                                 "default": "c"}))
    assert rule.decide({"prompt_tokens": 100, "attr.plan": "pro"}, "x").arm == "a"
    assert rule.decide({"prompt_tokens": 99, "attr.plan": "pro"}, "x").arm == "b"
    assert rule.decide({"attr.plan": "pro"}, "x").arm == "b"
    assert rule.decide({"prompt_tokens": 5}, "x") .arm == "c"
    assert rule.decide({}, "x").propensity == 1.0


def test_binning_gives_few_levels_their_own_bins_and_caps_cells() -> None:
    b = Binning.fit(["prompt_tokens"], {"prompt_tokens": np.array([10.0, 10, 50, 90, 90])}, 5)
    assert b.edges == ((50.0, 90.0),)
    assert b.describe(b.cell_of({"prompt_tokens": 60})) == {"prompt_tokens": "[50, 90)"}
    many = {f"attr.a{i}": np.array([str(j) for j in range(20)], dtype=object) for i in range(4)}
    big = Binning.fit(["prompt_tokens", *many], {"prompt_tokens": np.arange(20.0), **many}, 20)
    assert big.n_cells > 0 and all(v is None or len(v) <= 8 for v in big.values)
