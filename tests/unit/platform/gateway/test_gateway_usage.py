"""``stream_options.include_usage`` through the gateway (OpenAI's semantics): a usage chunk
exactly when the caller asks; when the backend sends none, the gateway's own count, marked
estimated in the inference event, with the same numbers the event records."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from test_gateway_contract import MSGS, chunks, inference, post_stream

from ablab.platform.gateway.scripted import ScriptedBackend
from ablab_testing.gateway_harness import gateway_for

ASK = {"stream_options": {"include_usage": True}}


@pytest.fixture
def gw(backend: ScriptedBackend, tmp_path: Path):
    with gateway_for(backend.url, tmp_path) as g:
        yield g


def test_asked_and_the_backend_sends_none_gives_the_gateways_count_before_done(gw) -> None:
    r, data = post_stream(gw, {"model": "no-usage", "messages": MSGS, "stream": True, "user": "u1", **ASK})
    assert r.status_code == 200 and data.endswith(b"\n\ndata: [DONE]\n\n")
    got = chunks(data)
    usage_chunks = [c for c in got if c.get("usage") is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is got[-1]  # the last chunk before [DONE]
    last = got[-1]
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk" and last["id"] == got[0]["id"]
    assert last["model"] == got[0]["model"]
    ev = inference(gw, r.headers["x-ablab-trace-id"])
    usage = last["usage"]
    assert ev["measures"]["tokens_estimated"] == 1.0
    assert usage == {"prompt_tokens": ev["prompt_tokens"], "completion_tokens": ev["output_tokens"],
                     "total_tokens": ev["prompt_tokens"] + ev["output_tokens"]}
    assert usage["completion_tokens"] == 9  # one per content chunk


def test_not_asked_means_no_usage_chunk_whatever_the_backend_does(gw) -> None:
    for script in ("ok", "no-usage"):
        r, data = post_stream(gw, {"model": script, "messages": MSGS, "stream": True, "user": "u2"})
        assert r.status_code == 200 and all(c.get("usage") is None for c in chunks(data))


def test_asked_and_the_backend_sends_usage_relays_the_backends_own(gw) -> None:
    r, data = post_stream(gw, {"model": "ok", "messages": MSGS, "stream": True, "user": "u3", **ASK})
    usage = [c["usage"] for c in chunks(data) if c.get("usage") is not None]
    assert usage == [{"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}]  # the backend's, once
    assert inference(gw, r.headers["x-ablab-trace-id"])["measures"]["tokens_estimated"] == 0.0


def test_completions_endpoint_gets_a_text_completion_usage_chunk(gw) -> None:
    import httpx

    body = {"model": "no-usage", "prompt": "hello there", "stream": True, "user": "u4", **ASK}
    with httpx.Client(timeout=10) as c, c.stream("POST", gw.url + "/v1/completions", json=body) as r:
        data = r.read()
    last = chunks(data)[-1]
    assert last["object"] == "text_completion" and last["choices"] == [] and last["usage"]["completion_tokens"] == 9


def test_the_official_client_sees_usage_exactly_when_it_asks(gw) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    asked = list(client.chat.completions.create(model="no-usage", messages=MSGS, stream=True, user="u5",
                                                stream_options={"include_usage": True}))
    assert asked[-1].usage is not None and asked[-1].usage.completion_tokens == 9 and asked[-1].choices == []
    assert all(c.usage is None for c in asked[:-1])
    plain = list(client.chat.completions.create(model="no-usage", messages=MSGS, stream=True, user="u5"))
    assert all(c.usage is None for c in plain) and "".join(c.choices[0].delta.content or "" for c in plain if c.choices)


def test_usage_beside_the_choices_is_taken_out_unless_asked_and_still_counted() -> None:
    import json

    from ablab.platform.gateway.stream import StreamMeter
    from ablab.platform.gateway.translators import translator_for

    last = {"id": "r", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}
    stream = (b'data: {"id":"r","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
              + b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
    for asked in (False, True):
        meter = StreamMeter(translator=translator_for("llamacpp"), strip_usage=not asked, prompt_tokens=3)
        out = meter.feed(stream, 1.0)
        sent = [json.loads(e[6:]) for e in out.split(b"\n\n") if e.startswith(b"data: {")]
        assert ("usage" in sent[-1]) is asked and sent[-1]["choices"][0]["finish_reason"] == "stop"
        assert meter.stats.usage == last["usage"] and not meter.stats.usage_sent_estimated  # the backend's, recorded
        assert out.endswith(b"data: [DONE]\n\n") and len(sent) == 2
