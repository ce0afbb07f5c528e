"""The prompt strategies through the real gateway (uvicorn, the real SDK's assignment, the
outbox) in front of a fake backend that counts prompt tokens as words: the backend receives
the rewritten prompt, reports fewer prompt tokens, and the inference event carries what each
strategy did."""

from __future__ import annotations

import httpx
from test_prompting_pipeline import CHAT, SPLIT_BODY, Fake

from ablab_testing.gateway_harness import gateway_for, serve

STRATEGY = {"dialogue_state": {"slots": {"name": r"(?i)my name is (\w+)"}},
            "prompt_split": {"latency_budget_ms": 100, "prefill_tps": 100}}


def test_prompt_strategies_through_the_gateway_reach_the_backend_and_the_event(tmp_path) -> None:
    fake = Fake()
    with serve(fake.app()) as backend, gateway_for(backend + "/v1", tmp_path, {"b": STRATEGY}) as gw:
        with httpx.Client(base_url=gw.url, timeout=30) as client:
            plain = client.post("/v1/chat/completions", json=CHAT)  # no unit: the caller's body, untouched
            assert plain.status_code == 200 and plain.json()["usage"]["prompt_tokens"] == 12
            r = client.post("/v1/chat/completions", json=CHAT, headers={"X-Ablab-Unit": "u1"})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["prompt_tokens"] == 2 + 10 + 4  # "Be brief." + the state message + the last turn
            trace = r.headers["x-ablab-trace-id"]
            split = client.post("/v1/chat/completions", json=SPLIT_BODY, headers={"X-Ablab-Unit": "u1"})
            assert split.status_code == 200
    sent = [b for kind, b in fake.seen if kind == "chat"]
    assert sent[1]["messages"][1]["content"] == "Known facts from earlier in this conversation:\n- name: Ada"
    # dialogue_state first (the soft user turn is history: gone), then the split: 10 tokens, 5 of them hard
    assert [m["content"] for m in sent[2]["messages"]] == ["Rules: be exact. six seven eight nine ten", "Question here?"]
    assert split.json()["usage"]["prompt_tokens"] == 10  # the declared budget: 100 tokens/s x 100 ms
    events = {e["trace_id"]: e for e in gw.events() if e["type"] == "inference"}
    ev = events[trace]
    assert ev["prompt_tokens"] == 16 and ev["measures"]["ds_slots"] == 1 and ev["measures"]["ds_turns_in"] == 3
    ev = events[split.headers["x-ablab-trace-id"]]
    assert ev["dims"]["split_rate"] == "declared" and ev["measures"]["split_budget_tokens"] == 10
    assert ev["measures"]["split_kept_tokens"] == 5 and ev["measures"]["prompt_rewrite_ms"] >= 0
