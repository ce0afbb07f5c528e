"""TTFT of demo-llm's two router arms by prompt length, straight against SmolLM2's llama.cpp
server (one thread, as the demo runs it): what the router's TTFT SLO bound in
``cli/supervisor/demo.yaml`` is chosen from (docs/policies.md "Demo: the router").

    .venv/bin/python benchmarks/demo_router_ttft.py --requests 160 [--json out.json]

Requests interleave the arms and lengths in a seeded random order, as the demo's traffic
does, half streamed (TTFT: the first content chunk) and half not (TTFT: the whole answer,
as the gateway records it), ``max_tokens`` 24, the qa workload's prompts
(``llm_demo.qa_prompt``). llama.cpp reuses the token prefix a prompt shares with the one
before, and the system prompt comes first, so each row says whether the previous request
had the same system prompt (``warm``); the demo's p95 is the cold requests'.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _path  # noqa: F401  (tests/ on the import path)
import openai

from ablab.cli.supervisor.llm_demo import HELPFUL_PROMPT, QUESTIONS, TERSE_PROMPT, grade, qa_prompt
from ablab.platform.gateway.protocol import estimate_tokens
from ablab_testing.gateway_stack import start_llama, stop

ARMS = {"terse": TERSE_PROMPT, "helpful": HELPFUL_PROMPT}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    home = Path(tempfile.mkdtemp(prefix="router-ttft-"))
    port = _port()
    proc = start_llama(home, port)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
    rows: list[dict[str, object]] = []
    prev = None
    try:
        for _ in range(args.requests):
            arm = rng.choice(tuple(ARMS))
            question, answers = rng.choice(QUESTIONS)
            prompt, context = qa_prompt(rng, question)
            stream = rng.random() < 0.5
            messages = [{"role": "system", "content": ARMS[arm]}, {"role": "user", "content": prompt}]
            t0 = time.perf_counter()
            ttft = None
            if stream:
                text = ""
                for chunk in client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24,
                                                            temperature=0.0, stream=True):
                    delta = chunk.choices[0].delta.content if chunk.choices else None
                    if delta and ttft is None:
                        ttft = (time.perf_counter() - t0) * 1000
                    text += delta or ""
            else:
                r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=24, temperature=0.0)
                text = r.choices[0].message.content or ""
            e2e = (time.perf_counter() - t0) * 1000
            rows.append({"arm": arm, "length": "long" if context else "short", "stream": stream,
                         "prompt_tokens": estimate_tokens(len(prompt)), "warm": prev == arm,
                         "ttft_ms": ttft if ttft is not None else e2e, "e2e_ms": e2e,
                         "correct": grade(text, answers), "output": text})
            prev = arm
    finally:
        client.close()
        stop([proc])
    print(f"{'arm':8} {'length':6} {'n':>4} {'cold':>4} {'p50':>6} {'p95':>6} {'cold p95':>8} {'warm p95':>8} {'acc':>5}")
    for arm in ARMS:
        for length in ("short", "long"):
            cell = [r for r in rows if r["arm"] == arm and r["length"] == length]
            t = [float(r["ttft_ms"]) for r in cell]  # type: ignore[arg-type]
            cold = [float(r["ttft_ms"]) for r in cell if not r["warm"]]  # type: ignore[arg-type]
            warm = [float(r["ttft_ms"]) for r in cell if r["warm"]]  # type: ignore[arg-type]
            acc = statistics.mean(bool(r["correct"]) for r in cell) if cell else float("nan")
            print(f"{arm:8} {length:6} {len(cell):4d} {len(cold):4d} {_q(t, .5):6.0f} {_q(t, .95):6.0f} "
                  f"{_q(cold, .95):8.0f} {_q(warm, .95):8.0f} {acc:5.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    sys.exit(main())
