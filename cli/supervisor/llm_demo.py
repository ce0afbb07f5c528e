"""The demo's real-LLM traffic: questions with known answers sent through ``ablab gateway``
with the official ``openai`` client, the answers graded.

Each request carries its unit in ``X-Ablab-Unit``; the gateway assigns the unit's variant
(a system prompt and a temperature for SmolLM2), answers with ``X-Ablab-Trace-Id``, and
emits the exposure and inference events itself. This side emits the client-side (RUM)
latency and writes a ledger record with the grade, which ``ablab labeler`` turns into a
delayed ``feedback`` event joined by that trace id. Half the requests stream.
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


def ask(client: Any, *, question: str, unit: str, stream: bool, max_tokens: int = 24) -> tuple[str, dict[str, str], float]:
    """One chat request through the gateway: (reply text, the X-Ablab-* headers, client-side e2e ms)."""
    t0 = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=[{"role": "user", "content": question}], max_tokens=max_tokens, stream=stream,
        extra_headers={"X-Ablab-Unit": unit},
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
) -> LlmTrafficResult:
    """Poisson arrivals at `rate`/s for `duration_s`, one request at a time (a 135M model on a
    shared CPU serves about one answer a second)."""
    import openai

    from ablab.inference.serving import events as ev

    rng = random.Random(seed)
    client = openai.OpenAI(base_url=f"{gateway_url.rstrip('/')}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)
    result = LlmTrafficResult()
    ledger.parent.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + duration_s
    with ledger.open("a") as out:
        while time.monotonic() < end and not stop():
            question, answers = rng.choice(QUESTIONS)
            unit = f"llm-user-{rng.randrange(users)}"
            result.sent += 1
            try:
                text, ablab, e2e_ms = ask(client, question=question, unit=unit, stream=rng.random() < 0.5)
            except openai.APIError as exc:  # the backend is down or slow: counted, the gateway emits the error event
                result.failed += 1
                name = type(exc).__name__
                result.errors[name] = result.errors.get(name, 0) + 1
            else:
                result.ok += 1
                correct = grade(text, answers)
                result.correct += int(correct)
                trace = ablab.get("trace-id")
                if trace:
                    sink.emit(ev.rum_event(trace_id=trace, e2e_ms=e2e_ms, experiment=ablab.get("experiment"),
                                           variant=ablab.get("variant"), unit_id=unit))
                    out.write(json.dumps({"trace_id": trace, "unit_id": unit, "question": question, "output": text,
                                          "answer": answers[0], "correct": int(correct), "served_at": time.time()}) + "\n")
                    out.flush()
            time.sleep(min(rng.expovariate(rate), max(0.0, end - time.monotonic())))
    client.close()
    return result
