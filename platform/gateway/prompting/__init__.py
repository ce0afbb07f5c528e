"""Prompt strategies as gateway factors, for any OpenAI-compatible backend:
``dialogue_state`` (slots instead of history), ``prompt_split`` (hard prefix kept, soft rest
cut to the latency budget's tokens) and ``context_prune`` (token-entropy pruning with the
backend's own tokenizer and probabilities). The factors are declared in
:mod:`ablab.platform.strategy`; :func:`rewrite_request` is the gateway's whole rewrite.

- :mod:`.transforms`: the transformations, pure (fixed inputs, fixed outputs);
- :mod:`.backend`: the backend's tokenizer and prompt log-probabilities;
- :mod:`.rates`: measured prefill rates and the per-request notes that reach the event;
- :mod:`.pipeline`: the order they run in and what they record.
"""

from ablab.platform.gateway.prompting.pipeline import PROMPT_FACTORS, rewrite_request

__all__ = ["PROMPT_FACTORS", "rewrite_request"]
