"""Fuzz: 2,000 mutated bodies per endpoint (seeded, so a failure replays) against a real
gateway in front of the scripted backend, with variants that rewrite bodies (system
prompt, CoT, template, params) so the rewrite and metering paths see every mutation.

No answer may be a 5xx (the scripted backend never sends one for these models, so any 5xx
would be the gateway's own); every 4xx is in OpenAI's error shape; no bookkeeping failure and
no event refused by the schema; the gateway still answers a plain request at the end."""

from __future__ import annotations

import json
import random
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
from ablab.platform.gateway.app import create_app
from ablab.platform.gateway.limits import uvicorn_options
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab.platform.gateway.settings import Backend, GatewaySettings
from ablab.platform.sdk import AblabClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PER_ENDPOINT = 2000
SEED = 36
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
BASE = {
    "/v1/chat/completions": {"model": "ok", "messages": MSGS, "max_tokens": 8, "temperature": 0.5, "user": "fuzz-1",
                             "stream": False, "stream_options": {"include_usage": True}, "tools": [], "stop": ["\n"]},
    "/v1/completions": {"model": "ok", "prompt": "Once upon a time", "max_tokens": 8, "user": "fuzz-2", "stream": True,
                        "logprobs": 1, "echo": False},
    "/v1/embeddings": {"model": "ok", "input": ["a sentence", "another"], "user": "fuzz-3", "encoding_format": "float"},
    "/v1/responses": {"model": "ok", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
                      "instructions": "Be brief.", "user": "fuzz-4", "max_output_tokens": 16},
}
VARIANTS = {"a": {}, "b": {"system_prompt": "Answer in one word.", "cot_depth": 2, "params": {"temperature": 0.1}},
            "c": {"prompt_template": "structured", "params": {"max_tokens": 4}},
            "d": {"dialogue_state": {"slots": {"city": "(?i)in ([A-Z][a-z]+)"}},
                  "prompt_split": {"prefill_tps": 1000.0, "latency_budget_ms": 5.0}}}


def random_string(rng: random.Random) -> str:
    pools = ["abcxyz", "\u00e9\u4e2d\U0001f600", "\x00\x01\n\t\"\\", "{}[]:,", "data: [DONE]\n\n", "/etc/passwd"]
    if rng.random() < 0.02:
        return "x" * rng.randint(10_000, 200_000)
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 24)))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 3 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 1, 7, 2**31, 2**63 - 1, -(2**63), 10**6])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, -1e-308, 3.14])
    if kind in (4, 5, 6):
        return random_string(rng)
    if kind in (7, 8):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {random_string(rng): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def set_at(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = root
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return root


def mutate(rng: random.Random, base: dict[str, Any]) -> bytes:
    body: Any = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        targets = paths(body)
        if op in (0, 1):  # replace any value with any JSON value
            body = set_at(body, rng.choice(targets), random_value(rng))
        elif op == 2 and isinstance(body, dict) and body:  # drop a field
            body.pop(rng.choice(list(body)))
        elif op == 3 and isinstance(body, dict):  # add a field (a known one, or any)
            known = ["messages", "prompt", "input", "stream", "stream_options", "n", "tools", "model", "user",
                     "max_tokens", "response_format", "logit_bias", "seed", "stop", "metadata"]
            body[rng.choice(known) if rng.random() < 0.7 else random_string(rng)] = random_value(rng)
        elif op == 4:  # replace a container's member with a container of a different kind
            candidates = [t for t in targets if t]
            if candidates:
                body = set_at(body, rng.choice(candidates), rng.choice([[], {}, [[]], [{}], {"role": 1}]))
        else:
            body = rng.choice([body, [body], random_value(rng)])
    raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
    if rng.random() < 0.15:  # bytes that are not JSON at all, or not UTF-8
        cut = rng.randrange(len(raw) + 1)
        raw = rng.choice([raw[:cut], raw[:cut] + bytes([rng.randrange(256)]) + raw[cut:], raw + b"\xff", b"\xfe" + raw])
    return raw


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def fuzz_gateway(backend_url: str, tmp: Path) -> Iterator[tuple[str, Any]]:
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    spec = ExperimentSpec(key="fuzz", salt="fuzz-salt", control="a",
                          variants=tuple(VariantSpec(k, 1.0, s) for k, s in VARIANTS.items()))
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1")
    sdk._ready.set()
    settings = GatewaySettings(backends={"s": Backend("s", backend_url, timeout_s=10.0, responses=True)},
                               default_backend="s", outbox_dir=tmp / "outbox", max_body_bytes=1024 * 1024)
    app = create_app(settings, sdk=sdk, ship=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                                           **uvicorn_options()))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "gateway failed to start"
        thread.join(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("endpoint", list(BASE))
def test_mutated_bodies_never_get_a_5xx(endpoint: str, tmp_path: Path) -> None:
    rng = random.Random(f"{SEED}-{endpoint}")
    statuses: Counter[int] = Counter()
    with ScriptedBackend(tokens=4) as backend, fuzz_gateway(backend.url, tmp_path) as (url, app), \
            httpx.Client(timeout=30) as client:
        for i in range(PER_ENDPOINT):
            raw = mutate(rng, BASE[endpoint])
            unit = {"x-ablab-unit": f"unit-{i % 50}"} if i % 2 else {}
            r = client.post(url + endpoint, content=raw, headers={"content-type": "application/json", **unit})
            statuses[r.status_code] += 1
            assert r.status_code < 500, (i, raw[:500], r.status_code, r.text[:500])
            if r.status_code >= 400:
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), (raw[:300], err)
        assert client.post(url + endpoint, json=BASE[endpoint]).status_code == 200  # still serving
        registry = app.state.holder["state"].metrics.registry
        failures = registry.get_sample_value("ablab_gateway_bookkeeping_failures_total", {"stage": "events"}) or 0
        refused = registry.get_sample_value("ablab_gateway_events_total", {"result": "refused"}) or 0
    print(f"{endpoint}: {dict(sorted(statuses.items()))}")
    assert failures == 0 and refused == 0
    assert statuses[200] > PER_ENDPOINT // 20 and statuses[400] > PER_ENDPOINT // 20  # both sides were exercised
