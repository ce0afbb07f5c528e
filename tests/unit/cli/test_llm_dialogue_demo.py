"""The demo's multi-turn graded workload (issue #34 item 4) on fixed inputs: the conversations
it builds, its grader, the dialogue_state slots demo.yaml declares (run by the gateway's own
transform), the two LLM experiments splitting the gateway's traffic by workload, the demo-llm
shadow, and the traffic loop against a stand-in gateway (ledger, RUM events, labels)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from ablab.cli import stack
from ablab.cli.experiments import _apply_experiment
from ablab.cli.supervisor.llm_demo import (
    ASK,
    CITIES,
    COLORS,
    DIALOGUE_SLOTS,
    NAMES,
    QUESTIONS,
    Conversation,
    grade_dialogue,
    make_conversation,
    run_llm_traffic,
)
from ablab.inference.labeler import Labeler, LabelerConfig
from ablab.inference.serving.events import ListSink
from ablab.platform.assignment.engine import assign
from ablab.platform.assignment.payload import config_from_payload
from ablab.platform.config import Settings
from ablab.platform.gateway.prompting.transforms import apply_dialogue_state
from ablab.platform.strategy import compile_slot_pattern

DEMO_YAML = Path(stack.__file__).resolve().parent / "supervisor" / "demo.yaml"
HEADER = "Known facts from earlier in this conversation:"


def _demo() -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in yaml.safe_load(DEMO_YAML.read_text())["experiments"]}


def _words(text: str) -> set[str]:
    return set("".join(c if c.isalnum() else " " for c in text.lower()).split())


# ---------------------------------------------------------------- the conversations


def test_a_conversation_states_its_facts_first_then_filler_then_asks_for_one() -> None:
    conv = make_conversation(random.Random(3))
    msgs = conv.messages
    assert [m["role"] for m in msgs] == ["user", "assistant"] * ((len(msgs) - 1) // 2) + ["user"]
    assert msgs[0]["content"] == f"Hi! My name is {conv.facts['name']} and I live in {conv.facts['city']}."
    assert msgs[2]["content"] == f"Before we start: my favorite color is {conv.facts['color']}."
    filler = msgs[4:-1]
    assert 2 <= len(filler) // 2 <= 4
    known = dict(QUESTIONS)
    for question, reply in zip(filler[::2], filler[1::2]):
        assert reply["content"] == f"The answer is {known[question['content']][0]}."
    assert conv.question == ASK[conv.asked] == msgs[-1]["content"]
    assert conv.answer == conv.facts[conv.asked].lower()
    # fixed input, fixed conversation: the same seed gives the same one
    assert make_conversation(random.Random(3)) == conv


def test_conversations_cover_every_fact_and_filler_length() -> None:
    rng = random.Random(11)
    convs = [make_conversation(rng) for _ in range(300)]
    assert {c.asked for c in convs} == set(ASK)
    assert {(len(c.messages) - 5) // 2 for c in convs} == {2, 3, 4}
    assert {c.facts["name"] for c in convs} == set(NAMES)


def test_no_fact_value_is_a_word_of_any_filler_turn() -> None:
    # else a reply could be right by repeating a filler answer
    filler = set()
    for question, answers in QUESTIONS:
        filler |= _words(question) | _words(f"The answer is {answers[0]}.")
    values = {v.lower() for v in (*NAMES, *CITIES, *COLORS)}
    assert len(values) == len(NAMES) + len(CITIES) + len(COLORS)
    assert not values & filler
    assert not values & _words(" ".join(ASK.values()))


def _conv(asked: str) -> Conversation:
    facts = {"name": "Priya", "city": "Oslo", "color": "teal"}
    return Conversation(({"role": "user", "content": ASK[asked]},), facts, asked, facts[asked].lower())


@pytest.mark.parametrize(("reply", "asked", "correct"), [
    ("Priya", "name", True),                           # exact
    ("Your name is Priya.", "name", True),             # contains, as a word
    ("PRIYA!", "name", True),
    ("You told me you live in Oslo.", "city", True),
    ("Your favorite color is teal", "color", True),
    ("Priyanka", "name", False),                       # a longer word is not the fact
    ("You live in Oslo.", "name", False),              # another fact than the one asked
    ("I don't know your favorite color.", "color", False),
    ("", "city", False),
])
def test_the_grader_wants_the_asked_fact_as_a_word(reply: str, asked: str, correct: bool) -> None:
    assert grade_dialogue(reply, _conv(asked)) is correct


# ---------------------------------------------------------------- the treatment's slots


def test_demo_yaml_declares_the_workloads_slots() -> None:
    variants = {v["key"]: v["strategy"] for v in _demo()["demo-llm-dialogue"]["variants"]}
    assert set(variants) == {"state-off", "state-on"}
    on, off = variants["state-on"], variants["state-off"]
    assert on["dialogue_state"]["slots"] == DIALOGUE_SLOTS
    assert "dialogue_state" not in off
    assert {k: v for k, v in on.items() if k != "dialogue_state"} == off  # the one factor that differs


def test_the_gateways_transform_keeps_exactly_the_facts_and_the_question() -> None:
    programs = {name: compile_slot_pattern(p) for name, p in DIALOGUE_SLOTS.items()}
    rng = random.Random(5)
    for _ in range(200):
        conv = make_conversation(rng)
        system = {"role": "system", "content": "You are a helpful assistant."}
        out = apply_dialogue_state([system, *conv.messages], programs, roles=("user",), header=HEADER)
        assert out.slots == conv.facts
        assert out.turns_in == len(conv.messages) and out.turns_out == 1
        assert out.messages == [
            system,
            {"role": "system", "content": "\n".join([HEADER, *(f"- {k}: {v}" for k, v in conv.facts.items())])},
            {"role": "user", "content": conv.question},
        ]


# ---------------------------------------------------------------- demo.yaml through the API


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    from ablab.platform.api.app import create_app
    from ablab.platform.auth import create_api_key
    from ablab.platform.registry.db import make_engine, make_sessionmaker, transaction
    from ablab.platform.registry.migrate import upgrade
    from ablab.platform.registry.schemas import Scope

    settings = Settings(home=tmp_path, analytics=False, kafka_bootstrap="127.0.0.1:1")
    upgrade(settings.resolved_database_url)
    engine = make_engine(settings.resolved_database_url)
    with transaction(make_sessionmaker(engine)) as session:
        tokens = {s.value: create_api_key(session, name=s.value, scope=s)[1] for s in (Scope.admin, Scope.sdk)}
    engine.dispose()
    with TestClient(create_app(settings)) as client:
        yield client, {k: f"Bearer {v}" for k, v in tokens.items()}


def test_demo_yaml_applies_and_the_llm_experiments_split_the_gateways_traffic_by_workload(api) -> None:
    client, auth = api
    client.headers["Authorization"] = auth["admin"]
    for spec in _demo().values():
        assert _apply_experiment(client, dict(spec), dry_run=False).startswith("created")
    payload = client.get("/v1/sdk/config", headers={"Authorization": auth["sdk"]}).json()
    config = config_from_payload(payload)
    llm = ("demo-llm", "demo-llm-dialogue")
    seen: dict[str, set[str]] = {"demo-llm": set(), "demo-llm-dialogue": set()}
    for i in range(200):  # the units `ablab llm-traffic` uses, with the attribute it sends
        qa = [a for a in assign(config, f"llm-user-{i}", {"workload": "qa"}) if a.experiment in llm]
        dialogue = [a for a in assign(config, f"dialogue-user-{i}", {"workload": "dialogue"}) if a.experiment in llm]
        assert [a.experiment for a in qa] == ["demo-llm"] and [a.experiment for a in dialogue] == ["demo-llm-dialogue"]
        seen["demo-llm"].add(qa[0].variant)
        seen["demo-llm-dialogue"].add(dialogue[0].variant)
        assert not [a for a in assign(config, f"llm-user-{i}") if a.experiment in llm]  # no workload: neither
    assert seen == {"demo-llm": {"helpful-t0", "helpful-t1", "terse-t0", "terse-t1", "router"},
                    "demo-llm-dialogue": {"state-off", "state-on"}}
    published = {e["key"]: e for e in payload["experiments"]}
    shadow = published["demo-llm"]["shadow"]
    assert (shadow["fraction"], shadow["max_concurrency"], shadow["timeout_s"]) == (0.5, 2, 30)
    assert shadow["strategy"]["system_prompt"] == "Answer with one word only."  # the second system prompt
    assert shadow["strategy"]["backend"] == "smollm2"  # a whole strategy: else the gateway's default backend
    assert published["demo-llm-dialogue"].get("shadow") is None
    # a second apply changes nothing (a restarted `up --demo`)
    for spec in _demo().values():
        assert _apply_experiment(client, dict(spec), dry_run=False) == "unchanged"


# ---------------------------------------------------------------- the traffic loop


class _Gateway:
    """Stands in for `ablab gateway`: answers each chat request, right on even ones."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((dict(request.headers), body))
        n = len(self.requests)
        if body["messages"][-1]["content"] in ASK.values():
            first = body["messages"][0]["content"]  # "Hi! My name is X and I live in Y."
            name, city = first.split("is ", 1)[1].split(" and I live in ")
            color = body["messages"][2]["content"].rsplit(" ", 1)[1].rstrip(".")
            fact = {"What is my name?": name, "Which city do I live in?": city.rstrip("."),
                    "What is my favorite color?": color}[body["messages"][-1]["content"]]
            text = f"It is {fact}." if n % 2 == 0 else "I am not sure."
        else:
            text = "No idea."
        return httpx.Response(200, headers={"x-ablab-trace-id": f"t{n}", "x-ablab-experiment": "demo-llm-dialogue",
                                            "x-ablab-variant": "state-on"},
                              json={"id": f"c{n}", "object": "chat.completion", "created": 0, "model": "smollm2",
                                    "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant", "content": text}}],
                                    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})


def _run(workload: str, tmp_path: Path, requests: int = 6) -> tuple[_Gateway, ListSink, Path, Any]:
    gateway, sink = _Gateway(), ListSink()
    ledger = tmp_path / f"{workload}.jsonl"
    result = run_llm_traffic(gateway_url="http://gateway.test", rate=1000.0, duration_s=30.0, users=50, sink=sink,
                             ledger=ledger, seed=2, workload=workload, stop=lambda: len(gateway.requests) >= requests,
                             http_client=httpx.Client(transport=httpx.MockTransport(gateway)))
    return gateway, sink, ledger, result


def test_dialogue_traffic_sends_whole_conversations_and_ledgers_their_grades(tmp_path: Path) -> None:
    gateway, sink, ledger, result = _run("dialogue", tmp_path)
    assert (result.sent, result.ok, result.failed, result.correct) == (6, 6, 0, 3)
    for headers, body in gateway.requests:
        assert headers["x-ablab-attr-workload"] == "dialogue"
        assert headers["x-ablab-unit"].startswith("dialogue-user-")
        assert body["stream"] is False  # the backend's own prompt-token count is recorded
        assert 9 <= len(body["messages"]) <= 13 and body["messages"][-1]["content"] in ASK.values()
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [r["trace_id"] for r in records] == [f"t{i}" for i in range(1, 7)]
    assert [r["correct"] for r in records] == [0, 1, 0, 1, 0, 1]
    for r, (headers, body) in zip(records, gateway.requests):
        assert r["workload"] == "dialogue" and r["turns"] == len(body["messages"]) and r["variant"] == "state-on"
        assert r["question"] == ASK[r["asked"]] and r["unit_id"] == headers["x-ablab-unit"]
    assert [(e["type"], e["trace_id"]) for e in sink.events] == [("rum", f"t{i}") for i in range(1, 7)]
    # the labeler posts each record's own grade by its trace id
    labels = ListSink()
    lab = Labeler(LabelerConfig(fraction=1.0, delay_median_s=0.0, source="auto"), labels)
    for r in records:
        lab.offer(r)
    assert lab.emit_due() == 6
    assert {e["trace_id"]: e["correct"] for e in labels.events} == {r["trace_id"]: r["correct"] for r in records}


def test_qa_traffic_says_its_workload_so_demo_llm_targets_it(tmp_path: Path) -> None:
    gateway, _, ledger, result = _run("qa", tmp_path, requests=4)
    assert result.ok == 4
    assert all(h["x-ablab-attr-workload"] == "qa" and h["x-ablab-unit"].startswith("llm-user-") for h, _ in gateway.requests)
    assert all(len(b["messages"]) == 1 for _, b in gateway.requests)
    assert all("workload" not in json.loads(line) for line in ledger.read_text().splitlines())


def test_an_unknown_workload_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workload"):
        run_llm_traffic(gateway_url="http://g", rate=1, duration_s=1, users=1, sink=ListSink(), ledger=tmp_path / "l",
                        workload="chat")


# ---------------------------------------------------------------- `up --demo`


def test_up_demo_runs_the_dialogue_workload_and_its_labeler_on_one_ledger(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    services = {s.name: s for s in stack._services(settings, demo=True, tokens={"sdk": "s", "admin": "a"})}
    gateway = services["gateway"].argv
    experiments = [gateway[i + 1] for i, a in enumerate(gateway) if a == "--experiment"]
    assert experiments == ["demo-llm", "demo-llm-dialogue"]
    traffic, labeler = services["llm-dialogue"].argv, services["llm-dialogue-labeler"].argv
    assert traffic[traffic.index("--workload") + 1] == "dialogue"
    assert float(traffic[traffic.index("--rate") + 1]) <= 0.2  # SmolLM2 serves one request at a time
    assert traffic[traffic.index("--ledger") + 1] == labeler[labeler.index("--ledger") + 1]
    assert traffic[traffic.index("--ledger") + 1] != services["llm-traffic"].argv[services["llm-traffic"].argv.index("--ledger") + 1]
