"""The worker over real HTTP (uvicorn), driven by the traffic generator, labeled by the
labeler: every event validates against the published schema and joins by trace_id."""

import threading
import time

import pytest

pytestmark = pytest.mark.integration

PORT = 18131


@pytest.fixture(scope="module")
def worker_url():
    import uvicorn

    from ablab.inference.assets import shipped_bundle
    from ablab.inference.serving.assigners import StaticAssigner
    from ablab.inference.serving.events import ListSink
    from ablab.inference.serving.service import InferenceService
    from ablab.inference.serving.worker import Worker, create_app

    sink = ListSink()
    assigner = StaticAssigner(
        "exp-http",
        {
            "control": {},
            "fast": {"sparse_ffn_k": 256, "precision": "int8", "batching": {"policy": "adaptive", "max_batch": 8, "window_ms": 2}},
            "lora": {"lora_adapter": "auto", "prompt_template": "structured"},
        },
    )
    worker = Worker(service=InferenceService(shipped_bundle()), assigner=assigner, sink=sink)
    server = uvicorn.Server(uvicorn.Config(create_app(worker), host="127.0.0.1", port=PORT, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{PORT}", sink
    server.should_exit = True
    thread.join(timeout=10)
    worker.service.close()


def test_traffic_worker_labeler_round_trip(worker_url, tmp_path):
    from ablab.inference.labeler import Labeler, LabelerConfig
    from ablab.inference.serving.events import ListSink
    from ablab.inference.traffic import TrafficConfig, run_traffic
    from ablab.platform.events import ExposureEvent, FeedbackEvent, InferenceEvent, RumEvent, validate_event

    url, worker_sink = worker_url
    client_sink = ListSink()
    ledger = tmp_path / "ledger.jsonl"
    result = run_traffic(worker_url=url, cfg=TrafficConfig(rate=15, duration_s=2.0, users=10, seed=3), sink=client_sink, ledger=ledger, concurrency=8)
    assert result.sent > 10 and result.failed == 0 and result.ok == result.sent

    labels = ListSink()
    lab = Labeler(LabelerConfig(fraction=1.0, delay_median_s=0.0), labels)
    import json

    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    for rec in records:
        lab.offer(rec)
    assert lab.emit_due() == len(records)

    parsed = [validate_event(e) for e in worker_sink.events + client_sink.events + labels.events]
    assert all(not hasattr(p, "field") for p in parsed), [p for p in parsed if hasattr(p, "field")]
    inference = {p.trace_id: p for p in parsed if isinstance(p, InferenceEvent)}
    exposures = {p.trace_id for p in parsed if isinstance(p, ExposureEvent)}
    rum = {p.trace_id: p for p in parsed if isinstance(p, RumEvent)}
    feedback = {p.trace_id: p for p in parsed if isinstance(p, FeedbackEvent)}
    assert set(inference) == exposures == set(rum) == set(feedback)  # one request, one trace, four records
    assert {p.variant for p in inference.values()} == {"control", "fast", "lora"}
    for tid, inf in inference.items():
        assert rum[tid].e2e_ms >= inf.e2e_ms  # the client sees the server time plus HTTP
        assert inf.cost_usd > 0 and inf.device_s > 0
    assert sum(f.correct for f in feedback.values()) == result.correct


def test_http_errors_name_the_field(worker_url):
    import httpx

    url, _ = worker_url
    r = httpx.post(f"{url}/v1/infer", json={"unit_id": "u 1", "prompt": "1+1="})
    assert r.status_code == 422 and "unit_id" in r.text
    r = httpx.get(f"{url}/v1/strategies")
    assert {"sparse-ffn", "sharded-kv", "lora", "batching", "precision"} <= {c["name"] for c in r.json()["components"]}


def test_openai_client_chat_and_completions_stream_and_not(worker_url):
    """The official openai client against the worker's OpenAI surface: the same answer
    streamed and not, usage on request, the runtime strategy from the body."""
    import openai

    url, sink = worker_url
    before = len(sink.events)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["ablab-tiny"]

    messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "47+85="}]
    full = client.chat.completions.create(model="ablab-tiny", messages=messages, max_tokens=8, temperature=0.7)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    answer = full.choices[0].message.content
    assert answer and full.usage.completion_tokens >= 1
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    chunks = list(client.chat.completions.create(model="ablab-tiny", messages=messages, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == answer  # greedy decoding: the stream spells the same answer
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens

    plain = list(client.chat.completions.create(model="ablab-tiny", messages=messages, max_tokens=8, stream=True))
    assert all(c.choices for c in plain) and all(c.usage is None for c in plain)  # no usage chunk unless asked

    text = client.completions.create(model="ablab-tiny", prompt="47+85=", max_tokens=8)
    assert text.object == "text_completion" and text.choices[0].text == answer
    streamed = client.completions.create(model="ablab-tiny", prompt="47+85=", max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == answer

    sparse = client.chat.completions.create(model="ablab-tiny", messages=messages, max_tokens=8,
                                            extra_body={"ablab_strategy": {"sparse_ffn_k": 256, "precision": "int8"}})
    assert sparse.choices[0].message.content  # served under that runtime strategy
    with pytest.raises(openai.BadRequestError, match="ablab_strategy"):
        client.chat.completions.create(model="ablab-tiny", messages=messages, extra_body={"ablab_strategy": {"no_such_factor": 1}})
    with pytest.raises(openai.BadRequestError, match="512"):
        client.chat.completions.create(model="ablab-tiny", messages=[{"role": "user", "content": "1" * 600}])
    raw = client.chat.completions.with_raw_response.create(model="ablab-tiny", messages=messages, max_tokens=2,
                                                           extra_headers={"X-Request-Id": "trace-abc"})
    assert raw.headers["x-request-id"] == "trace-abc" and raw.parse().id == "chatcmpl-trace-abc"
    assert len(sink.events) == before  # a backend, not an experiment: whatever fronts it emits events
