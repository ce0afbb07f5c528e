"""Delayed-label simulator: grades served answers against ground truth and emits
``feedback`` after a human-like delay, for a sampled fraction of requests.

The delay is lognormal in minutes (median and spread configurable). The core,
:class:`Labeler`, takes records and a clock and emits whatever is due; the CLI tails the
traffic generator's ledger file.
"""

from __future__ import annotations

import json
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ablab.inference.serving import events as ev

_LABEL_NAMESPACE = uuid.UUID("5b0f7c1e-3a57-4d8e-9a52-6f0c1b2a9e41")


def label_event_id(source: str, trace_id: str) -> str:
    """One labeler's grade of one request is one fact: a restarted labeler that re-reads its
    ledger emits the same ids again, and the pipeline keeps one copy."""
    return uuid.uuid5(_LABEL_NAMESPACE, f"{source}|{trace_id}").hex


@dataclass(frozen=True)
class LabelerConfig:
    fraction: float = 0.2  # share of requests a human labels
    delay_median_s: float = 180.0
    delay_sigma: float = 0.6  # lognormal shape
    source: str = "human"
    seed: int = 11

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction: must be in [0, 1], got {self.fraction}")
        if self.delay_median_s < 0:
            raise ValueError(f"delay_median_s: must be >= 0, got {self.delay_median_s}")
        if self.source not in ("human", "auto", "judge"):
            raise ValueError(f"source: {self.source!r} is not human, auto or judge")


@dataclass(order=True)
class _Pending:
    due: float
    trace_id: str = field(compare=False)
    correct: int = field(compare=False)


class Labeler:
    def __init__(self, cfg: LabelerConfig, sink: ev.EventSink, *, clock: Callable[[], float] = time.time):
        self.cfg = cfg
        self.sink = sink
        self.clock = clock
        self.rng = random.Random(cfg.seed)
        self.pending: list[_Pending] = []
        self.offered = 0
        self.sampled = 0
        self.emitted = 0

    def delay(self) -> float:
        if self.cfg.delay_median_s == 0:
            return 0.0
        return self.rng.lognormvariate(math.log(self.cfg.delay_median_s), self.cfg.delay_sigma)

    def offer(self, record: dict) -> bool:
        """Consider one served request ({trace_id, output, answer}); True when it will be labeled."""
        for key in ("trace_id", "output", "answer"):
            if key not in record:
                raise ValueError(f"ledger record: missing {key!r}")
        self.offered += 1
        if self.rng.random() >= self.cfg.fraction:
            return False
        self.sampled += 1
        # a record may carry its own grade (free-text LLM answers are graded by whoever asked)
        correct = int(record["correct"]) if "correct" in record else int(str(record["output"]).strip() == str(record["answer"]).strip())
        self.pending.append(_Pending(self.clock() + self.delay(), record["trace_id"], correct))
        self.pending.sort()
        return True

    def emit_due(self) -> int:
        now = self.clock()
        n = 0
        while self.pending and self.pending[0].due <= now:
            p = self.pending.pop(0)
            event = ev.feedback_event(trace_id=p.trace_id, correct=p.correct, source=self.cfg.source)
            event["event_id"] = label_event_id(self.cfg.source, p.trace_id)
            self.sink.emit(event)
            n += 1
        self.emitted += n
        return n


def tail_ledger(path: Path, labeler: Labeler, *, poll_s: float = 0.5, stop: Callable[[], bool] = lambda: False) -> None:
    """Follow `path` (JSON lines) like ``tail -f``, feeding the labeler and emitting due labels."""
    pos = 0
    while not stop():
        if path.is_file():
            with path.open("rb") as f:
                f.seek(pos)
                for line in f:
                    if not line.endswith(b"\n"):
                        break  # a record still being written: read it next time
                    pos += len(line)
                    if line.strip():
                        labeler.offer(json.loads(line))
        labeler.emit_due()
        time.sleep(poll_s)
