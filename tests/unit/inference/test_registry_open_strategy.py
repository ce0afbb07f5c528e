"""The built-in pack serves open strategies: gateway and declared factors are not the runtime's."""

from ablab.inference.registry import ServingContext, handled_fields, plan_for
from ablab.platform.strategy import GATEWAY_FACTORS, Strategy, open_strategy

CTX = ServingContext(d_ff=3072, max_len=64, adapters=frozenset({"ledger"}))


def test_gateway_and_declared_factors_leave_the_runtime_plan_unchanged():
    runtime = {"sparse_ffn_k": 32, "kv_shards": 4, "prompt_template": "structured", "cot_depth": 2}
    stored = open_strategy({**runtime, "backend": "smollm", "params": {"temperature": 0.2}, "engine": "vllm"}).model_dump(mode="json")
    assert plan_for(open_strategy(stored), CTX) == plan_for(Strategy(**runtime), CTX)
    assert plan_for(Strategy.runtime_view(stored), CTX) == plan_for(Strategy(**runtime), CTX)
    assert not set(GATEWAY_FACTORS) & handled_fields()  # the built-in pack owns only its own factors
