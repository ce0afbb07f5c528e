"""Shadows from the SDK's instrumented openai client (sync and async) against the scripted
backend: the caller gets the primary's answer; the shadow (the caller's request rewritten by the
shadow's strategy) runs on the SDK's own thread, pool, cap and timeout; both events reach the
sink, valid; a failing or hung shadow never touches the primary."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.events import InferenceEvent, validate_event
from ablab.platform.gateway.scripted import WORDS, ScriptedBackend
from ablab.platform.gateway.shadow import chosen
from ablab.platform.sdk import AblabClient, ListSink, instrument_openai

MSGS = [{"role": "user", "content": "hello"}]
ANSWER = "".join(WORDS[i % len(WORDS)] for i in range(9))


def sdk_with(shadow: dict) -> AblabClient:
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False, sink=ListSink())
    spec = ExperimentSpec(key="exp", salt="s", control="a", shadow=shadow, variants=(VariantSpec("a", 1.0, {}),))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    return sdk


def events(sdk: AblabClient) -> tuple[dict[str, dict], dict[str, dict]]:
    primaries, shadows = {}, {}
    for e in sdk.sink.events:
        if e["type"] != "inference":
            continue
        assert isinstance(validate_event(e), InferenceEvent), validate_event(e)
        (shadows.__setitem__(e["shadow_of"], e) if e.get("shadow_of") else primaries.__setitem__(e["trace_id"], e))
    return primaries, shadows


@pytest.fixture(scope="module")
def backend():
    with ScriptedBackend(tokens=9) as b:
        yield b


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_shadow_is_sent_measured_and_never_returned(backend, stream: bool) -> None:
    sdk = sdk_with({"strategy": {"model": "sleep-5", "params": {"temperature": 0}}, "fraction": 1.0,
                    "max_concurrency": 4, "timeout_s": 5})
    client = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="k-1", max_retries=0), sdk)
    resp = client.chat.completions.create(model="ok", messages=MSGS, user="u1", stream=stream, max_tokens=9,
                                          extra_headers={"X-Team": "t"})
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in resp if c.choices)
        trace = resp.ablab_trace_id
    else:
        text, trace = resp.choices[0].message.content, resp._ablab_trace_id
    assert text == ANSWER
    client.ablab_shadows.drain()
    primaries, shadows = events(sdk)
    assert primaries[trace]["shadow"] == "sent" and primaries[trace]["error"] is None
    s = shadows[trace]
    assert s["trace_id"] != trace and s["error"] is None and s["output_tokens"] == 9 and s["variant"] == "a"
    assert s["e2e_ms"] >= 40  # 9 chunks 5 ms apart (or a whole answer after 45 ms)
    assert [e["type"] for e in sdk.sink.events].count("exposure") == 1  # the shadow exposes no one
    headers, body = next((h, b) for h, b in reversed(backend.requests) if h.get("x-request-id") == s["trace_id"])
    assert body["model"] == "sleep-5" and body["temperature"] == 0 and body["max_tokens"] == 9 and body["user"] == "u1"
    assert headers["x-ablab-shadow-of"] == trace and headers["authorization"] == "Bearer k-1" and headers["x-team"] == "t"
    assert client.ablab_shadows.runner.last_answers[s["trace_id"]] == ANSWER
    client.ablab_shadows.close()


def test_async_client_failing_and_dropped_shadows_leave_the_primary_alone(backend) -> None:
    sdk = sdk_with({"strategy": {"model": "hang"}, "fraction": 1.0, "max_concurrency": 1, "timeout_s": 0.5})
    client = instrument_openai(openai.AsyncOpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)

    async def go() -> list:
        return [await client.chat.completions.create(model="ok", messages=MSGS, user=f"u{i}") for i in range(3)]

    t0 = time.perf_counter()
    responses = asyncio.run(go())
    assert time.perf_counter() - t0 < 0.5 and all(r.choices[0].message.content == ANSWER for r in responses)
    client.ablab_shadows.drain()
    primaries, shadows = events(sdk)
    assert [primaries[r._ablab_trace_id]["shadow"] for r in responses] == ["sent", "dropped", "dropped"]
    assert [s["error"] for s in shadows.values()] == ["shadow_timeout"]
    assert client.ablab_shadows.runner.counts == {("exp", "sent"): 1, ("exp", "dropped"): 2, ("exp", "failed"): 1}
    client.ablab_shadows.close()


def test_the_fraction_and_the_switch(backend) -> None:
    sdk = sdk_with({"strategy": {"model": "http500"}, "fraction": 0.5, "max_concurrency": 32})
    client = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk)
    traces = [client.chat.completions.create(model="ok", messages=MSGS, user=f"u{i}")._ablab_trace_id for i in range(20)]
    client.ablab_shadows.drain()
    primaries, shadows = events(sdk)
    assert set(shadows) == {t for t in traces if chosen(t, "exp", 0.5)} == {t for t in traces if primaries[t].get("shadow")}
    assert {s["error"] for s in shadows.values()} <= {"backend_http_500"}
    client.ablab_shadows.close()
    off = instrument_openai(openai.OpenAI(base_url=backend.url, api_key="x", max_retries=0), sdk_with({"strategy": {}, "fraction": 1.0}),
                            shadows=False)
    off.chat.completions.create(model="ok", messages=MSGS, user="u1")
    assert off.ablab_shadows is None
