"""The gateway against a scripted SSE backend (a real HTTP server): the contract cases."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from ablab.platform.events import validate_event
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab_testing.gateway_harness import gateway_for

MSGS = [{"role": "user", "content": "hello"}]


def post_stream(gw, body, headers=None) -> tuple[httpx.Response, bytes]:
    with httpx.Client(timeout=10) as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
        return r, r.read()


def chunks(data: bytes) -> list:
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: ") and event != b"data: [DONE]":
            out.append(json.loads(event[6:]))
    return out


def inference(gw, trace_id) -> dict:
    found = [e for e in gw.events() if e["type"] == "inference" and e["trace_id"] == trace_id]
    assert len(found) == 1, gw.events()
    assert not isinstance(validate_event(found[0]), type(validate_event({})))  # the schema accepts it
    return found[0]


@pytest.fixture
def gw(backend: ScriptedBackend, tmp_path: Path):
    with gateway_for(backend.url, tmp_path) as g:
        yield g


@pytest.mark.parametrize("script", ["ok", "usage-null"])
def test_usage_chunk_is_stripped_unless_asked_and_tokens_come_from_usage(gw, backend, script) -> None:
    r, data = post_stream(gw, {"model": script, "messages": MSGS, "stream": True, "user": "u1"})
    assert r.status_code == 200
    assert all(c.get("usage") is None for c in chunks(data)) and data.endswith(b"data: [DONE]\n\n")
    headers, sent = backend.requests[-1]
    assert sent["stream_options"] == {"include_usage": True}  # injected upstream
    trace = r.headers["x-ablab-trace-id"]
    assert headers["x-request-id"] == trace
    ev = inference(gw, trace)
    assert ev["output_tokens"] == 9 and ev["prompt_tokens"] == 11 and ev["error"] is None
    assert 0 <= ev["ttft_ms"] <= ev["e2e_ms"] and ev["tpot_ms"] is not None
    assert r.headers["x-ablab-experiment"] == "exp" and r.headers["x-ablab-variant"] == ev["variant"]

    r, data = post_stream(gw, {"model": script, "messages": MSGS, "stream": True, "user": "u1",
                               "stream_options": {"include_usage": True}})
    usage = [c for c in chunks(data) if c.get("usage")]
    assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] == 9


def test_no_usage_means_counted_tokens(gw) -> None:
    r, data = post_stream(gw, {"model": "no-usage", "messages": MSGS, "stream": True, "user": "u2"})
    ev = inference(gw, r.headers["x-ablab-trace-id"])
    assert ev["output_tokens"] == 9  # one per generated chunk
    assert ev["prompt_tokens"] >= 1


@pytest.mark.parametrize("script", ["tools", "reasoning"])
def test_tool_call_and_reasoning_streams_are_measured(gw, script) -> None:
    r, data = post_stream(gw, {"model": script, "messages": MSGS, "stream": True, "user": "u3"})
    assert r.status_code == 200 and len(chunks(data)) == 11  # role, 9 deltas, finish
    ev = inference(gw, r.headers["x-ablab-trace-id"])
    assert ev["error"] is None and ev["output_tokens"] == 9 and ev["ttft_ms"] <= ev["e2e_ms"]


@pytest.mark.parametrize("status", [429, 500])
def test_backend_errors_are_forwarded_and_recorded(gw, status) -> None:
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", json={"model": f"http{status}", "messages": MSGS, "stream": True, "user": "u4"})
    assert r.status_code == status and r.json()["error"]["message"] == f"scripted {status}"
    assert inference(gw, r.headers["x-ablab-trace-id"])["error"] == f"backend_http_{status}"
    with pytest.raises(openai.APIStatusError) as info:
        openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model=f"http{status}", messages=MSGS, user="u4")
    assert info.value.status_code == status


def test_garbage_mid_stream_is_passed_and_recorded(gw) -> None:
    r, data = post_stream(gw, {"model": "garbage", "messages": MSGS, "stream": True, "user": "u5"})
    assert b"this is not json" in data and data.endswith(b"data: [DONE]\n\n")
    assert inference(gw, r.headers["x-ablab-trace-id"])["error"] == "backend_malformed_chunk"
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", json={"model": "bad-json", "messages": MSGS, "user": "u5"})
    assert r.status_code == 200 and r.text == "<html>not json</html>"
    assert inference(gw, r.headers["x-ablab-trace-id"])["error"] == "backend_invalid_json"


def test_backend_dying_mid_stream_gives_an_error_event_and_a_healthy_gateway(gw) -> None:
    r, data = post_stream(gw, {"model": "die", "messages": MSGS, "stream": True, "user": "u6"})
    assert b"backend_stream_broken" in data
    ev = inference(gw, r.headers["x-ablab-trace-id"])
    assert ev["error"] == "backend_stream_broken" and ev["ttft_ms"] <= ev["e2e_ms"]
    with httpx.Client(timeout=10) as c:
        assert c.get(gw.url + "/healthz").status_code == 200
        ok = c.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS, "user": "u6"})
    assert ok.status_code == 200


def test_client_disconnect_mid_stream_is_recorded(gw, backend) -> None:
    with httpx.Client(timeout=10) as c, c.stream("POST", gw.url + "/v1/chat/completions",
                                                   json={"model": "slow", "messages": MSGS, "stream": True, "user": "u7"}) as r:
        trace = r.headers["x-ablab-trace-id"]
        for _ in r.iter_raw():
            break  # the caller goes away after the first bytes
    state = gw.state()
    deadline = 200
    while not [e for e in gw.events() if e["trace_id"] == trace and e["type"] == "inference"] and deadline:
        with httpx.Client(timeout=10) as c:  # waits on the gateway's own event, not on time
            c.get(gw.url + "/healthz")
        deadline -= 1
    assert inference(gw, trace)["error"] == "client_disconnected"
    assert state.inflight["scripted"] == 0


def test_unknown_fields_pass_through_and_bodies_without_a_strategy_are_the_callers_bytes(gw, backend) -> None:
    raw = b'{"model":"ok","messages":[{"role":"user","content":"x"}],"vendor":{"a":[1,2.50]},"user":"nobody-in-exp"}'
    sdk = gw.state().sdk
    unit = next(f"unit-{i}" for i in range(100) if sdk.assign(f"unit-{i}", log_exposure=False)[0].variant == "a")
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", content=raw.replace(b"nobody-in-exp", unit.encode()),
                   headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert backend.requests[-1][1]["vendor"] == {"a": [1, 2.50]}


def test_same_unit_same_variant_and_variant_params_reach_the_backend(gw, backend) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    seen = {}
    for i in range(30):
        unit = f"user-{i % 10}"
        raw = client.chat.completions.with_raw_response.create(model="ok", messages=MSGS, extra_headers={"X-Ablab-Unit": unit})
        seen.setdefault(unit, set()).add(raw.headers["x-ablab-variant"])
        sent = backend.requests[-1][1]
        assert (sent.get("temperature") == 0.2) == (raw.headers["x-ablab-variant"] == "b")
        assert raw.parse().usage.completion_tokens == 9
    assert all(len(v) == 1 for v in seen.values())
    assert {v for s in seen.values() for v in s} == {"a", "b"}


def test_openai_client_streaming_and_completions(gw) -> None:
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="ok", messages=MSGS, stream=True, user="s1") if c.choices)
    assert text == "Hello there, this is a scripted answer."
    comp = client.completions.create(model="ok", prompt="Say", user="s1")
    assert comp.choices[0].text.startswith("Hello") and comp.usage.completion_tokens == 9
    parts = [c.choices[0].text for c in client.completions.create(model="ok", prompt="Say", stream=True, user="s1")]
    assert "".join(parts).startswith("Hello")
    assert [m.id for m in client.models.list()] == ["ok"]


def test_units_in_no_experiment_go_to_the_default_backend_without_events(gw) -> None:
    before = len(gw.events())
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS})
    assert r.status_code == 200 and "x-ablab-variant" not in r.headers and len(gw.events()) == before


def test_bad_requests_are_openai_errors(gw) -> None:
    with httpx.Client(timeout=10) as c:
        r = c.post(gw.url + "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
        r = c.post(gw.url + "/v1/chat/completions", json={"model": "ok"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_strategy_backend_choice_and_unservable_strategy(backend, tmp_path) -> None:
    from ablab.platform.gateway.settings import Backend

    with ScriptedBackend() as other, gateway_for(backend.url, tmp_path, {"a": {"backend": "other", "system_prompt": "S"},
                                                                        "b": {"backend": "missing"}},
                                                 extra={"other": Backend("other", other.url)}) as g:
        sdk = g.state().sdk
        by_variant = {}
        for i in range(40):
            by_variant.setdefault(sdk.assign(f"k{i}", log_exposure=False)[0].variant, f"k{i}")
        with httpx.Client(timeout=10) as c:
            r = c.post(g.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS, "user": by_variant["a"]})
            assert r.status_code == 200 and other.requests[-1][1]["messages"][0] == {"role": "system", "content": "S"}
            r = c.post(g.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS, "user": by_variant["b"]})
        assert r.status_code == 500 and "backend='missing'" in r.json()["error"]["message"]
        assert inference(g, r.headers["x-ablab-trace-id"])["error"] == "strategy_unsupported"


def test_metrics_endpoint(gw) -> None:
    with httpx.Client(timeout=10) as c:
        c.post(gw.url + "/v1/chat/completions", json={"model": "ok", "messages": MSGS, "user": "m"})
        text = c.get(gw.url + "/metrics").text
    assert 'ablab_gateway_requests_total{backend="scripted",endpoint="chat",outcome="ok"}' in text
