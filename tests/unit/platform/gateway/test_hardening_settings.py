"""The hardening settings and the pure parts: caller keys (digests only, constant-time
compare), whose Authorization goes where, backend model lists, the error scrubber, the
Responses API's stream events, and token estimates over any JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablab.platform.gateway import protocol
from ablab.platform.gateway.auth import (
    forwarded_authorization,
    key_allowed,
    key_digest,
    load_key_digests,
    presented_key,
)
from ablab.platform.gateway.settings import ANY_MODEL, Backend, GatewayConfigError, load_settings

KEY = "a-gateway-key-of-some-length"


def settings(backends: dict, **env: str):
    return load_settings(env={"ABLAB_GATEWAY_BACKENDS": json.dumps(backends), **env})


def test_backend_model_and_auth_settings() -> None:
    s = settings({"a": {"url": "http://a/v1"}, "b": {"url": "http://b/v1", "models": ["x", "y"]},
                  "c": {"url": "http://c/v1", "models": ["*"]}, "d": {"url": "http://d/v1", "any_model": True},
                  "v": {"url": "http://v/v1", "kind": "vllm", "forward_caller_auth": False},
                  "o": {"url": "http://o/v1", "responses": True}})
    b = s.backends
    assert b["a"].models is None and b["b"].models == ("x", "y") and b["c"].any_model and b["d"].any_model
    assert Backend("code", "http://x").models == ANY_MODEL  # built in code: any model, as before
    assert b["v"].serves_responses and b["o"].serves_responses and not b["a"].serves_responses
    assert b["a"].forwards_caller_auth and not b["v"].forwards_caller_auth
    assert s.variant_headers is False and s.caller_key_digests == frozenset()
    for bad in ({"models": []}, {"models": "x"}, {"models": [1]}, {"any_model": "yes"}, {"forward_caller_auth": 1},
                {"responses": "true"}):
        with pytest.raises(GatewayConfigError, match=f"backends.a.{next(iter(bad))}"):
            settings({"a": {"url": "http://a/v1", **bad}})


def test_variant_headers_and_body_limit_from_env_or_yaml(tmp_path: Path) -> None:
    assert settings({"a": {"url": "http://a/v1"}}, ABLAB_GATEWAY_VARIANT_HEADERS="true").variant_headers is True
    path = tmp_path / "g.yaml"
    path.write_text("backends:\n  a: {url: 'http://a/v1'}\nvariant_headers: true\nmax_body_bytes: 2048\n")
    s = load_settings(config_file=path, env={})
    assert s.variant_headers is True and s.max_body_bytes == 2048
    with pytest.raises(GatewayConfigError, match="VARIANT_HEADERS"):
        settings({"a": {"url": "http://a/v1"}}, ABLAB_GATEWAY_VARIANT_HEADERS="maybe")
    with pytest.raises(GatewayConfigError, match="max_body_bytes"):
        settings({"a": {"url": "http://a/v1"}}, ABLAB_GATEWAY_MAX_BODY_BYTES="12")


def test_a_backend_lending_an_operator_key_needs_caller_keys(tmp_path: Path) -> None:
    lender = {"h": {"url": "http://h/v1", "api_key_env": "OPENAI_API_KEY"}}
    with pytest.raises(GatewayConfigError, match="ABLAB_GATEWAY_KEYS") as info:
        settings(lender)
    assert "['h']" in str(info.value)
    s = settings(lender, ABLAB_GATEWAY_KEYS=f"{KEY}, another-key-0123456789")
    assert s.caller_key_digests == {key_digest(KEY), key_digest("another-key-0123456789")}
    assert KEY not in repr(s)  # digests only, and not even those in the repr
    keys = tmp_path / "keys"
    keys.write_text(f"# team a\nsha256:{key_digest(KEY)}\n\n")
    assert settings(lender, ABLAB_GATEWAY_KEYS_FILE=str(keys)).caller_key_digests == {key_digest(KEY)}
    keys.write_text(KEY + "\n")  # a raw key in the file is refused, and not echoed
    with pytest.raises(GatewayConfigError) as info:
        settings(lender, ABLAB_GATEWAY_KEYS_FILE=str(keys))
    assert KEY not in str(info.value) and "line 1" in str(info.value)
    with pytest.raises(GatewayConfigError, match="at least 16"):
        load_key_digests({"ABLAB_GATEWAY_KEYS": "short"})


def test_keys_are_compared_by_digest_and_taken_from_either_header() -> None:
    digests = frozenset({key_digest(KEY)})
    assert key_allowed(digests, KEY) and not key_allowed(digests, KEY + "x") and not key_allowed(digests, None)
    assert not key_allowed(frozenset(), KEY)
    assert presented_key({"authorization": f"Bearer {KEY}"}) == (KEY, True)
    assert presented_key({"x-ablab-key": KEY, "authorization": "Bearer backend"}) == (KEY, False)
    assert presented_key({"authorization": f"Basic {KEY}"}) == (None, False)


def test_the_callers_authorization_goes_only_to_the_backend_it_named() -> None:
    own = Backend("own", "http://own")
    keyed = Backend("keyed", "http://k", api_key_env="K")
    opted_in = Backend("in", "http://i", api_key_env="K", forward_caller_auth=True)
    assert forwarded_authorization("Bearer c", backend=own, named=own) == "Bearer c"
    assert forwarded_authorization("Bearer c", backend=own, named=keyed) is None  # moved by a variant
    assert forwarded_authorization("Bearer c", backend=keyed, named=keyed) is None  # has its own key
    assert forwarded_authorization("Bearer c", backend=opted_in, named=opted_in) == "Bearer c"
    assert forwarded_authorization(None, backend=own, named=own) is None


def test_backend_error_bodies_lose_file_paths_but_keep_their_meaning() -> None:
    body, changed = protocol.backend_error_body(500, json.dumps({"error": {
        "message": "Value error at /home/u/llama.cpp/src/llama-vocab.cpp:12 and C:\\Users\\me\\x.py", "type": "server_error",
        "code": 500}}).encode())
    err = json.loads(body)["error"]
    assert changed and "/home/u" not in err["message"] and "Users" not in err["message"] and err["code"] == "500"
    assert err["message"].startswith("Value error at <path>:12")
    same = json.dumps({"error": {"message": "scripted 500", "type": "server_error", "param": None, "code": None}}).encode()
    assert protocol.backend_error_body(500, same) == (same, False)
    body, changed = protocol.backend_error_body(422, b'{"detail": "field required at /opt/app/x.py"}')
    assert json.loads(body)["error"] == {"message": "field required at <path>", "type": "invalid_request_error",
                                         "param": None, "code": "backend_http_422"}
    body, _ = protocol.backend_error_body(502, b"x" * 5000)
    assert len(json.loads(body)["error"]["message"]) <= protocol.MAX_RELAYED_ERROR_CHARS + 1
    assert "https://example.com/a/b" in protocol.scrub("see https://example.com/a/b")  # URLs are not paths


def test_responses_api_stream_events_are_measured_and_never_stripped() -> None:
    delta = protocol.view_chunk({"type": "response.output_text.delta", "delta": "Paris"})
    assert delta.generated and delta.text_chars == 5 and not delta.usage_only
    done = protocol.view_chunk({"type": "response.completed", "response": {"usage": {"input_tokens": 3, "output_tokens": 2}}})
    assert done.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": None}
    assert not done.usage_only and done.finish_reason == "stop"
    failed = protocol.view_chunk({"type": "response.failed", "response": {"error": {"message": "x"}}})
    assert failed.error == {"message": "x"}
    assert not protocol.view_chunk({"type": "response.created", "response": {}}).generated


@pytest.mark.parametrize("body", [{"messages": 7}, {"messages": [7, None, {"content": 3}]}, {"prompt": {"a": 1}},
                                  {"input": [[1, 2], {"content": [{"text": 5}, {"text": "ok"}]}]}, {"messages": "x"}])
def test_token_estimates_read_any_json(body) -> None:
    protocol.message_text(body)  # never raises
    assert protocol.response_view({"choices": 7, "output": "x"}) == (None, 0)
    assert protocol.response_view({"choices": [{"message": {"tool_calls": 5}}]}) == (None, 0)
