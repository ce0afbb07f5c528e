"""Synthetic tasks whose accuracy means something, one per domain.

The base model is trained on ``arith`` and ``lookup``. The other domains use formats the
base never sees, so a per-domain LoRA adapter has something real to learn:

| domain   | prompt (plain template) | answer   |
|----------|-------------------------|----------|
| arith    | ``47+85=``              | ``132``  |
| lookup   | ``a=37,k=71,c=15;k=``   | ``71``   |
| ledger   | ``73-25=``              | ``48``   |
| mirror   | ``a=37,k=71;k>``        | ``17``   |  (the value, digits reversed)
| codebook | ``a=37,k=71;k#``        | ``hb``   |  (digits spelled as letters a..j)

Held-out data is disjoint from training data by construction: an example belongs to
the held-out split iff the CRC of its task text falls in one residue class.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from typing import Literal

BASE_DOMAINS = ("arith", "lookup")
ADAPTER_DOMAINS = ("ledger", "mirror", "codebook")
DOMAINS = BASE_DOMAINS + ADAPTER_DOMAINS
PAUSE = "."  # one "think" token per cot_depth step
Split = Literal["train", "heldout"]
_HELDOUT_MOD = 16


@dataclass(frozen=True)
class Example:
    domain: str
    text: str  # the task itself, before any template
    answer: str


def is_heldout(text: str) -> bool:
    return zlib.crc32(text.encode()) % _HELDOUT_MOD == 0


def _pairs(rng: random.Random) -> tuple[list[tuple[str, str]], int]:
    n = rng.randint(2, 4)
    keys = rng.sample("abcdefghijklmnopqrstuvwxyz", n)
    pairs = [(k, f"{rng.randint(10, 99)}") for k in keys]
    return pairs, rng.randrange(n)


def _raw(domain: str, rng: random.Random) -> Example:
    if domain == "arith":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return Example(domain, f"{a}+{b}=", str(a + b))
    if domain == "ledger":
        a = rng.randint(0, 99)
        b = rng.randint(0, a)
        return Example(domain, f"{a}-{b}=", str(a - b))
    if domain in ("lookup", "codebook", "mirror"):
        pairs, q = _pairs(rng)
        body = ",".join(f"{k}={v}" for k, v in pairs)
        key, value = pairs[q]
        if domain == "lookup":
            return Example(domain, f"{body};{key}=", value)
        if domain == "mirror":
            return Example(domain, f"{body};{key}>", value[::-1])
        return Example(domain, f"{body};{key}#", "".join("abcdefghij"[int(d)] for d in value))
    raise ValueError(f"domain: {domain!r} is not one of {DOMAINS}")


def sample(domain: str, rng: random.Random, *, split: Split = "train") -> Example:
    """One example of `domain` from `split` (rejection keeps the splits disjoint)."""
    while True:
        ex = _raw(domain, rng)
        if is_heldout(ex.text) == (split == "heldout"):
            return ex


def heldout_set(domain: str, n: int, *, seed: int = 1234) -> list[Example]:
    rng = random.Random(f"heldout-{domain}-{seed}")
    return [sample(domain, rng, split="heldout") for _ in range(n)]


def render(example: Example, *, template: str = "plain", cot_depth: int = 0) -> str:
    """The prompt text for `example` under a prompt template and a CoT (pause-token) depth."""
    from ablab.inference.prompts import apply_template

    return apply_template(example.text, domain=example.domain, template=template) + PAUSE * cot_depth


def grade(example: Example, output: str) -> bool:
    return output.strip() == example.answer
