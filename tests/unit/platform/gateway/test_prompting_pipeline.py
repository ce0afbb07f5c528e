"""The prompt strategies' pipeline against a fake OpenAI-compatible backend (in process, over
ASGI) that offers a word tokenizer and prompt log-probabilities, or not: what reaches the
backend, what the request's notes (its event's measures and dims) say, the measured prefill
rate, and each fallback named."""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ablab.platform.gateway.metering import Measurement, inference_event
from ablab.platform.gateway.prompting import rewrite_request
from ablab.platform.gateway.prompting.pipeline import runtime
from ablab.platform.gateway.prompting.rates import MIN_SAMPLES, PrefillRates, take_notes
from ablab.platform.gateway.prompting.transforms import texts as tf_texts
from ablab.platform.gateway.rewrite import StrategyError, strategy_problems
from ablab.platform.gateway.settings import Backend

STOP = {"the", "a", "of", "is", "and", "to", "in"}


def words(text: str) -> list[str]:
    return re.findall(r"\s*\S+", text)


@dataclass
class Fake:
    """Tokens are words with their leading spaces; stop words are predictable (log p = -0.01),
    other words are not (-8). ``tokenizer``/``logprobs`` switch those endpoints off."""

    tokenizer: bool = True
    logprobs: bool = True
    vocab: dict[str, int] = field(default_factory=dict)
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def ids(self, text: str) -> list[int]:
        return [self.vocab.setdefault(w, len(self.vocab) + 1) for w in words(text)]

    def app(self) -> Starlette:
        def refuses(request: Request) -> JSONResponse | None:
            # as llama-cpp-python's server does (starlette-context): an X-Request-Id must be a UUID
            rid = request.headers.get("x-request-id")
            try:
                rid is None or uuid.UUID(rid)
            except ValueError:
                return JSONResponse({"detail": "bad request id"}, status_code=400)
            return None

        async def tokenize(request: Request) -> JSONResponse:
            if (bad := refuses(request)) is not None:
                return bad
            body = await request.json()
            self.seen.append(("tokenize", body))
            if not self.tokenizer:
                return JSONResponse({"detail": "no"}, status_code=404)
            return JSONResponse({"tokens": self.ids(body["input"])})

        async def detokenize(request: Request) -> JSONResponse:
            if (bad := refuses(request)) is not None:
                return bad
            body = await request.json()
            self.seen.append(("detokenize", body))
            back = {i: w for w, i in self.vocab.items()}
            return JSONResponse({"text": "".join(back[i] for i in body["tokens"])})

        async def completions(request: Request) -> JSONResponse:
            if (bad := refuses(request)) is not None:
                return bad
            body = await request.json()
            self.seen.append(("completions", body))
            if not self.logprobs:
                return JSONResponse({"choices": [{"text": "x", "index": 0, "logprobs": None}]})
            pieces = words(body["prompt"])
            lps = [None, *(-0.01 if p.strip().lower() in STOP else -8.0 for p in pieces[1:])]
            top = [None, *({p: lp} for p, lp in zip(pieces[1:], lps[1:]))]
            return JSONResponse({"choices": [{"text": " x", "index": 0, "logprobs": {
                "tokens": [*pieces, " x"], "text_offset": [], "token_logprobs": [*lps, -1.0], "top_logprobs": [*top, {" x": -1.0}]}}]})

        async def models(_: Request) -> JSONResponse:
            return JSONResponse({"data": [{"id": "fake", "meta": {"n_vocab": 1000}}]})

        async def chat(request: Request) -> JSONResponse:  # usage: the words of every message
            body = await request.json()
            self.seen.append(("chat", body))
            prompt = sum(len(words(t)) for m in body["messages"] for t in tf_texts(m))
            return JSONResponse({"id": "c", "object": "chat.completion", "model": body.get("model"),
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}})

        return Starlette(routes=[Route("/extras/tokenize", tokenize, methods=["POST"]),
                                 Route("/extras/detokenize", detokenize, methods=["POST"]),
                                 Route("/v1/completions", completions, methods=["POST"]),
                                 Route("/v1/models", models, methods=["GET"]),
                                 Route("/v1/chat/completions", chat, methods=["POST"])])


BACKEND = Backend(name="fake", url="http://fake.test/v1")


def state_for(fake: Fake, compress=None) -> Any:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake.app()))
    return SimpleNamespace(settings=SimpleNamespace(templates={}), clients={"fake": SimpleNamespace(client=lambda: client)},
                           compressor=lambda: compress)


def run(state: Any, body: dict[str, Any], strategy: dict[str, Any], *, chat: bool = True, trace: str = "t1") -> dict[str, Any]:
    return asyncio.run(rewrite_request(state, body, strategy, chat=chat, backend=BACKEND, trace_id=trace, events=1))


def measurement(**kw: Any) -> Measurement:
    base = {"start": 0.0, "end": 2.0, "first_token": None, "prompt_tokens": 10, "output_tokens": 3, "est_prompt_tokens": 10,
            "est_output_tokens": 3}
    return Measurement(**{**base, **kw})


def event_for(trace: str, m: Measurement | None = None) -> dict[str, Any]:
    return inference_event(m or measurement(), ts=datetime.now(UTC),
                           trace_id=trace, experiment="e", variant="v", unit_id="u", strategy="s", backend=BACKEND,
                           model="m", with_measures=True)


CHAT = {"model": "m", "messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "My name is Ada."},
    {"role": "assistant", "content": "Hi Ada."},
    {"role": "user", "content": "What is my name?"}]}


def test_no_prompt_strategy_forwards_the_callers_body_and_still_files_notes() -> None:
    state = state_for(Fake())
    assert run(state, CHAT, {}, trace="plain") is CHAT
    ev = event_for("plain")
    assert set(ev["measures"]) == {"tokens_estimated"} and ev["dims"] == {"backend": "fake", "model": "m"}


def test_dialogue_state_sends_the_slots_and_the_last_turn() -> None:
    state = state_for(Fake())
    out = run(state, CHAT, {"dialogue_state": {"slots": {"name": r"(?i)my name is (\w+)"}}, "system_prompt": "Answer."},
              trace="ds")
    assert out["messages"] == [{"role": "system", "content": "Answer."},
                               {"role": "system", "content": "Known facts from earlier in this conversation:\n- name: Ada"},
                               {"role": "user", "content": "What is my name?"}]
    assert CHAT["messages"][0]["content"] == "Be brief."  # not mutated
    ev = event_for("ds")
    assert {k: ev["measures"][k] for k in ("ds_turns_in", "ds_turns_out", "ds_slots")} == {"ds_turns_in": 3, "ds_turns_out": 1,
                                                                                           "ds_slots": 1}
    # the completions endpoint has no turns: unchanged
    assert run(state, {"prompt": "My name is Ada."}, {"dialogue_state": {"slots": {"n": "x"}}}, chat=False)["prompt"] == \
        "My name is Ada."


SPLIT_BODY = {"model": "m", "messages": [
    {"role": "system", "content": "Rules: be exact.<<<soft>>> one two three four five six seven eight nine ten"},
    {"role": "user", "content": "<<<soft>>> alpha beta gamma delta"},
    {"role": "user", "content": "Question here?"}]}


def test_prompt_split_cuts_the_soft_text_to_the_declared_rate_budget_oldest_first() -> None:
    fake = Fake()
    state = state_for(fake)
    # 100 tokens/s x 100 ms = 10 tokens; hard = "Rules: be exact." + "Question here?" = 3 + 2 words (+ the newline joining them)
    out = run(state, SPLIT_BODY, {"prompt_split": {"latency_budget_ms": 100, "prefill_tps": 100}}, trace="split")
    hard = len(words("Rules: be exact.\nQuestion here?"))
    assert hard == 5
    # soft budget 5: the latest soft text (4 words) whole, the oldest keeps its last 1
    assert [m["content"] for m in out["messages"]] == ["Rules: be exact. ten", " alpha beta gamma delta", "Question here?"]
    ev = event_for("split")
    assert ev["dims"]["split_rate"] == "declared" and ev["dims"]["split_tokenizer"] == "llama-cpp-python"
    assert {k: ev["measures"][k] for k in ("split_budget_tokens", "split_hard_tokens", "split_soft_tokens",
                                           "split_kept_tokens", "prefill_tps")} == {
        "split_budget_tokens": 10, "split_hard_tokens": 5, "split_soft_tokens": 14, "split_kept_tokens": 5, "prefill_tps": 100}
    # keep=start: the earliest soft text is served first
    out = run(state, SPLIT_BODY, {"prompt_split": {"latency_budget_ms": 100, "prefill_tps": 100, "keep": "start"}})
    assert [m["content"] for m in out["messages"]][:2] == ["Rules: be exact. one two three four five", ""]
    # a budget the hard text alone exceeds: every soft text goes, the hard text stays whole
    out = run(state, SPLIT_BODY, {"prompt_split": {"latency_budget_ms": 10, "prefill_tps": 100}})
    assert [m["content"] for m in out["messages"]] == ["Rules: be exact.", "", "Question here?"]


def test_prompt_split_uses_the_measured_rate_once_there_is_one() -> None:
    fake = Fake()
    state = state_for(fake)
    strategy = {"prompt_split": {"latency_budget_ms": 100}}
    out = run(state, SPLIT_BODY, strategy, trace="cold")
    assert "<<<soft>>>" not in str(out) and out["messages"][0]["content"].endswith("ten")  # unmeasured: kept whole
    assert event_for("cold")["dims"]["split_rate"] == "unmeasured"
    rates = runtime(state).rates
    # streamed, successful requests are samples: 50 tokens in 0.5 s from sending, four times -> 100 tokens/s
    for i in range(MIN_SAMPLES):
        run(state, {"model": "m", "messages": [{"role": "user", "content": "x"}]}, {}, trace=f"warm{i}")
        notes = take_notes.__globals__["_NOTES"][f"warm{i}"]
        event_for(f"warm{i}", measurement(start=0.0, first_token=notes.sent_at + 0.5, end=notes.sent_at + 1.0, prompt_tokens=50))
    assert rates.rate("fake") == pytest.approx(100.0)
    out = run(state, SPLIT_BODY, strategy, trace="warm")
    assert [m["content"] for m in out["messages"]] == ["Rules: be exact. ten", " alpha beta gamma delta", "Question here?"]
    ev = event_for("warm")
    assert ev["dims"]["split_rate"] == "measured" and ev["measures"]["prefill_tps"] == pytest.approx(100.0)


def test_prefill_rate_samples_are_streamed_successes_only() -> None:
    rates = PrefillRates(window=3, min_samples=2)
    assert rates.rate("b") is None
    rates.observe("b", 100, 1.0)
    assert rates.rate("b") is None  # one sample is not a rate
    rates.observe("b", 300, 1.0)
    assert rates.rate("b") == 200.0
    for _ in range(3):
        rates.observe("b", 10, 1.0)  # the window rolls
    assert rates.rate("b") == 10.0
    rates.observe("b", 0, 1.0)  # nothing measured: ignored
    assert rates.samples("b") == 3


def test_prompt_split_without_a_tokenizer_estimates_and_says_so() -> None:
    state = state_for(Fake(tokenizer=False))
    out = run(state, SPLIT_BODY, {"prompt_split": {"latency_budget_ms": 100, "prefill_tps": 100}}, trace="est")
    ev = event_for("est")
    assert ev["dims"]["split_tokenizer"] == "estimate" and "<<<soft>>>" not in str(out)
    assert ev["measures"]["split_hard_tokens"] == 8  # ~4 characters a token: 31 characters
    assert out["messages"][2]["content"] == "Question here?"


PROSE = "The cat is in the garden and the dog is in a house of the town"


def test_context_prune_with_the_backends_probabilities() -> None:
    fake = Fake()
    state = state_for(fake)
    body = {"model": "m", "messages": [{"role": "user", "content": PROSE}]}
    out = run(state, body, {"context_prune": {"window": 4, "tau": 0.18}}, trace="prune")
    # stop words are predictable (log p = -0.01 -> surprisal ~0.001): gone, except a window's best, the first and the last
    assert out["messages"][0]["content"] == "The cat garden dog house town"
    req = next(b for kind, b in fake.seen if kind == "completions")
    assert req["echo"] is True and req["max_tokens"] == 1 and req["logprobs"] == 20 and req["prompt"] == PROSE
    ev = event_for("prune")
    assert ev["dims"]["prune_scorer"] == "backend"
    assert (ev["measures"]["prune_tokens_in"], ev["measures"]["prune_tokens_out"]) == (16, 6)
    assert ev["measures"]["prune_chars_in"] == len(PROSE) and ev["measures"]["prune_chars_out"] == len(out["messages"][0]["content"])
    # a second identical text is served from the score cache (no second scoring call)
    run(state, body, {"context_prune": {"window": 4, "tau": 0.18}})
    assert sum(kind == "completions" for kind, _ in fake.seen) == 1


def test_context_prune_falls_back_to_the_in_repo_scorer_and_says_so() -> None:
    calls = []
    state = state_for(Fake(logprobs=False), compress=lambda text, tau, window: calls.append((tau, window)) or text[:10])
    body = {"model": "m", "messages": [{"role": "user", "content": "first " + PROSE}, {"role": "user", "content": PROSE}]}
    out = run(state, body, {"context_prune": {"window": 8, "tau": 0.3, "scope": "user"}}, trace="fallback")
    assert [m["content"] for m in out["messages"]] == ["first The ", PROSE[:10]] and calls == [(0.3, 8), (0.3, 8)]
    ev = event_for("fallback")
    assert ev["dims"]["prune_scorer"] == "in_repo" and "prune_tokens_in" not in ev["measures"]
    # no in-repo scorer either: unchanged, and the event says nothing pruned it
    state = state_for(Fake(logprobs=False))
    out = run(state, body, {"context_prune": {}}, trace="none")
    assert out["messages"][-1]["content"] == PROSE and event_for("none")["dims"]["prune_scorer"] == "none"


def test_all_three_compose_on_the_completions_prompt_too() -> None:
    state = state_for(Fake())
    out = run(state, {"model": "m", "prompt": "Answer exactly.<<<soft>>> " + PROSE},
              {"prompt_split": {"latency_budget_ms": 1000, "prefill_tps": 8}, "context_prune": {"window": 2}}, chat=False)
    # 8 tokens: hard 2 ("Answer", " exactly."), the soft text keeps its last 6 (" in a house of the town"); pruning
    # (window 2) then drops the predictable ones but keeps each window's best (" of": [" of", " the"] has none above tau)
    assert out["prompt"] == "Answer exactly. house of town"


def test_a_strategy_the_registry_would_refuse_is_refused_by_name_at_the_gateway() -> None:
    problems = strategy_problems({"dialogue_state": {"slots": {"x": "(a)\\1"}}, "context_prune": {"tau": 3}}, backends={},
                                 templates={})
    assert any(p.startswith("dialogue_state.slots.x: ") and "RE2" in p for p in problems)
    assert any(p.startswith("context_prune.tau: ") for p in problems)
    with pytest.raises(StrategyError, match="prompt_split.latency_budget_ms"):
        run(state_for(Fake()), CHAT, {"prompt_split": {"latency_budget_ms": -1}})


def test_the_events_caps_hold_with_many_server_metrics() -> None:
    state = state_for(Fake())
    run(state, CHAT, {"dialogue_state": {"slots": {"name": r"my name is (\w+)"}}}, trace="cap")
    ev = event_for("cap", measurement(server_metrics={f"server_m{i}": 1.0 for i in range(30)}))
    assert len(ev["measures"]) == 32 and "ds_turns_in" in ev["measures"] and "ds_slots" not in ev["measures"]
