"""The demo's real-LLM traffic: questions with known answers sent through ``ablab gateway``
with the official ``openai`` client, the answers graded.

Each request carries its unit in ``X-Ablab-Unit``; the gateway assigns the unit's variant
(a system prompt and a temperature for SmolLM2), answers with ``X-Ablab-Trace-Id``, and
emits the exposure and inference events itself. This side emits the client-side (RUM)
latency and writes a ledger record with the grade, which ``ablab labeler`` turns into a
delayed ``feedback`` event joined by that trace id. Half the requests stream.

Two workloads (``ablab llm-traffic --workload``), each sending ``X-Ablab-Attr-Workload``,
which the demo experiments target:

- ``qa`` (``demo-llm``): one question with known answers per request. A share of them
  (:data:`CONTEXT_SHARE`) carries a neutral context preamble before the question
  (:func:`qa_prompt`): :data:`CONTEXT_SENTENCES` (min, max) sentences of :data:`FILLER`, a
  few hundred tokens of notes about an imaginary reading room that name no answer of any
  question, so the answer does not change but the prompt is long. Whether a request has one,
  and which sentences in which order, is drawn from the loop's seeded ``random.Random``:
  the same seed sends the same prompts. The order varies per request so llama.cpp's prefix
  cache cannot hide the length. This splits ``prompt_tokens`` (about 15 tokens without,
  430-560 with), the feature the ``router`` variant of ``demo-llm`` chooses by: prefill on
  SmolLM2 costs milliseconds per token, and the ``helpful`` system prompt
  (:data:`HELPFUL_PROMPT`, about 300 tokens) sits before the question, so a long question on
  it is the one case a TTFT SLO binds on.
- ``dialogue`` (``demo-llm-dialogue``): a multi-turn conversation per request. Facts about
  the user (name, city, favourite colour) are stated in its first two turns, a few filler
  turns follow (questions from ``QUESTIONS`` with canned assistant answers), and the last
  turn asks for one of the facts; the reply is graded by whether it contains that fact.
  The caller sends the whole history, as OpenAI clients do; the experiment's treatment
  (``dialogue_state``) replaces it upstream by slots extracted with :data:`DIALOGUE_SLOTS`.
  These requests do not stream, so the prompt tokens recorded are the backend's own count.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (question, accepted answers): short facts a 135M instruct model gets right only sometimes,
# so the system prompt and temperature move accuracy
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("What is the capital of Japan?", ("tokyo",)),
    ("What is the capital of Italy?", ("rome",)),
    ("What is the capital of Germany?", ("berlin",)),
    ("What is the capital of Spain?", ("madrid",)),
    ("What is the capital of England?", ("london",)),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What color is grass?", ("green",)),
    ("What color are ripe bananas?", ("yellow",)),
    ("How many legs does a spider have?", ("8", "eight")),
    ("How many days are in a week?", ("7", "seven")),
    ("How many hours are in a day?", ("24", "twenty-four", "twenty four")),
    ("How many months are in a year?", ("12", "twelve")),
    ("What is 2 plus 2?", ("4", "four")),
    ("What is 3 plus 5?", ("8", "eight")),
    ("What is 10 minus 3?", ("7", "seven")),
    ("Which planet do we live on?", ("earth",)),
    ("What is frozen water called?", ("ice",)),
    ("What animal says moo?", ("cow",)),
    ("What animal barks?", ("dog",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What star is at the center of our solar system?", ("sun",)),
    ("What gas do humans need to breathe?", ("oxygen",)),
    ("What is the opposite of hot?", ("cold",)),
)
_WORD = re.compile(r"[a-z0-9\-]+")

# The qa workload's neutral context: sentences that say nothing any question asks about and
# contain no accepted answer as a word (a test holds this), so a reply that echoes them is
# never graded right by accident.
FILLER: tuple[str, ...] = (
    "The reading room on the upper floor is quiet in the late afternoon.",
    "Visitors leave their coats on the hooks by the door before they sit down.",
    "A long wooden table runs along the window, with lamps at both ends.",
    "The shelves near the stairs hold old maps, atlases and travel journals.",
    "Most people who come here bring a notebook and a pencil.",
    "The librarian keeps a small bell on her desk for anyone who needs help.",
    "In the corner there is a reading chair that nobody ever seems to use.",
    "Books that are returned late are placed on a trolley beside the entrance.",
    "The heating pipes make a soft ticking noise when the building warms up.",
    "A poster on the wall lists the rules about food, drink and phone calls.",
    "Some regular readers have their favourite seats and arrive early to get them.",
    "The newspapers are hung on wooden poles so that they do not get creased.",
    "Students often work here in pairs, whispering over the same page.",
    "On the bottom shelf there is a box of lost gloves, scarves and umbrellas.",
    "The catalogue cards are still kept in narrow drawers, although few people use them.",
    "A clock above the door is a few minutes slow, and everybody knows it.",
    "The staircase creaks on the third step, so people tend to skip it.",
    "A window at the back looks onto a courtyard with a single bench.",
    "Quiet conversations are allowed in the hall but not between the shelves.",
    "The room closes a little earlier on public holidays.",
    "A tall plant stands by the radiator and leans toward the light.",
    "Pencils are sharpened at a metal sharpener screwed to the end of the counter.",
    "The carpet near the entrance has worn thin where people wipe their shoes.",
    "Each lamp has a brass switch that clicks loudly when it is turned.",
    "Old magazines are stacked on a low table beside the armchairs.",
    "The windows are opened for a few minutes every morning to let in fresh air.",
    "A framed photograph of the building under construction hangs near the stairs.",
    "Readers who want a quiet corner usually head for the back row of desks.",
    "The librarian waters the plants on the windowsill before lunch.",
    "A notice asks visitors to return chairs to their places before leaving.",
    "The local history shelf is the most popular one on rainy afternoons.",
    "Somebody always forgets a scarf on the coat rack by closing time.",
)
# The demo-llm `helpful` system prompt (helpful-t0, helpful-t1 and the router's `helpful` arm;
# demo.yaml spells the same text, a test holds them equal): an instruction and a dozen
# one-line examples, about 300 tokens, against terse's six words. Its prefill is what makes
# the router's choice turn on length: a long question on top of it misses the TTFT SLO that a
# long question alone or a short one on top of it meets (docs/policies.md "Demo: the router").
# No example's answer is an accepted answer of QUESTIONS (a test holds it), so a reply that
# echoes an example is never graded right by accident.
HELPFUL_SHOTS: tuple[tuple[str, str], ...] = (
    ("What is the capital of Canada?", "Ottawa."),
    ("What color is snow?", "White."),
    ("How many wheels does a bicycle have?", "Two."),
    ("What is 6 plus 3?", "Nine."),
    ("What animal says meow?", "Cat."),
    ("What is the largest planet in our solar system?", "Jupiter."),
    ("How many sides does a triangle have?", "Three."),
    ("What do bees make?", "Honey."),
    ("What is the capital of Australia?", "Canberra."),
    ("What is the opposite of up?", "Down."),
    ("What is the hardest natural material?", "Diamond."),
    ("How many minutes are in an hour?", "Sixty."),
    ("Some notes that do not matter for the question: The garden gate is painted and the path is "
     "lined with stones.\n\nQuestion: What do cows drink?", "Water."),
)
HELPFUL_PROMPT = (
    "You are a helpful assistant. Read the user's message, find the question in it and answer that "
    "question correctly, with the answer itself first, in one or two words. If the message also "
    "contains notes or background that the question does not need, ignore them. Do not explain and "
    "do not repeat the question. Examples of good answers:\n\n"
    + "\n\n".join(f"Question: {q}\nAnswer: {a}" if not q.startswith("Some notes") else f"{q}\nAnswer: {a}"
                  for q, a in HELPFUL_SHOTS)
)
TERSE_PROMPT = "Answer with one word only."
CONTEXT_SHARE = 0.5  # of qa requests carry a context preamble
CONTEXT_SENTENCES = (24, 30)  # sentences of FILLER in a preamble: about 400-500 tokens, so every long
# prompt is long: the router's long bins then all sit well above a short one plus the helpful prompt


def qa_prompt(rng: random.Random, question: str, *, share: float = CONTEXT_SHARE,
              sentences: tuple[int, int] = CONTEXT_SENTENCES) -> tuple[str, int]:
    """The user turn of one qa request and how many filler sentences precede the question
    (0: the question alone). Draws from ``rng`` whether there is a preamble, then its length
    and its sentences in order, so one seed gives one sequence of prompts."""
    if rng.random() >= share:
        return question, 0
    picked = rng.sample(FILLER, rng.randint(*sentences))
    return "Some notes that do not matter for the question: " + " ".join(picked) + f"\n\nQuestion: {question}", len(picked)


def grade(text: str, answers: tuple[str, ...]) -> bool:
    """Correct when an accepted answer appears as a word (or phrase) in the reply."""
    words = " ".join(_WORD.findall(text.lower()))
    return any(re.search(rf"(^|\s){re.escape(a)}($|\s)", words) for a in answers)


@dataclass
class LlmTrafficResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    correct: int = 0
    errors: dict[str, int] = field(default_factory=dict)


# -------------------------------------------------------------- the multi-turn workload

# Fact values: none of them is a word of a filler turn (QUESTIONS and their canned answers),
# so a reply can only be right by recalling the fact.
NAMES: tuple[str, ...] = ("Alice", "Omar", "Priya", "Lukas", "Mei", "Diego", "Sara", "Kofi")
CITIES: tuple[str, ...] = ("Lima", "Oslo", "Cairo", "Dublin", "Lisbon", "Nairobi", "Quito", "Vienna")
COLORS: tuple[str, ...] = ("purple", "orange", "silver", "brown", "pink", "gold", "teal", "gray")
# The treatment's dialogue_state slots (RE2; demo.yaml declares the same patterns): each
# matches the turn that states its fact and nothing else the workload sends.
DIALOGUE_SLOTS: dict[str, str] = {
    "name": r"(?i)\bmy name is (\w+)",
    "city": r"(?i)\bi live in (\w+)",
    "color": r"(?i)\bmy favou?rite colou?r is (\w+)",
}
# the last turn, per fact asked
ASK: dict[str, str] = {
    "name": "What is my name?",
    "city": "Which city do I live in?",
    "color": "What is my favorite color?",
}
FILLER_TURNS = (2, 4)  # filler question-and-answer pairs between the facts and the question


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict[str, str], ...]  # the whole history as the caller sends it, the question last
    facts: dict[str, str]  # slot -> the value stated
    asked: str  # the slot the last turn asks for
    answer: str  # its value, lower case: what grading looks for

    @property
    def question(self) -> str:
        return self.messages[-1]["content"]


def _canned(answers: tuple[str, ...]) -> str:
    return f"The answer is {answers[0]}."


def make_conversation(rng: random.Random, *, filler: tuple[int, int] = FILLER_TURNS) -> Conversation:
    """One graded conversation: facts in turns 1-2, ``filler`` (min, max) filler pairs, the question."""
    facts = {"name": rng.choice(NAMES), "city": rng.choice(CITIES), "color": rng.choice(COLORS)}
    messages: list[dict[str, str]] = [
        {"role": "user", "content": f"Hi! My name is {facts['name']} and I live in {facts['city']}."},
        {"role": "assistant", "content": "Nice to meet you! How can I help you today?"},
        {"role": "user", "content": f"Before we start: my favorite color is {facts['color']}."},
        {"role": "assistant", "content": "Noted. What would you like to know?"},
    ]
    for question, answers in rng.sample(QUESTIONS, rng.randint(*filler)):
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": _canned(answers)})
    asked = rng.choice(tuple(ASK))
    messages.append({"role": "user", "content": ASK[asked]})
    return Conversation(tuple(messages), facts, asked, facts[asked].lower())


def grade_dialogue(text: str, conversation: Conversation) -> bool:
    """Correct when the reply contains the asked fact as a word (an exact reply is one)."""
    return grade(text, (conversation.answer,))


# -------------------------------------------------------------- sending and the loop

WORKLOADS = ("qa", "dialogue")


def ask(client: Any, *, unit: str, stream: bool, question: str | None = None,
        messages: list[dict[str, str]] | None = None, max_tokens: int = 24,
        workload: str | None = None) -> tuple[str, dict[str, str], float]:
    """One chat request through the gateway (``question`` as one user turn, or ``messages``):
    (reply text, the X-Ablab-* headers, client-side e2e ms)."""
    if messages is None:
        messages = [{"role": "user", "content": question or ""}]
    headers = {"X-Ablab-Unit": unit}
    if workload:
        headers["X-Ablab-Attr-Workload"] = workload
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, max_tokens=max_tokens, stream=stream, extra_headers=headers,
    )
    ablab = {k.lower()[len("x-ablab-"):]: v for k, v in raw.headers.items() if k.lower().startswith("x-ablab-")}
    parsed = raw.parse()
    if stream:
        text = "".join((c.choices[0].delta.content or "") for c in parsed if c.choices)
    else:
        text = parsed.choices[0].message.content or ""
    return text, ablab, (time.perf_counter() - t0) * 1000


def run_llm_traffic(
    *, gateway_url: str, rate: float, duration_s: float, users: int, sink: Any, ledger: Path, seed: int = 5,
    api_key: str = "demo", stop: Callable[[], bool] = lambda: False, timeout_s: float = 60.0,
    workload: str = "qa", http_client: Any = None,
) -> LlmTrafficResult:
    """Poisson arrivals at `rate`/s for `duration_s`, one request at a time (a 135M model on a
    shared CPU serves about one answer a second). ``workload``: ``qa`` (one question, half
    streamed, units ``llm-user-N``) or ``dialogue`` (a :func:`make_conversation`, not
    streamed, units ``dialogue-user-N``); each request says which in ``X-Ablab-Attr-Workload``.
    ``http_client``: an ``httpx.Client`` for the openai client (tests)."""
    import openai

    from ablab.inference.serving import events as ev

    if workload not in WORKLOADS:
        raise ValueError(f"workload: {workload!r} is not one of {', '.join(WORKLOADS)}")
    rng = random.Random(seed)
    client = openai.OpenAI(base_url=f"{gateway_url.rstrip('/')}/v1", api_key=api_key, max_retries=0, timeout=timeout_s,
                           **({"http_client": http_client} if http_client is not None else {}))
    result = LlmTrafficResult()
    ledger.parent.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + duration_s
    with ledger.open("a") as out:
        while time.monotonic() < end and not stop():
            conversation: Conversation | None = None
            if workload == "dialogue":
                conversation = make_conversation(rng)
                question, answers = conversation.question, (conversation.answer,)
                unit = f"dialogue-user-{rng.randrange(users)}"
                stream = False
                prompt, context = question, 0
            else:
                question, answers = rng.choice(QUESTIONS)
                unit = f"llm-user-{rng.randrange(users)}"
                stream = rng.random() < 0.5
                prompt, context = qa_prompt(rng, question)
            result.sent += 1
            try:
                text, ablab, e2e_ms = ask(client, question=prompt, unit=unit, stream=stream, workload=workload,
                                          messages=list(conversation.messages) if conversation else None)
            except openai.APIError as exc:  # the backend is down or slow: counted, the gateway emits the error event
                result.failed += 1
                name = type(exc).__name__
                result.errors[name] = result.errors.get(name, 0) + 1
            else:
                result.ok += 1
                correct = grade_dialogue(text, conversation) if conversation is not None else grade(text, answers)
                result.correct += int(correct)
                trace = ablab.get("trace-id")
                if trace:
                    sink.emit(ev.rum_event(trace_id=trace, e2e_ms=e2e_ms, experiment=ablab.get("experiment"),
                                           variant=ablab.get("variant"), unit_id=unit))
                    record = {"trace_id": trace, "unit_id": unit, "question": question, "output": text,
                              "answer": answers[0], "correct": int(correct), "served_at": time.time()}
                    if conversation is not None:
                        record.update(workload=workload, asked=conversation.asked, turns=len(conversation.messages),
                                      variant=ablab.get("variant"))
                    else:  # how long the prompt was, for reading accuracy by length from the ledger
                        record["context_sentences"] = context
                    out.write(json.dumps(record) + "\n")
                    out.flush()
            time.sleep(min(rng.expovariate(rate), max(0.0, end - time.monotonic())))
    client.close()
    return result
