"""One strategy has one id everywhere: the ``strategy`` an event carries is the registry's
``strategy_hash`` of that strategy, whether its built-in defaults are spelled out (a fixed
variant as the registry stores it) or left out (a policy arm, a shadow, an SDK caller's
mapping), so a router's arm and the fixed variant serving the same strategy are one
strategy in the events."""

from __future__ import annotations

import httpx
import pytest

from ablab.platform.gateway.metering import strategy_id
from ablab.platform.strategy import content_hash, open_strategy
from ablab_testing.gateway_harness import gateway_for

TERSE = {"system_prompt": "Be terse.", "params": {"temperature": 0.0}}


@pytest.mark.parametrize("strategy", [
    TERSE,
    {"backend": "smollm2", "system_prompt": "Answer with one word only.", "params": {"temperature": 0.0}},
    {"sparse_ffn_k": 128, "compression": {"method": "entropy", "tau": 0.18, "window": 32}},
    {"params": {"temperature": 0.2}, "cot_depth": 2},
    {},
])
def test_a_strategy_with_its_defaults_spelled_out_has_the_same_id_as_without(strategy: dict) -> None:
    stored = open_strategy(strategy).model_dump(mode="json")  # what the registry keeps for a fixed variant
    assert stored != strategy or strategy == {}  # the dump adds the built-in defaults
    assert strategy_id(stored) == strategy_id(strategy) == content_hash(strategy)


def test_a_different_strategy_has_a_different_id_and_an_unparseable_one_still_has_one() -> None:
    assert strategy_id(TERSE) != strategy_id({**TERSE, "params": {"temperature": 1.0}})
    odd = {"sparse_ffn_k": "many"}  # the strategy model refuses it: a hash of its JSON
    assert strategy_id(odd) == strategy_id(dict(odd)) and len(strategy_id(odd)) == 32


def test_a_router_arm_and_the_fixed_variant_serving_its_strategy_log_one_strategy_id(backend, tmp_path) -> None:
    policy = {"kind": "rule", "arms": {"terse": TERSE, "helpful": {"system_prompt": "Help."}},
              "rules": [{"when": {"max_tokens": {"le": 100}}, "arm": "terse"}], "default": "helpful", "explore": 0.2}
    variants = {"terse-t0": open_strategy(TERSE).model_dump(mode="json"), "router": {"policy": policy}}
    ids: dict[str, set[str]] = {}
    with gateway_for(backend.url, tmp_path, variants) as gw, httpx.Client(base_url=gw.url, timeout=30) as client:
        for i in range(40):
            r = client.post("/v1/chat/completions", headers={"X-Ablab-Unit": f"u{i}"},
                            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
            assert r.status_code == 200, r.text
            trace = r.headers["x-ablab-trace-id"]
            ev = next(e for e in gw.events() if e["trace_id"] == trace and e["type"] == "inference")
            key = ev["variant"] if ev["variant"] != "router" else f"router.{ev['arm']}"
            ids.setdefault(key, set()).add(ev["strategy"])
    assert ids["terse-t0"] == ids["router.terse"] == {content_hash(TERSE)}
    assert ids["router.helpful"] == {content_hash({"system_prompt": "Help."})}
