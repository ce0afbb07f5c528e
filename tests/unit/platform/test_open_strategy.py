"""Open strategies: gateway and declared factors, validation against a catalog, stable hashes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ablab.platform.registry.factors.catalog import FactorCatalog, FactorDef
from ablab.platform.strategy import OpenStrategy, Strategy, content_hash, open_strategy

# Computed on main at 3af97ea, before open strategies existed: every stored strategy must
# keep its hash, or results would split one variant's history in two.
PINNED = {
    "19058e0a7156d2bd": {},
    "2adc017e59c06de6": {"prompt_template": "structured"},
    "f83d4424e90281a9": {"compression": {"method": "entropy", "tau": 0.25, "window": 16}},
    "ecd282d29948674b": {"lora_adapter": "auto", "cot_depth": 3},
    "53a6dd61569f0827": {"sparse_ffn_k": 32, "kv_shards": 4, "precision": "bf16"},
    "3594aee45a4e874d": {"batching": {"policy": "adaptive", "max_batch": 16, "ttft_slo_ms": 200, "shed_late": True}},
    "19ce7f68f6b0e9e4": {"validation_threshold": 0.6, "prompt_template": "cot"},
}

CATALOG = FactorCatalog([
    FactorDef("engine", "enum", values=("vllm", "sglang"), default="vllm"),
    FactorDef("beam", "integer", min=1, max=8),
    FactorDef("cache", "boolean"),
    FactorDef("params.temperature", "number", min=0, max=2),
])


@pytest.mark.parametrize(("digest", "body"), PINNED.items())
def test_existing_strategies_keep_their_hash(digest, body) -> None:
    assert Strategy.model_validate(body).content_hash == digest
    assert OpenStrategy.model_validate(body).content_hash == digest
    stored = OpenStrategy.model_validate(body).model_dump(mode="json")  # what the registry stores
    assert content_hash(stored) == digest and "params" not in stored and "backend" not in stored


def test_gateway_and_declared_factors_enter_the_hash_only_when_set() -> None:
    assert content_hash({"backend": None, "params": {}}) == "19058e0a7156d2bd"
    hashes = {content_hash(s) for s in ({}, {"backend": "a"}, {"model": "m"}, {"system_prompt": "Be brief."},
                                        {"params": {"temperature": 0.2}}, {"engine": "vllm"})}
    assert len(hashes) == 6
    assert content_hash({"params": {"temperature": 1.0}}) == content_hash({"params": {"temperature": 1}})
    assert content_hash({"engine": "vllm", "backend": "a"}) == content_hash({"backend": "a", "engine": "vllm"})


def test_without_a_catalog_only_the_form_is_checked() -> None:
    assert open_strategy({"engine": "anything"}).declared() == {"engine": "anything"}
    for bad, where in [({"Engine": 1}, "Engine"), ({"engine": {"a": 1}}, "engine"), ({"engine": None}, "engine"),
                       ({"params": {"model": "x"}}, "params.model"), ({"params": {"messages": []}}, "params.messages"),
                       ({"params": {"x": {"nested": 1}}}, "params.x"), ({"compression": {"metod": "entropy"}}, "metod"),
                       ({"params": {"t": float("nan")}}, "params.t")]:
        with pytest.raises(ValidationError, match=where):
            open_strategy(bad)


def test_with_a_catalog_undeclared_factors_and_bad_values_are_refused_by_name() -> None:
    ok = open_strategy({"engine": "sglang", "beam": 4, "cache": True, "params": {"temperature": 0.7, "top_k": 5}}, factors=CATALOG)
    assert ok.declared() == {"engine": "sglang", "beam": 4, "cache": True}
    cases = [
        ({"engin": "vllm"}, "factor 'engin' is not declared (did you mean 'engine'?)"),
        ({"engine": "tgi"}, "engine='tgi' is not allowed; allowed: one of 'vllm', 'sglang'"),
        ({"beam": 9}, "beam=9 is not allowed; allowed: an integer from 1 to 8"),
        ({"beam": 2.5}, "allowed: an integer from 1 to 8"),
        ({"cache": 1}, "cache=1 is not allowed; allowed: true or false"),
        ({"params": {"temperature": 2.5}}, "params.temperature=2.5 is not allowed; allowed: a number from 0 to 2"),
    ]
    for body, message in cases:
        with pytest.raises(ValidationError) as info:
            open_strategy(body, factors=CATALOG)
        assert message in str(info.value)
    assert [n for n, _ in CATALOG.problems(open_strategy({"engine": "x", "zz": 1}))] == ["engine", "zz"]


def test_flattening_covers_gateway_and_declared_factors() -> None:
    flat = open_strategy({"backend": "b", "system_prompt": "Hi", "params": {"temperature": 0.2, "stop": ["\n"]}, "engine": "vllm"}).factors()
    assert flat["backend"] == "b" and flat["system_prompt"] == "Hi" and flat["engine"] == "vllm"
    assert flat["params.temperature"] == 0.2 and flat["params.stop"] == ["\n"]
    assert flat["compression.tau"] == 0.18  # built-in defaults still filled in
    assert "model" not in flat  # unset gateway factors are absent (level None)


def test_the_runtime_gets_its_typed_strategy_and_ignores_the_rest() -> None:
    stored = open_strategy({"sparse_ffn_k": 32, "backend": "b", "params": {"temperature": 0.2}, "engine": "vllm"}).model_dump(mode="json")
    runtime = Strategy.runtime_view(stored)
    assert type(runtime) is Strategy and runtime.sparse_ffn_k == 32
    assert runtime.content_hash == Strategy(sparse_ffn_k=32).content_hash
    served = open_strategy(stored)
    assert isinstance(served, Strategy) and served.sparse_ffn_k == 32 and served.content_hash == content_hash(stored)


def test_a_policy_strategy_reopens_from_its_stored_dump_and_refuses_a_set_factor_beside_it() -> None:
    """The registry stores a strategy as its dump, every built-in factor at its default beside
    ``policy``; reading it back (results, attribution) must give the same policy strategy."""
    policy = {"kind": "fixed", "arm": "terse"}
    stored = open_strategy({"policy": policy}).model_dump(mode="json")
    assert "precision" in stored  # the defaults are spelled out: what the registry returns
    again = open_strategy(stored)
    assert again.policy == policy
    assert again.model_dump(mode="json") == stored
    with pytest.raises(ValueError, match="holds only `policy`; put precision"):
        open_strategy({**stored, "precision": "int8"})  # a factor set beside the policy belongs in an arm
