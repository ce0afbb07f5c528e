"""Shadows end to end: the real API (its registry validates the experiment's ``shadow`` and
publishes it in the SDK config) → a running ``ablab gateway`` → a real ``llama_cpp.server``
with SmolLM2, called with the official ``openai`` client.

Shows: a bad shadow is a 422 naming the field; every request of the shadowed experiment gets
a shadow (fraction 1), the caller's answer is exactly the one the backend gives the primary
request alone (the shadow's is never returned), the shadow reached the backend rewritten by its
own strategy (its system prompt counts in the prompt tokens, its ``max_tokens`` caps its answer)
and its event carries ``shadow_of`` with its own trace id, the primary's experiment, variant and
unit; the primary's event says ``shadow: sent``; ``/metrics`` counts them.
"""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest

from ablab_testing import free_port, start_api, stop_api
from ablab_testing.gateway_stack import (
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

KEY = "gw-shadow"
MSGS = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
# Longer than the default system prompt SmolLM2's chat template puts in a request that has none.
TUTOR = ("You are a terse geography tutor for students who are learning French. Always reply in French, "
         "with one single word, and never add anything else to your answer.")
SHADOW = {"strategy": {"system_prompt": TUTOR, "params": {"max_tokens": 2}},
          "fraction": 1.0, "max_concurrency": 4, "timeout_s": 300}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("gateway-shadow")
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home, extra_env={"ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    procs: list[subprocess.Popen] = []
    try:
        with api.client("editor") as c:
            body = {"key": KEY, "name": KEY, "traffic": 1, "control": "a", "shadow": {**SHADOW, "fraction": 1.5},
                    "variants": [{"key": "a", "weight": 1}, {"key": "b", "weight": 1, "strategy": {"params": {"max_tokens": 3}}}]}
            refused = c.post("/v1/experiments", json=body)
            assert refused.status_code == 422 and refused.json()["field"] == "shadow.fraction", refused.text
            r = c.post("/v1/experiments", json={**body, "shadow": SHADOW})
            assert r.status_code == 201, r.text
            c.post(f"/v1/experiments/{KEY}/start").raise_for_status()
        llama_port, gw_port = free_port(), free_port()
        llama = start_llama(home, llama_port)
        procs.append(llama)
        procs.append(start_gateway(api, home, llama_gateway_config(llama_port), gw_port))
        yield {"api": api, "gw": f"http://127.0.0.1:{gw_port}", "llama": f"http://127.0.0.1:{llama_port}/v1", "home": home}
    finally:
        stop(procs)
        stop_api(api)


def test_a_shadow_is_sent_recorded_and_never_returned(stack) -> None:
    direct = openai.OpenAI(base_url=stack["llama"], api_key="unused", max_retries=0, timeout=600)
    alone = direct.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=6, temperature=0)
    client = openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)
    [unit_a, unit_b] = pick_units(stack["api"], KEY, per_variant=1)

    seen: dict[str, dict] = {}  # primary trace id -> what the caller saw
    for unit in (unit_a, unit_b):
        raw = client.chat.completions.with_raw_response.create(model="smollm2", messages=MSGS, max_tokens=6, temperature=0,
                                                               user=unit)
        resp = raw.parse()
        seen[raw.headers["x-ablab-trace-id"]] = {"variant": raw.headers["x-ablab-variant"], "unit": unit, "stream": False,
                                                 "text": resp.choices[0].message.content,
                                                 "prompt": resp.usage.prompt_tokens, "out": resp.usage.completion_tokens}
    with client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=MSGS, max_tokens=6, temperature=0, stream=True, user=unit_a) as raw:
        trace = raw.headers["x-ablab-trace-id"]
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    seen[trace] = {"variant": "a", "unit": unit_a, "stream": True, "text": text}

    # The caller's answer is the primary's: what the backend answers the same request alone.
    for s in seen.values():
        if s["variant"] == "a":
            assert s["text"] == alone.choices[0].message.content, (s, alone)
    assert [s["variant"] for s in seen.values()] == ["a", "b", "a"]

    deadline = time.monotonic() + 300
    while True:
        events = [e for e in outbox_events(stack["home"]) if e["type"] == "inference"]
        shadows = {e["shadow_of"]: e for e in events if e.get("shadow_of")}
        if set(shadows) >= set(seen) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    primaries = {e["trace_id"]: e for e in events if not e.get("shadow_of")}
    assert set(shadows) == set(seen), (shadows, seen)
    for trace, s in seen.items():
        p, sh = primaries[trace], shadows[trace]
        assert p["shadow"] == "sent" and p["error"] is None
        assert sh["error"] is None and sh["trace_id"] != trace and "shadow" not in sh
        assert (sh["experiment"], sh["variant"], sh["unit_id"]) == (KEY, s["variant"], p["unit_id"])
        assert sh["strategy"] != p["strategy"]
        assert 0 < sh["output_tokens"] <= 2  # the shadow's own max_tokens, whatever the primary's variant
        assert 0 <= sh["ttft_ms"] <= sh["e2e_ms"] and sh["device_s"] > 0
        if not s["stream"]:
            assert p["output_tokens"] == s["out"] and p["prompt_tokens"] == s["prompt"]
            assert sh["prompt_tokens"] > p["prompt_tokens"]  # the shadow's system prompt reached the backend
        if s["variant"] == "a" and not s["stream"]:
            assert p["output_tokens"] > 2
    # A shadow exposes no unit: the exposures are the primaries'.
    exposures = {e["trace_id"] for e in outbox_events(stack["home"]) if e["type"] == "exposure"}
    assert exposures >= set(seen) and not exposures & {e["trace_id"] for e in shadows.values()}

    metrics = httpx.get(stack["gw"] + "/metrics", timeout=10).text
    assert f'ablab_gateway_shadows_total{{experiment="{KEY}",result="sent"}} 3.0' in metrics
    assert f'ablab_gateway_shadows_total{{experiment="{KEY}",result="ok"}} 3.0' in metrics
