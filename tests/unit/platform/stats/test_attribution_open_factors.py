"""Attribution over gateway and declared factors: planted effects come back exactly."""

from __future__ import annotations

import itertools

import pytest

from ablab.platform.stats.attribution import factorial_analysis, strategy_levels
from ablab.platform.stats.spec import parse_spec

PROMPTS = {"A": "Answer briefly.", "B": "You are a careful assistant. Think step by step before you answer the question."}


def _spec():
    variants = []
    for temp, prompt, engine in itertools.product((0.2, 0.8), "AB", ("vllm", "sglang")):
        strategy = {"params": {"temperature": temp}, "system_prompt": PROMPTS[prompt]}
        if engine != "vllm":  # the control leaves the declared factor at its default
            strategy["engine"] = engine
        variants.append({"key": f"t{temp}-{prompt}-{engine}", "weight": 1, "strategy": strategy})
    return parse_spec({"key": "open", "control": variants[0]["key"], "variants": variants})


def _truth(levels: dict) -> float:
    hot, brief, sglang = levels["params.temperature"] == 0.8, levels["system_prompt"] == PROMPTS["A"], levels["engine"] == "sglang"
    return 100 + 10 * hot - 20 * (not brief) + 5 * sglang + 8 * (hot and sglang)


def test_planted_effects_interaction_and_shapley_over_open_factors() -> None:
    spec = _spec()
    levels = strategy_levels(spec, {"engine": "vllm"})
    assert levels[spec.control]["engine"] == "vllm"  # filled from the declared default
    estimates = {v: _truth(lv) for v, lv in levels.items()}
    out = factorial_analysis(levels=levels, estimates=estimates, variances={v: 1.0 for v in levels},
                             control=spec.control, lower_is_better=False)
    assert sorted(out["factors"]) == ["engine", "params.temperature", "system_prompt"]
    assert out["design"] == "saturated"
    effects = {e["term"]: e["estimate"] for e in out["effects"]}
    assert effects["params.temperature=0.8"] == pytest.approx(10)
    # a long level is cut in the term's name (the Shapley rows keep it whole)
    assert effects["system_prompt=You are a careful assistant. Think step by st..."] == pytest.approx(-20)
    assert effects["engine=sglang"] == pytest.approx(5)
    interactions = {t: e for t, e in effects.items() if " × " in t}
    assert interactions.pop("engine=sglang × params.temperature=0.8") == pytest.approx(8)
    assert all(abs(e) < 1e-9 for e in interactions.values())
    shapley = out["shapley"]
    assert shapley["best_variant"] == "t0.8-A-sglang"
    shares = {s["factor"]: s["estimate"] for s in shapley["shares"]}
    assert shares == pytest.approx({"params.temperature": 14.0, "engine": 9.0})  # ½(10+18), ½(5+13)
    assert shapley["sum_of_shares"] == pytest.approx(shapley["total"]["estimate"]) == pytest.approx(23)


def test_without_declared_defaults_an_omitted_factor_is_its_own_level() -> None:
    levels = strategy_levels(_spec())
    assert {lv.get("engine") for lv in levels.values()} == {None, "sglang"}
    assert {lv.get("model") for lv in levels.values()} == {None}
