"""The worker end to end in-process: assignment → registry → engine → events."""

import pytest

from ablab.inference.registry import StrategyNotServable
from ablab.inference.serving.assigners import StaticAssigner
from ablab.inference.serving.events import ListSink, ValidatingSink
from ablab.inference.serving.service import InferenceService
from ablab.inference.serving.worker import InferRequest, Worker
from ablab.platform.events import InferenceEvent, validate_event
from ablab.platform.strategy import FACTOR_NAMES

# one variant per factor, each away from its default, so every factor is exercised
VARIANTS = {
    "control": {},
    "template": {"prompt_template": "structured"},
    "entropy": {"compression": {"method": "entropy", "tau": 1.0, "window": 4}},  # a random model: every token is surprising
    "lora": {"lora_adapter": "auto"},
    "sparse": {"sparse_ffn_k": 32},
    "shards": {"kv_shards": 3},
    "fixed": {"batching": {"policy": "fixed", "max_batch": 4, "window_ms": 1}},
    "adaptive": {"batching": {"policy": "adaptive", "max_batch": 4, "window_ms": 1}},
    "adaptive-slo": {"batching": {"policy": "adaptive", "max_batch": 4, "window_ms": 1, "ttft_slo_ms": 60000, "tpot_slo_ms": 1000, "shed_late": True}},
    "bf16": {"precision": "bf16"},
    "int8": {"precision": "int8"},
    "cot": {"cot_depth": 2},
    "validate": {"validation_threshold": 0.99},
}


class FixedAssigner:
    def __init__(self, variant):
        self.inner = StaticAssigner("exp1", {variant: VARIANTS[variant]})

    def assign(self, unit_id, attributes=None):
        return self.inner.assign(unit_id, attributes)


@pytest.fixture
def service(tiny_bundle):
    svc = InferenceService(tiny_bundle, start_engines=False)
    yield svc
    svc.close()


def test_every_factor_is_reachable_from_the_worker(service):
    covered = set()
    for strategy in VARIANTS.values():
        for key in strategy:
            covered |= {f for f in FACTOR_NAMES if f == key or f.startswith(key + ".")}
    assert covered == set(FACTOR_NAMES)
    for name in VARIANTS:
        sink = ListSink()
        worker = Worker(service=service, assigner=FixedAssigner(name), sink=ValidatingSink(sink))
        resp = worker.handle(InferRequest(unit_id="u-1", prompt="12+34=", domain="ledger"))
        assert resp.variant == name and resp.error is None, (name, resp.error)
        types = [e["type"] for e in sink.events]
        assert types == ["exposure", "inference"], (name, worker.sink.last_error)
        inf = validate_event(sink.events[1])
        assert isinstance(inf, InferenceEvent)
        assert inf.trace_id == resp.trace_id == sink.events[0]["trace_id"]
        assert inf.ttft_ms <= inf.e2e_ms and inf.cost_usd > 0 and inf.price_version == "2026-07"
        if name == "lora":
            assert resp.adapter == "ledger"  # routed by the domain hint
        if name == "validate":
            assert resp.revalidated
        if name == "entropy":
            assert resp.prompt_tokens < len("12+34=") + 1
        if name == "cot":
            assert resp.prompt_tokens == len("12+34=") + 1 + 2


def test_metrics_follow_the_design_definitions(service):
    worker = Worker(service=service, assigner=FixedAssigner("control"), sink=ListSink())
    resp = worker.handle(InferRequest(unit_id="u-2", prompt="a=11,b=22;b=", domain="lookup", max_new_tokens=6))
    if resp.output_tokens > 1:
        assert resp.tpot_ms == pytest.approx((resp.e2e_ms - resp.ttft_ms) / (resp.output_tokens - 1))
    else:
        assert resp.tpot_ms is None
    assert resp.cost_usd == pytest.approx(0.090 / 3600 * resp.device_s)


def test_unservable_strategy_is_refused_with_reasons(service):
    class Bad:
        def assign(self, unit_id, attributes=None):
            return StaticAssigner("exp1", {"bad": {"sparse_ffn_k": 5000, "lora_adapter": "nope"}}).assign(unit_id)

    worker = Worker(service=service, assigner=Bad(), sink=ListSink())
    with pytest.raises(StrategyNotServable) as err:
        worker.handle(InferRequest(unit_id="u-3", prompt="1+1=", domain="arith"))
    assert any("sparse_ffn_k" in r for r in err.value.reasons)
    assert worker.sink.events == []


def test_bad_prompt_is_reported_not_crashing(service):
    worker = Worker(service=service, assigner=FixedAssigner("control"), sink=ListSink())
    resp = worker.handle(InferRequest(unit_id="u-4", prompt="x" * 100, domain="arith"))
    assert resp.error and "max_len" in resp.error
    assert worker.sink.events[1]["error"]


def test_request_validation_names_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="unit_id"):
        InferRequest(unit_id="has space", prompt="1+1=")


def test_static_assigner_is_sticky_and_splits():
    a = StaticAssigner("e", {"a": {}, "b": {}})
    got = {a.assign(f"u{i}")[0].variant for i in range(50)}
    assert got == {"a", "b"}
    assert all(a.assign("u7")[0].variant == a.assign("u7")[0].variant for _ in range(3))


SHEDDING = {"batching": {"policy": "adaptive", "max_batch": 4, "window_ms": 1, "ttft_slo_ms": 0.01, "shed_late": True}}


def test_a_request_past_its_ttft_slo_is_shed_with_503_and_still_counted(service):
    """A 0.01 ms TTFT SLO cannot be met by any request, so shedding refuses each one: the
    HTTP answer is 503 with Retry-After, and the exposure and the failed inference are
    still emitted (shedding shows up in the variant's error rate, not as lost traffic)."""
    from fastapi.testclient import TestClient

    from ablab.inference.serving.worker import create_app

    sink = ListSink()
    worker = Worker(service=service, assigner=StaticAssigner("exp1", {"shed": SHEDDING}), sink=sink)
    with TestClient(create_app(worker)) as client:
        r = client.post("/v1/infer", json={"unit_id": "u-9", "prompt": "12+34=", "domain": "arith"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    body = r.json()
    assert body["overloaded"] is True and body["error"].startswith("overloaded: queued") and "TTFT SLO" in body["error"]
    assert [e["type"] for e in sink.events] == ["exposure", "inference"]
    assert sink.events[1]["error"].startswith("overloaded") and sink.events[1]["trace_id"] == body["trace_id"]


def test_slos_without_shedding_serve_normally(service):
    slo = {"batching": {"policy": "adaptive", "max_batch": 4, "window_ms": 1, "ttft_slo_ms": 0.01, "tpot_slo_ms": 0.01}}
    worker = Worker(service=service, assigner=StaticAssigner("exp1", {"slo": slo}), sink=ListSink())
    resp = worker.handle(InferRequest(unit_id="u-10", prompt="12+34=", domain="arith"))
    assert resp.error is None and not resp.overloaded and resp.output_tokens >= 1
