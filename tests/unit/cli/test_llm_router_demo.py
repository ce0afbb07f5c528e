"""demo-llm's router variant (issue #33 item 7) on fixed inputs: the qa workload's long and
short prompts, the two system prompts whose lengths make the router's choice turn on the
prompt's length, the router's declaration in demo.yaml (its arms are the two t0 variants'
strategies, so OPE of one arm can be checked against that fixed variant), the demo API's
refit interval, and the live check's interval arithmetic."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ablab.cli import stack
from ablab.cli.supervisor.llm_demo import (
    CONTEXT_SENTENCES,
    FILLER,
    HELPFUL_PROMPT,
    HELPFUL_SHOTS,
    QUESTIONS,
    TERSE_PROMPT,
    grade,
    qa_prompt,
    run_llm_traffic,
)
from ablab.inference.serving.events import ListSink
from ablab.platform.gateway.protocol import estimate_tokens
from ablab.platform.policy.spec import SloRouter, parse_policy
from ablab.platform.strategy import content_hash
from ablab_testing.demo_ope import overlap

DEMO_YAML = Path(stack.__file__).resolve().parent / "supervisor" / "demo.yaml"


def _variants() -> dict[str, dict[str, Any]]:
    exp = next(e for e in yaml.safe_load(DEMO_YAML.read_text())["experiments"] if e["key"] == "demo-llm")
    return {v["key"]: v for v in exp["variants"]}


# ---------------------------------------------------------------- the prompts


def test_about_half_the_qa_prompts_carry_a_preamble_of_a_few_hundred_tokens() -> None:
    rng = random.Random(1)
    prompts = [qa_prompt(rng, "What is the capital of France?") for _ in range(2000)]
    long = [estimate_tokens(len(p)) for p, k in prompts if k]
    short = [estimate_tokens(len(p)) for p, k in prompts if not k]
    assert 0.45 < len(long) / len(prompts) < 0.55
    assert all(CONTEXT_SENTENCES[0] <= k <= CONTEXT_SENTENCES[1] for _, k in prompts if k)
    assert max(short) < 20 and 400 < min(long) and max(long) < 600  # apart: the router's bins tell them apart
    assert all(p == "What is the capital of France?" for p, k in prompts if not k)
    assert all(p.endswith("\n\nQuestion: What is the capital of France?") for p, k in prompts if k)


def test_the_same_seed_sends_the_same_prompts_and_the_order_of_sentences_varies() -> None:
    a = [qa_prompt(random.Random(7), "Q?") for _ in range(3)]
    assert a[0] == a[1] == a[2]
    # llama.cpp reuses the prefix a prompt shares with the one before: kept to the header and
    # now and then one sentence, so the cache cannot hide a long prompt's prefill
    rng = random.Random(7)
    prompts = [qa_prompt(rng, "Q?", share=1.0)[0] for _ in range(200)]
    shared = [len(os.path.commonprefix([a, b])) for a, b in zip(prompts, prompts[1:])]
    assert sum(shared) / len(shared) < 80 and max(shared) < 250
    assert min(len(p) for p in prompts) > 500


def test_no_filler_sentence_contains_any_accepted_answer() -> None:
    text = " ".join(FILLER)
    for _, answers in QUESTIONS:
        assert not grade(text, answers), answers  # an echo of the context is never graded right
    assert not re.search(r"\d", text)


def test_the_helpful_prompt_is_long_enough_that_a_long_question_on_it_is_the_one_slow_cell() -> None:
    # prefill grows with the tokens before the first answer token (system prompt + question):
    # the four cells are ordered terse+short < helpful+short < terse+long < helpful+long with
    # room between the last two, where the TTFT bound sits (docs/policies.md "Demo: the router"
    # has the measured TTFT per cell)
    rng = random.Random(2)
    prompts = [qa_prompt(rng, q) for q, _ in QUESTIONS * 40]
    short = [estimate_tokens(len(p)) for p, k in prompts if not k]
    long = [estimate_tokens(len(p)) for p, k in prompts if k]
    helpful, terse = estimate_tokens(len(HELPFUL_PROMPT)), estimate_tokens(len(TERSE_PROMPT))
    assert terse < 10 and 250 < helpful < 400
    assert terse + max(short) < helpful + min(short) - 200
    assert helpful + max(short) < terse + min(long) - 100
    assert helpful + min(long) > terse + max(long) + 150


def test_the_helpful_examples_teach_short_answers_and_give_away_none() -> None:
    assert len(HELPFUL_SHOTS) >= 10
    assert all(len(a.split()) == 1 and a.endswith(".") for _, a in HELPFUL_SHOTS)
    for question, answers in QUESTIONS:
        assert not grade(HELPFUL_PROMPT, answers), question  # an echo of the examples is never graded right
        assert question not in HELPFUL_PROMPT  # no asked question is an example
    assert all(f"Question: {q}" in HELPFUL_PROMPT or q in HELPFUL_PROMPT for q, _ in HELPFUL_SHOTS)


def test_qa_traffic_sends_the_preamble_in_the_one_user_turn_and_ledgers_its_length(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, headers={"x-ablab-trace-id": f"t{len(seen)}"},
                              json={"id": "c", "object": "chat.completion", "created": 0, "model": "smollm2",
                                    "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": "Paris"}}]})

    ledger = tmp_path / "l.jsonl"
    run_llm_traffic(gateway_url="http://g", rate=1000.0, duration_s=30.0, users=5, sink=ListSink(), ledger=ledger,
                    seed=4, stop=lambda: len(seen) >= 40, http_client=httpx.Client(transport=httpx.MockTransport(gateway)))
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(records) == len(seen) == 40
    for body, record in zip(seen, records):
        assert len(body["messages"]) == 1
        content = body["messages"][0]["content"]
        assert content.endswith(record["question"])
        assert (record["context_sentences"] > 0) == (content != record["question"])
    assert 8 <= sum(r["context_sentences"] > 0 for r in records) <= 32


# ---------------------------------------------------------------- demo.yaml


def test_the_router_chooses_between_the_two_t0_strategies_by_prompt_length_under_a_ttft_slo() -> None:
    variants = _variants()
    assert {"helpful-t0", "helpful-t1", "terse-t0", "terse-t1", "router"} == set(variants)
    policy = variants["router"]["strategy"]["policy"]
    parsed = parse_policy(policy)
    assert isinstance(parsed, SloRouter)
    assert parsed.features == ["prompt_tokens"] and parsed.objective == "accuracy" and 0 < parsed.explore <= 0.1
    assert [(s.latency, s.quantile) for s in parsed.slos()] == [("ttft_ms", 0.95)]
    # OPE of "always router.terse" is checked against terse-t0: the same strategy, byte for byte
    assert content_hash(policy["arms"]["terse"]) == content_hash(variants["terse-t0"]["strategy"])
    assert content_hash(policy["arms"]["helpful"]) == content_hash(variants["helpful-t0"]["strategy"])
    # one helpful and one terse system prompt across the experiment, the ones llm_demo names
    assert {variants[k]["strategy"]["system_prompt"] for k in ("helpful-t0", "helpful-t1")} == {HELPFUL_PROMPT}
    assert {variants[k]["strategy"]["system_prompt"] for k in ("terse-t0", "terse-t1")} == {TERSE_PROMPT}
    assert policy["arms"]["helpful"]["system_prompt"] == HELPFUL_PROMPT
    # the fixed variants keep their weights; the router has half the traffic, so its model is
    # published within a demo and each arm is at least as often served as terse-t0
    assert [variants[k]["weight"] for k in ("helpful-t0", "helpful-t1", "terse-t0", "terse-t1")] == [1, 1, 1, 1]
    assert variants["router"]["weight"] == 4
    # the bound sits between helpful + a long question and the other cells (docs/policies.md)
    assert parsed.slos()[0].max_ms == 9000


def test_the_demo_api_refits_policies_every_minute_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    from ablab.platform.config import Settings

    monkeypatch.delenv("ABLAB_POLICY_REFIT_S", raising=False)

    def api_env(demo: bool) -> dict[str, str]:
        services = stack._services(Settings(home=tmp_path), demo=demo, tokens={"sdk": "s", "admin": "a"},
                                   api_env={"ABLAB_WEBHOOK_SECRET": "x"})
        return next(s for s in services if s.name == "api").env

    assert api_env(True)["ABLAB_POLICY_REFIT_S"] == "60" and api_env(True)["ABLAB_WEBHOOK_SECRET"] == "x"
    assert "ABLAB_POLICY_REFIT_S" not in api_env(False)
    monkeypatch.setenv("ABLAB_POLICY_REFIT_S", "5")
    assert "ABLAB_POLICY_REFIT_S" not in api_env(True)  # the process inherits the operator's value


# ---------------------------------------------------------------- the live check's arithmetic


@pytest.mark.parametrize(("a", "b", "expected"), [
    ([0.1, 0.5], [0.4, 0.9], True), ([0.1, 0.5], [0.5, 0.9], True), ([0.1, 0.3], [0.4, 0.9], False),
    ([0.4, 0.9], [0.1, 0.3], False), ([None, 0.5], [0.1, 0.3], False), ([0.1, float("nan")], [0.1, 0.3], False),
])
def test_intervals_overlap_when_they_share_a_point(a: list[Any], b: list[Any], expected: bool) -> None:
    assert overlap(a, b) is expected
