"""SDK instrumentation: track/tracked (sync and asyncio) and the openai client wrapper
against the scripted backend (a real HTTP server)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.events import InferenceEvent, validate_event
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.sdk import AblabClient, ListSink, current_call, instrument_openai, track, tracked

MSGS = [{"role": "user", "content": "hello"}]


def client_with(variants: dict) -> AblabClient:
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False, sink=ListSink())
    spec = ExperimentSpec(key="exp", salt="s", control=next(iter(variants)),
                          variants=tuple(VariantSpec(k, 1.0, v) for k, v in variants.items()))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    return sdk


def unit_in(sdk: AblabClient, variant: str) -> str:
    return next(f"u{i}" for i in range(200) if sdk.assign(f"u{i}", log_exposure=False)[0].variant == variant)


def inference_events(sdk) -> list[dict]:
    events = [e for e in sdk.sink.events if e["type"] == "inference"]
    for e in events:
        assert isinstance(validate_event(e), InferenceEvent), validate_event(e)
    return events


@pytest.fixture(scope="module")
def backend():
    with ScriptedBackend(tokens=9) as b:
        yield b


def test_track_times_tokens_and_emits_both_events() -> None:
    sdk = client_with({"a": {}, "b": {"model": "big"}})
    unit = unit_in(sdk, "b")
    with track(sdk, unit, prompt="x" * 40) as call:
        assert current_call() is call and call.strategy == {"model": "big"}
        for piece in ["", "Hel", "lo", "!"]:
            call.token(piece)
    assert current_call() is None
    types = [e["type"] for e in sdk.sink.events]
    assert types == ["exposure", "inference"]
    ev = inference_events(sdk)[0]
    assert ev["variant"] == "b" and ev["output_tokens"] == 3 and ev["prompt_tokens"] == 10
    assert 0 <= ev["ttft_ms"] <= ev["e2e_ms"] and ev["trace_id"] == call.trace_id


def test_usage_replaces_counts_and_exceptions_are_errors() -> None:
    sdk = client_with({"a": {}})
    with pytest.raises(ZeroDivisionError):
        with track(sdk, "u1") as call:
            call.token("x")
            call.usage(prompt_tokens=5, output_tokens=7)
            raise ZeroDivisionError("division by zero")
    ev = inference_events(sdk)[0]
    assert ev["error"] == "ZeroDivisionError" and ev["prompt_tokens"] == 5 and ev["output_tokens"] == 7


def test_units_in_no_experiment_emit_nothing() -> None:
    sdk = client_with({"a": {}})
    sdk.config = AssignmentConfig()
    with track(sdk, "u1") as call:
        call.token("x")
    assert sdk.sink.events == [] and call.variant is None


def test_tracked_decorator_sync_and_async() -> None:
    sdk = client_with({"a": {}})

    @tracked(sdk, unit=lambda user, q: user)
    def answer(user, q):
        current_call().token(q)
        return {"usage": {"prompt_tokens": 3, "completion_tokens": 4}}

    @tracked(sdk, unit=lambda user, q: user)
    async def aanswer(user, q):
        await asyncio.sleep(0)
        current_call().token(q)
        return q

    answer("u1", "hi")
    assert asyncio.run(aanswer("u2", "yo")) == "yo"
    events = inference_events(sdk)
    assert [e["unit_id"] for e in events] == ["u1", "u2"]
    assert events[0]["output_tokens"] == 4 and events[1]["output_tokens"] == 1


def test_openai_wrapper_non_streaming_applies_the_strategy(backend) -> None:
    sdk = client_with({"a": {}, "b": {"params": {"temperature": 0.3}, "system_prompt": "S"}})
    client = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)
    unit = unit_in(sdk, "b")
    resp = client.chat.completions.create(model="ok", messages=MSGS, user=unit)
    headers, sent = backend.requests[-1]
    assert sent["temperature"] == 0.3 and sent["messages"][0] == {"role": "system", "content": "S"}
    assert headers["x-request-id"] == resp._ablab_trace_id
    ev = inference_events(sdk)[0]
    assert ev["output_tokens"] == resp.usage.completion_tokens == 9 and ev["ttft_ms"] == ev["e2e_ms"]
    assert client.models.list().data[0].id == "ok"  # the rest is the wrapped client's


def test_openai_wrapper_streaming_hides_the_usage_chunk_it_asked_for(backend) -> None:
    sdk = client_with({"a": {}})
    client = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)
    stream = client.chat.completions.create(model="usage-null", messages=MSGS, stream=True, ablab_unit="u9")
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert backend.requests[-1][1]["stream_options"] == {"include_usage": True}
    ev = inference_events(sdk)[0]
    assert ev["trace_id"] == stream.ablab_trace_id and ev["output_tokens"] == 9 and ev["ttft_ms"] < ev["e2e_ms"]


def test_openai_wrapper_async_stream_and_errors(backend) -> None:
    sdk = client_with({"a": {}})
    client = instrument_openai(openai.AsyncOpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)

    async def go():
        stream = await client.chat.completions.create(model="ok", messages=MSGS, stream=True, user="u1",
                                                      stream_options={"include_usage": True})
        got = [c async for c in stream]
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="http429", messages=MSGS, user="u1")
        return got

    chunks = asyncio.run(go())
    assert chunks[-1].usage.completion_tokens == 9  # asked for: kept
    ok, failed = inference_events(sdk)
    assert ok["output_tokens"] == 9 and ok["error"] is None and failed["error"] == "RateLimitError"
