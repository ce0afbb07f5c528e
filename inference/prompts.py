"""Prompt-side strategies: templates, token-entropy pruning, confidence for post-validation.

- Templates: ``plain`` is the task text as written; ``structured`` prefixes an explicit
  task slot (``sb|73-25=``), the article's Action/Resource/Constraint idea reduced to
  what this model's tasks carry. The base model is trained on both.
- Entropy pruning scores each prompt token by its surprisal under the model itself
  (−log p(token | prefix) / log V, in [0, 1]) and drops, window by window, the tokens
  below τ: the predictable ones. The last token (the answer trigger) is never dropped.
- Confidence of an answer is the geometric mean of its tokens' probabilities.
"""

from __future__ import annotations

import math

TEMPLATES = ("plain", "structured")
TASK_CODES = {"arith": "ad", "lookup": "kv", "ledger": "sb", "mirror": "rv", "codebook": "cb"}


def apply_template(text: str, *, domain: str, template: str) -> str:
    if template == "plain":
        return text
    if template == "structured":
        return f"{TASK_CODES.get(domain, 'xx')}|{text}"
    raise ValueError(f"prompt_template: {template!r} is not one of {TEMPLATES}")


def prune_by_entropy(token_ids: list[int], surprisal: list[float], *, tau: float, window: int, keep_prefix: int = 1) -> list[int]:
    """Drop tokens whose normalised surprisal is below `tau`, per window of `window` tokens.

    ``surprisal[i]`` belongs to ``token_ids[i]``; the first `keep_prefix` tokens (BOS) and the
    last token are kept, and every window keeps at least its most surprising token.
    """
    if len(token_ids) != len(surprisal):
        raise ValueError("surprisal must have one value per token")
    keep = [False] * len(token_ids)
    for i in range(min(keep_prefix, len(token_ids))):
        keep[i] = True
    keep[-1] = True
    for start in range(keep_prefix, len(token_ids), window):
        idx = range(start, min(start + window, len(token_ids)))
        kept_any = False
        for i in idx:
            if surprisal[i] >= tau:
                keep[i] = True
                kept_any = True
        if not kept_any and len(idx):
            keep[max(idx, key=lambda i: surprisal[i])] = True
    return [t for t, k in zip(token_ids, keep) if k]


def confidence(token_logprobs: list[float]) -> float:
    """Geometric-mean probability of the generated tokens (1.0 for an empty answer)."""
    if not token_logprobs:
        return 1.0
    return math.exp(sum(token_logprobs) / len(token_logprobs))
