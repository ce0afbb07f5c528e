import pytest

from ablab.inference.registry import (
    AUTO_ADAPTER,
    REGISTRY,
    ServingContext,
    StrategyNotServable,
    handled_fields,
    plan_for,
    reasons_for,
    unhandled_factors,
)
from ablab.platform.strategy import FACTOR_NAMES, Strategy

CTX = ServingContext(d_ff=3072, max_len=64, adapters=frozenset({"ledger", "mirror", "codebook"}))


def test_every_strategy_factor_is_handled_by_a_registered_component():
    assert set(FACTOR_NAMES) <= handled_fields(), unhandled_factors()
    assert not unhandled_factors()
    names = [c.name for c in REGISTRY]
    assert len(names) == len(set(names))


def test_components_refuse_what_the_model_cannot_serve_with_all_reasons():
    bad = Strategy(sparse_ffn_k=5000, lora_adapter="legal", kv_shards=64, prompt_template="fancy")
    reasons = reasons_for(bad, ServingContext(d_ff=3072, max_len=32, adapters=frozenset({"ledger"})))
    text = " | ".join(reasons)
    assert "sparse_ffn_k=5000" in text and "d_ff=3072" in text
    assert "lora_adapter='legal'" in text and "ledger" in text
    assert "kv_shards=64" in text
    assert "prompt_template='fancy'" in text
    with pytest.raises(StrategyNotServable) as err:
        plan_for(bad, CTX)
    assert len(err.value.reasons) >= 2


def test_int8_is_refused_on_cuda():
    ctx = ServingContext(d_ff=3072, max_len=64, adapters=frozenset(), device="cuda")
    assert any("int8" in r for r in reasons_for(Strategy(precision="int8"), ctx))


def test_plan_carries_every_factor():
    s = Strategy(
        prompt_template="structured",
        compression={"method": "entropy", "tau": 0.3, "window": 16},
        lora_adapter=AUTO_ADAPTER,
        sparse_ffn_k=256,
        kv_shards=4,
        batching={"policy": "adaptive", "max_batch": 16, "window_ms": 3},
        precision="bf16",
        cot_depth=2,
        validation_threshold=0.6,
    )
    plan = plan_for(s, CTX)
    assert plan.template == "structured"
    assert plan.compression == ("entropy", 0.3, 16)
    assert plan.adapter == AUTO_ADAPTER
    assert (plan.runtime.precision, plan.runtime.sparse_ffn_k, plan.runtime.kv_shards) == ("bf16", 256, 4)
    assert (plan.batching.policy, plan.batching.max_batch, plan.batching.window_ms) == ("adaptive", 16, 3)
    assert plan.cot_depth == 2 and plan.validation_threshold == 0.6
    assert plan.components == [c.name for c in REGISTRY]
