"""The official openai client → ``ablab gateway`` → a real ``llama_cpp.server`` with SmolLM2,
with the real API (real Kafka, the in-process loader, chDB) behind the gateway's events.

Shows: streaming and not; a unit always gets the same variant (the one ``/v1/assign``
gives); the variant's rewrite reaches the backend (its ``params.max_tokens`` caps what the
backend generates, its CoT instruction lengthens the prompt the backend counts); every
request's events are in the outbox with TTFT <= e2e and tokens equal to the backend's usage,
and land in ClickHouse (``/results`` counts them and reproduces their mean e2e); feedback
posted with the returned trace id is attributed in ``/results``; a backend killed mid-stream
yields an error event while the gateway stays healthy.
"""

from __future__ import annotations

import signal
import subprocess

import httpx
import pytest

from ablab_testing import free_port, start_api, stop_api
from ablab_testing.gateway_stack import (
    create_experiment,
    label_and_check_results,
    llama_and_openai,
    llama_gateway_config,
    outbox_events,
    pick_units,
    start_gateway,
    start_llama,
    stop,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

openai = llama_and_openai()

KEY = "gw-smollm2"
MSGS = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
VARIANTS = {"a": {}, "b": {"cot_depth": 2, "params": {"max_tokens": 2}}}


@pytest.fixture(scope="module")
def stack(kafka_broker, tmp_path_factory):
    home = tmp_path_factory.mktemp("gateway-llama")
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home,
                    extra_env={"ABLAB_KAFKA_BOOTSTRAP": kafka_broker, "ABLAB_ANALYTICS": "true", "ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    procs: list[subprocess.Popen] = []
    try:
        create_experiment(api, KEY, VARIANTS)
        llama_port, gw_port = free_port(), free_port()
        llama = start_llama(home, llama_port)
        procs.append(llama)
        procs.append(start_gateway(api, home, llama_gateway_config(llama_port), gw_port))
        yield {"api": api, "gw": f"http://127.0.0.1:{gw_port}", "llama": llama, "home": home}
    finally:
        stop(procs)
        stop_api(api)


def test_gateway_in_front_of_llama_cpp(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    expected: dict[str, dict] = {}  # trace_id -> what the caller saw
    variant_of: dict[str, set[str]] = {}
    units = pick_units(stack["api"], KEY, per_variant=3)
    for i in range(2 * len(units)):
        unit = units[i // 2]
        if i % 2 == 0:
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=MSGS, max_tokens=6, temperature=0, extra_headers={"X-Ablab-Unit": unit})
            resp = raw.parse()
            trace, variant = raw.headers["x-ablab-trace-id"], raw.headers["x-ablab-variant"]
            expected[trace] = {"prompt": resp.usage.prompt_tokens, "out": resp.usage.completion_tokens, "variant": variant}
        else:
            with client.chat.completions.with_streaming_response.create(
                    model="smollm2", messages=MSGS, max_tokens=6, temperature=0, stream=True, user=unit) as raw:
                trace, variant = raw.headers["x-ablab-trace-id"], raw.headers["x-ablab-variant"]
                pieces = [c.choices[0].delta.content for c in raw.parse() if c.choices and c.choices[0].delta.content]
            assert "".join(pieces)
            expected[trace] = {"prompt": None, "out": len(pieces), "variant": variant}
        variant_of.setdefault(unit, set()).add(variant)
    assert all(len(v) == 1 for v in variant_of.values()), variant_of  # sticky
    assert {u: v.pop() for u, v in variant_of.items()} == {u: "ab"[i % 2] for i, u in enumerate(units)}  # as /v1/assign

    # The variant's rewrite reached the backend: b's params cap the answer, its CoT instruction lengthens the prompt.
    outs = {v: [e["out"] for e in expected.values() if e["variant"] == v] for v in "ab"}
    assert max(outs["b"]) <= 2 < max(outs["a"])
    prompts = {v: {e["prompt"] for e in expected.values() if e["variant"] == v and e["prompt"]} for v in "ab"}
    assert len(prompts["a"]) == 1 and len(prompts["b"]) == 1 and min(prompts["b"]) > max(prompts["a"])

    events = {e["trace_id"]: e for e in outbox_events(stack["home"]) if e["type"] == "inference"}
    exposures = {e["trace_id"] for e in outbox_events(stack["home"]) if e["type"] == "exposure"}
    assert set(expected) <= set(events) and set(expected) <= exposures
    for trace, seen in expected.items():
        ev = events[trace]
        assert ev["error"] is None and ev["variant"] == seen["variant"]
        assert 0 <= ev["ttft_ms"] <= ev["e2e_ms"]
        assert ev["output_tokens"] == seen["out"], (ev, seen)
        if seen["prompt"] is not None:
            assert ev["prompt_tokens"] == seen["prompt"]
        assert ev["device_s"] > 0 and ev["price_version"] in ("2026-01", "2026-07")
        # llama.cpp streams carry no usage: their tokens are counted and marked estimated
        assert ev["measures"]["tokens_estimated"] == (1.0 if seen["prompt"] is None else 0.0)
        if seen["prompt"] is None and seen["out"] > 1:
            assert ev["measures"]["itl_ms_mean"] >= 0.0

    # Feedback by the returned trace ids: b's answers labelled correct, a's not.
    label_and_check_results(stack, KEY, expected=expected, events=events, correct="b", source="judge")


def test_backend_killed_mid_stream_gives_an_error_event_and_a_healthy_gateway(stack) -> None:
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    unit = pick_units(stack["api"], KEY, per_variant=1)[0]  # variant a: no max_tokens cap
    with client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=[{"role": "user", "content": "Write a long story about a lighthouse."}],
            max_tokens=400, stream=True, user=unit) as raw:
        trace = raw.headers["x-ablab-trace-id"]
        with pytest.raises(openai.APIError):
            for n, _ in enumerate(raw.parse()):
                if n == 3:
                    stack["llama"].send_signal(signal.SIGKILL)
    stack["llama"].wait(10)
    assert httpx.get(stack["gw"] + "/healthz", timeout=5).status_code == 200
    with pytest.raises(openai.APIStatusError) as info:  # the next request fails fast and is recorded
        client.chat.completions.create(model="smollm2", messages=MSGS, user=unit)
    assert info.value.status_code == 502
    events = [e for e in outbox_events(stack["home"]) if e["type"] == "inference"]
    broken = next(e for e in events if e["trace_id"] == trace)
    assert broken["error"] == "backend_stream_broken" and broken["ttft_ms"] <= broken["e2e_ms"]
    assert events[-1]["error"] == "backend_unreachable"
