"""Entropy prompt compression with the in-repo model as the cheap scorer (LLMLingua's idea:
a small model decides which tokens a larger one can do without).

The in-repo model is character-level over a small alphabet, so it scores the characters it
knows (lower-cased) and always keeps the ones it does not; pruning is per window, as
:func:`ablab.inference.prompts.prune_by_entropy` does for the in-repo runtime. torch is
imported on first use only; without it the gateway refuses such strategies (see
:func:`ablab.platform.gateway.rewrite.strategy_problems`).
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_scorer: Any = None


def _load() -> Any:
    global _scorer
    with _lock:
        if _scorer is None:
            import math

            import torch

            from ablab.inference.assets import load_bundle

            bundle = load_bundle()
            model = bundle.model.eval()
            tok = bundle.tokenizer

            @torch.inference_mode()
            def score(ids: list[int]) -> list[float]:
                x = torch.tensor([ids])
                logp = torch.log_softmax(model(x)[0, :-1].float(), dim=-1)
                s = -logp.gather(-1, x[0, 1:].unsqueeze(-1)).squeeze(-1) / math.log(logp.shape[-1])
                return [1.0, *s.clamp(0, 1).tolist()]

            _scorer = (tok, score)
    return _scorer


def compress(text: str, tau: float, window: int) -> str:
    """``text`` with its predictable (low-surprisal) characters dropped."""
    from ablab.inference.prompts import prune_by_entropy

    if len(text) < 3:
        return text
    tok, score = _load()
    known = {t for t in tok.tokens if len(t) == 1}
    lowered = text.lower()
    positions = [i for i, ch in enumerate(lowered) if ch in known]
    if len(positions) < 3:
        return text
    ids = tok.encode("".join(lowered[i] for i in positions))  # BOS first
    surprisal = score(ids)
    keep_ids = prune_by_entropy(list(range(len(ids))), surprisal, tau=tau, window=window)
    kept = {positions[i - 1] for i in keep_ids if i > 0}
    known_pos = set(positions)
    return "".join(ch for i, ch in enumerate(text) if i not in known_pos or i in kept)
