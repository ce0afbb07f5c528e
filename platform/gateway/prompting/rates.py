"""Per-backend prefill rates measured from the gateway's own requests, and the notes that
carry a request's prompt-strategy measurements to its inference event.

**Prefill rate** (``prompt_split``'s budget): a rolling ratio of sums, Σ prompt tokens / Σ
seconds from sending the upstream request to its first token, over a backend's last
:data:`WINDOW` successful *streamed* requests of units in an experiment (a non-streamed
answer has no first-token time: its TTFT is the whole answer). The seconds include the
backend's fixed per-request overhead (queueing, the first decode step), so the rate is an
effective one — the budget it gives is the prompt the backend starts answering within the
latency budget, which is what the strategy promises. Prompt tokens are the backend's usage,
else the gateway's estimate of the prompt it sent (~4 characters a token; llama.cpp streams
report no usage). Until :data:`MIN_SAMPLES` requests are measured there is no rate, and
``prompt_split`` keeps the soft text whole (``dims.split_rate = "unmeasured"``).

**Notes**: the pipeline files one per request under its trace id; ``metering.inference_event``
takes it (once per event of the request) to add its measures and dims and to feed the rate.
Trace ids are unique (uuid4), so one module-level table serves every gateway in a process;
it is bounded (:data:`MAX_NOTES`, oldest dropped).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

WINDOW = 64
MIN_SAMPLES = 4
MAX_NOTES = 8192


class PrefillRates:
    """Rolling prefill rate (prompt tokens per second) per backend name."""

    def __init__(self, window: int = WINDOW, min_samples: int = MIN_SAMPLES) -> None:
        self.window, self.min_samples = window, min_samples
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, backend: str, prompt_tokens: float, seconds: float) -> None:
        if prompt_tokens > 0 and seconds > 0:
            self._samples.setdefault(backend, deque(maxlen=self.window)).append((float(prompt_tokens), float(seconds)))

    def rate(self, backend: str) -> float | None:
        samples = self._samples.get(backend)
        if not samples or len(samples) < self.min_samples:
            return None
        seconds = sum(s for _, s in samples)
        return sum(t for t, _ in samples) / seconds if seconds > 0 else None

    def samples(self, backend: str) -> int:
        return len(self._samples.get(backend) or ())


@dataclass
class Notes:
    """What one request's prompt strategies did, for its inference event(s)."""

    rates: PrefillRates
    backend: str
    events: int  # inference events the request will write (one per experiment it is in)
    sent_at: float = 0.0  # perf_counter when the rewritten request left for the backend
    est_prompt_tokens: int = 0  # the gateway's estimate of the prompt it sent
    measures: dict[str, float] = field(default_factory=dict)
    dims: dict[str, str] = field(default_factory=dict)
    observed: bool = False


_NOTES: OrderedDict[str, Notes] = OrderedDict()


def file_notes(trace_id: str, notes: Notes) -> None:
    _NOTES[trace_id] = notes
    while len(_NOTES) > MAX_NOTES:
        _NOTES.popitem(last=False)


def take_notes(trace_id: str, m: Any) -> Notes | None:
    """The request's notes for one of its inference events (``m``: its ``Measurement``); the
    first call feeds the prefill rate, the last forgets them."""
    notes = _NOTES.get(trace_id)
    if notes is None:
        return None
    if not notes.observed:
        notes.observed = True
        if m.error is None and m.first_token is not None and notes.sent_at:
            tokens = m.prompt_tokens if m.prompt_tokens is not None else notes.est_prompt_tokens
            notes.rates.observe(notes.backend, tokens, m.first_token - notes.sent_at)
    notes.events -= 1
    if notes.events <= 0:
        _NOTES.pop(trace_id, None)
    return notes
