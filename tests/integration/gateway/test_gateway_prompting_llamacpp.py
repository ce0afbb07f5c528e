"""The prompt strategies (issue #34 item 3) on a real backend: the official openai client →
``ablab gateway`` → ``llama_cpp.server`` with SmolLM2-135M-Instruct, the real API behind the
gateway's assignment (no event pipeline: the events are read from the gateway's outbox).

Shows, with the prompt tokens the backend itself reports:

- ``dialogue_state`` on a fixed conversation sends exactly the slots and the last turn: the
  backend counts the same tokens as for that hand-written conversation sent to it directly,
  and fewer than for the whole history;
- ``prompt_split`` with a declared rate keeps the hard text and cuts the soft text to the
  budget: the backend counts the whole prompt's tokens minus the soft tokens cut (to a
  couple of tokens: texts are tokenized apart, the prompt whole), and with no declared rate
  the gateway uses the rate it measured on the experiment's streamed requests;
- ``context_prune`` scored by the backend itself (its tokenizer and its prompt
  log-probabilities) shrinks an English paragraph measurably (the numbers are printed).
"""

from __future__ import annotations

import subprocess

import httpx
import pytest

from ablab_testing import free_port, start_api, stop_api
from ablab_testing.gateway_stack import (
    create_experiment,
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

KEY = "gw-prompting"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "Hi! My name is Priya and I live in Lisbon."},
    {"role": "assistant", "content": "Nice to meet you, Priya! How can I help you today?"},
    {"role": "user", "content": "My favourite colour is green. Tell me a fun fact about octopuses."},
    {"role": "assistant", "content": "Octopuses have three hearts, and their blood is blue because it carries copper."},
    {"role": "user", "content": "Wow. And one about dolphins?"},
    {"role": "assistant", "content": "Dolphins sleep with one half of their brain at a time, so they can keep breathing."},
    {"role": "user", "content": "In which city do I live? Answer in one word."},
]
SLOTS = {"name": r"(?i)my name is (\w+)", "city": r"(?i)i live in (\w+)", "colour": r"(?i)my favou?rite colou?r is (\w+)"}
DS_EXPECTED = [SYSTEM, {"role": "system", "content": "Known facts from earlier in this conversation:\n"
                                                      "- name: Priya\n- city: Lisbon\n- colour: green"}, CONVERSATION[-1]]

PARAGRAPH = ("The Great Barrier Reef is the largest coral reef system in the world. It is composed of over two thousand nine "
             "hundred individual reefs and nine hundred islands stretching for over two thousand three hundred kilometres. The "
             "reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen from outer space and is "
             "the world's biggest single structure made by living organisms. This reef structure is composed of and built by "
             "billions of tiny organisms, known as coral polyps.")
HARD_SYSTEM, HARD_USER = "Answer in one short sentence.", "Where is the Great Barrier Reef?"
SPLIT_MESSAGES = [{"role": "system", "content": f"{HARD_SYSTEM}<<<soft>>> Background: {PARAGRAPH}"},
                  {"role": "user", "content": HARD_USER}]
WHOLE_MESSAGES = [{"role": "system", "content": f"{HARD_SYSTEM} Background: {PARAGRAPH}"}, {"role": "user", "content": HARD_USER}]
PRUNE_MESSAGES = [{"role": "user", "content": f"{PARAGRAPH} Where is the reef?"}]

VARIANTS = {
    "a": {},
    "ds": {"dialogue_state": {"slots": SLOTS}},
    "split": {"prompt_split": {"latency_budget_ms": 60, "prefill_tps": 1000}},  # 60 tokens
    "measured": {"prompt_split": {"latency_budget_ms": 250}},
    "prune": {"context_prune": {"window": 32, "tau": 0.18}},
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    home = tmp_path_factory.mktemp("gateway-prompting")
    api = start_api(f"sqlite:///{home / 'ablab.db'}", home, extra_env={"ABLAB_GUARDRAIL_INTERVAL_S": "0"})
    procs: list[subprocess.Popen] = []
    try:
        create_experiment(api, KEY, VARIANTS)
        llama_port, gw_port = free_port(), free_port()
        llama = start_llama(home, llama_port)
        procs.append(llama)
        procs.append(start_gateway(api, home, llama_gateway_config(llama_port), gw_port))
        units = pick_units(api, KEY, per_variant=1, variants=tuple(VARIANTS))
        yield {"gw": f"http://127.0.0.1:{gw_port}", "llama": f"http://127.0.0.1:{llama_port}", "home": home,
               "unit": dict(zip(VARIANTS, units))}
    finally:
        stop(procs)
        stop_api(api)


def _client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["gw"] + "/v1", api_key="unused", max_retries=0, timeout=600)


def _via_gateway(stack, variant: str, messages: list[dict]) -> tuple[int, str]:
    """(prompt tokens the backend reported, trace id) of one non-streamed request of ``variant``'s unit."""
    raw = _client(stack).chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, max_tokens=1, temperature=0, extra_headers={"X-Ablab-Unit": stack["unit"][variant]})
    assert raw.headers["x-ablab-variant"] == variant
    return raw.parse().usage.prompt_tokens, raw.headers["x-ablab-trace-id"]


def _direct(stack, messages: list[dict]) -> int:
    """Prompt tokens the backend reports for ``messages`` sent to it directly (no gateway)."""
    r = httpx.post(stack["llama"] + "/v1/chat/completions", json={"model": "smollm2", "messages": messages, "max_tokens": 1,
                                                                  "temperature": 0}, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["prompt_tokens"]


def _tokens(stack, text: str) -> int:
    r = httpx.post(stack["llama"] + "/extras/tokenize", json={"input": text}, timeout=60)
    r.raise_for_status()
    return len(r.json()["tokens"])


def _event(stack, trace: str) -> dict:
    return next(e for e in outbox_events(stack["home"]) if e["type"] == "inference" and e["trace_id"] == trace)


def test_dialogue_state_sends_the_slots_and_the_last_turn(stack) -> None:
    whole, _ = _via_gateway(stack, "a", CONVERSATION)
    state, trace = _via_gateway(stack, "ds", CONVERSATION)
    expected = _direct(stack, DS_EXPECTED)
    print(f"\ndialogue_state: {whole} prompt tokens with the whole history -> {state} with the slots and the last turn "
          f"({whole - state} fewer, {100 * (whole - state) / whole:.1f} %)")
    assert whole == _direct(stack, CONVERSATION)  # the control's body reaches the backend as sent
    assert state == expected < whole  # exactly the slots' system message and the last turn
    ev = _event(stack, trace)
    assert ev["prompt_tokens"] == state and ev["error"] is None
    assert (ev["measures"]["ds_turns_in"], ev["measures"]["ds_turns_out"], ev["measures"]["ds_slots"]) == (7, 1, 3)


def test_prompt_split_cuts_the_soft_text_to_the_declared_budget(stack) -> None:
    whole = _direct(stack, WHOLE_MESSAGES)
    split, trace = _via_gateway(stack, "split", SPLIT_MESSAGES)
    ev = _event(stack, trace)
    hard = _tokens(stack, f"{HARD_SYSTEM}\n{HARD_USER}")
    soft = _tokens(stack, f" Background: {PARAGRAPH}")
    m = ev["measures"]
    assert ev["dims"]["split_rate"] == "declared" and ev["dims"]["split_tokenizer"] == "llama-cpp-python"
    assert (m["split_budget_tokens"], m["split_hard_tokens"], m["split_soft_tokens"]) == (60, hard, soft)
    assert m["split_kept_tokens"] == 60 - hard
    cut = soft - m["split_kept_tokens"]
    print(f"\nprompt_split (60 tokens at a declared 1000 tokens/s): hard {hard}, soft {soft} -> {m['split_kept_tokens']} kept; "
          f"the backend counted {whole} -> {split} prompt tokens (expected {whole - cut})")
    assert abs(split - (whole - cut)) <= 3, (split, whole, cut)
    assert split < whole


def test_prompt_split_uses_the_rate_measured_on_the_experiments_streams(stack) -> None:
    client = _client(stack)
    for _ in range(5):  # streamed requests of a unit in the experiment: samples of the backend's prefill rate
        with client.chat.completions.with_streaming_response.create(
                model="smollm2", messages=WHOLE_MESSAGES, max_tokens=2, temperature=0, stream=True,
                extra_headers={"X-Ablab-Unit": stack["unit"]["a"]}) as raw:
            assert [c for c in raw.parse()]
    whole = _direct(stack, WHOLE_MESSAGES)
    split, trace = _via_gateway(stack, "measured", SPLIT_MESSAGES)
    m, dims = _event(stack, trace)["measures"], _event(stack, trace)["dims"]
    assert dims["split_rate"] == "measured" and m["prefill_tps"] > 0
    # the rate is rounded to 3 decimals in the event: the budget is the floor of the unrounded one
    assert abs(m["split_budget_tokens"] - m["prefill_tps"] * 250 / 1000.0) <= 1
    kept = max(0, min(m["split_soft_tokens"], m["split_budget_tokens"] - m["split_hard_tokens"]))
    assert m["split_kept_tokens"] == kept
    cut = m["split_soft_tokens"] - kept
    print(f"\nprompt_split (250 ms at the measured {m['prefill_tps']:.1f} tokens/s = {m['split_budget_tokens']:.0f} tokens): "
          f"{cut:.0f} soft tokens cut; the backend counted {whole} -> {split}")
    assert abs(split - (whole - cut)) <= 3, (split, whole, cut)
    if m["split_budget_tokens"] < m["split_hard_tokens"] + m["split_soft_tokens"]:  # a backend this slow must cut
        assert cut > 0 and split < whole


def test_context_prune_with_the_backends_own_probabilities_shrinks_english(stack) -> None:
    whole, _ = _via_gateway(stack, "a", PRUNE_MESSAGES)
    pruned, trace = _via_gateway(stack, "prune", PRUNE_MESSAGES)
    ev = _event(stack, trace)
    m = ev["measures"]
    assert ev["dims"]["prune_scorer"] == "backend"
    print(f"\ncontext_prune (window 32, tau 0.18, SmolLM2's own tokenizer and probabilities): the message's tokens "
          f"{m['prune_tokens_in']:.0f} -> {m['prune_tokens_out']:.0f}, characters {m['prune_chars_in']:.0f} -> "
          f"{m['prune_chars_out']:.0f}; the backend counted {whole} -> {pruned} prompt tokens "
          f"({100 * (whole - pruned) / whole:.1f} % fewer); scoring took {m['prune_ms'] / 1000:.1f} s")
    assert m["prune_tokens_out"] <= 0.8 * m["prune_tokens_in"]  # measurably: at least a fifth of the tokens go
    assert pruned <= whole - (m["prune_tokens_in"] - m["prune_tokens_out"]) + 5
