"""The gateway's prompt strategies as declared factors (issue #34 item 3): stored and published
as set, listed by ``GET /v1/factors`` with their fields, and bad settings refused with a 422
naming the field — a slot pattern RE2 refuses, a budget that leaves no hard prefix, a window
or τ out of range."""

from __future__ import annotations

from typing import Any

import pytest

from ablab.platform.strategy import content_hash

GOOD = {"dialogue_state": {"slots": {"city": r"(?i)i live in (\w+)", "order": r"order #\d+"}},
        "prompt_split": {"latency_budget_ms": 150, "prefill_tps": 400, "delimiter": "---soft---"},
        "context_prune": {"window": 16, "tau": 0.25}}


def _body(strategy: dict[str, Any]) -> dict[str, Any]:
    return {"key": "prompts", "name": "p", "traffic": 1, "control": "a",
            "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": strategy}]}


def test_prompt_strategies_are_stored_published_and_listed(api) -> None:
    client, auth = api
    r = client.post("/v1/experiments", json=_body(GOOD), headers={"Authorization": auth["editor"]})
    assert r.status_code == 201, r.text
    stored = r.json()["variants"][1]["strategy"]
    assert stored["dialogue_state"] == {"slots": GOOD["dialogue_state"]["slots"], "roles": ["user"],
                                        "header": "Known facts from earlier in this conversation:"}
    assert stored["prompt_split"] == {"prefill_tps": 400, "latency_budget_ms": 150, "delimiter": "---soft---", "keep": "end"}
    assert stored["context_prune"] == {"window": 16, "tau": 0.25, "scope": "last_user"}
    assert r.json()["variants"][1]["strategy_hash"] == content_hash(GOOD) != content_hash({})
    assert "dialogue_state" not in r.json()["variants"][0]["strategy"]  # unset gateway factors stay absent
    client.post("/v1/experiments/prompts/start", headers={"Authorization": auth["editor"]}).raise_for_status()
    payload = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]}).json()
    exp = next(e for e in payload["experiments"] if e["key"] == "prompts")
    assert next(v for v in exp["variants"] if v["key"] == "b")["strategy"]["context_prune"]["tau"] == 0.25
    factors = {f["name"]: f for f in client.get("/v1/factors", headers={"Authorization": auth["editor"]}).json()["items"]}
    for name in ("dialogue_state", "prompt_split", "context_prune"):
        assert factors[name]["origin"] == "gateway", factors[name]
    assert "latency_budget_ms" in str(factors["prompt_split"])


@pytest.mark.parametrize(("strategy", "field"), [
    ({"dialogue_state": {"slots": {"city": r"(a)\1"}}}, "dialogue_state.slots.city"),  # a backreference: RE2 refuses
    ({"dialogue_state": {"slots": {"city": r"(?<=in )\w+"}}}, "dialogue_state.slots.city"),  # lookbehind
    ({"dialogue_state": {"slots": {"city": r"(\w+) (\w+)"}}}, "dialogue_state.slots.city"),  # two capture groups
    ({"dialogue_state": {"slots": {"city": "x" * 300}}}, "dialogue_state.slots.city"),
    ({"dialogue_state": {"slots": {"City": "x"}}}, "dialogue_state.slots.City"),
    ({"dialogue_state": {"slots": {}}}, "dialogue_state.slots"),
    ({"dialogue_state": {"slots": {"a": "x"}, "roles": ["system"]}}, "dialogue_state.roles"),
    ({"prompt_split": {"latency_budget_ms": 5, "prefill_tps": 100}}, "prompt_split.latency_budget_ms"),  # 0.5 tokens
    ({"prompt_split": {"latency_budget_ms": 0}}, "prompt_split.latency_budget_ms"),
    ({"prompt_split": {"prefill_tps": 100}}, "prompt_split.latency_budget_ms"),
    ({"prompt_split": {"latency_budget_ms": 100, "prefill_tps": 0}}, "prompt_split.prefill_tps"),
    ({"prompt_split": {"latency_budget_ms": 100, "delimiter": "  "}}, "prompt_split.delimiter"),
    ({"prompt_split": {"latency_budget_ms": 100, "keep": "middle"}}, "prompt_split.keep"),
    ({"context_prune": {"window": 0}}, "context_prune.window"),
    ({"context_prune": {"window": 5000}}, "context_prune.window"),
    ({"context_prune": {"tau": -0.1}}, "context_prune.tau"),
    ({"context_prune": {"tau": 1.5}}, "context_prune.tau"),
    ({"context_prune": {"tau": 0.2, "windw": 8}}, "context_prune.windw"),
])
def test_bad_prompt_strategies_are_422_naming_the_field(api, strategy: dict, field: str) -> None:
    client, auth = api
    r = client.post("/v1/experiments", json=_body(strategy), headers={"Authorization": auth["editor"]})
    assert r.status_code == 422, r.text
    assert r.json()["field"].startswith(f"variants.1.strategy.{field}"), r.json()


def test_a_prompt_strategy_is_one_factor_for_attribution_and_the_dashboard() -> None:
    from ablab.dashboards import forms
    from ablab.platform.strategy import open_strategy

    flat = open_strategy(GOOD).factors()
    assert flat["context_prune"] == {"window": 16, "tau": 0.25, "scope": "last_user"}
    assert not any(k.startswith(("dialogue_state.", "prompt_split.", "context_prune.")) for k in flat)
    assert "context_prune" not in open_strategy({}).factors()  # unset: level none
    # the dashboard's JSON picker gets the whole mapping as the level and gives it back as set
    nested = forms.strategy_from_factors({"context_prune": flat["context_prune"], "prompt_split": {}})
    assert nested == {"context_prune": flat["context_prune"]}
