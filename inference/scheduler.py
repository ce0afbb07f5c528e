"""Batching policies as a pure scheduler: it decides which waiting requests join the
running batch and when to wake up, and never runs a kernel (vLLM's schedule → execute →
update split), so it is unit-tested with a fake clock.

- ``none``: one request at a time.
- ``fixed``: static batches. When idle, wait until ``max_batch`` requests are queued or
  the oldest has waited ``window_ms``; the batch then runs to completion while newcomers
  wait (the classic fixed-batch server).
- ``adaptive``: continuous batching of decode steps (a newcomer joins the running batch
  at the next step, up to ``max_batch``), with the target batch size and the wait window
  set from the live arrival rate: at low load it never waits; at high load newcomers are
  gathered into groups sized from the arrival rate and share one padded prefill, waiting
  at most a few decode steps (one prefill per arrival would stall the running batch
  once per arrival and cap throughput below a static batcher's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchingConfig:
    policy: str = "none"
    max_batch: int = 8
    window_ms: float = 5.0


@dataclass
class ArrivalRate:
    """Exponentially weighted arrival rate (requests/s) from inter-arrival gaps."""

    half_life_s: float = 2.0
    rate: float = 0.0
    _last: float | None = None

    def observe(self, t: float) -> None:
        if self._last is not None:
            gap = max(t - self._last, 1e-6)
            alpha = 1 - math.exp(-gap * math.log(2) / self.half_life_s)
            self.rate = (1 - alpha) * self.rate + alpha * (1.0 / gap) if self.rate else 1.0 / gap
        self._last = t


@dataclass(frozen=True)
class Decision:
    admit: int  # how many of the oldest waiting requests to start now
    wake_at: float | None  # when to look again if nothing else happens (None: on next event)


@dataclass
class Scheduler:
    config: BatchingConfig
    step_time_s: float = 0.002  # EWMA of one decode step, updated by the engine
    steps_per_request: float = 8.0  # EWMA of tokens a request generates, updated on finish
    rate: ArrivalRate = field(default_factory=ArrivalRate)
    _static_batch_open: bool = False

    def on_arrival(self, t: float) -> None:
        self.rate.observe(t)

    def on_step(self, seconds: float) -> None:
        self.step_time_s = 0.9 * self.step_time_s + 0.1 * seconds

    def on_finish(self, tokens: int) -> None:
        self.steps_per_request = 0.9 * self.steps_per_request + 0.1 * max(tokens, 1)

    def target_batch(self) -> int:
        """Requests expected to arrive while one request decodes, capped: 1 (never wait)
        until arrivals overlap, i.e. until the load nears batch-1 capacity."""
        expected = self.rate.rate * self.step_time_s * self.steps_per_request
        return max(1, min(self.config.max_batch, math.ceil(expected)))

    def schedule(self, *, waiting_since: list[float], running: int, now: float) -> Decision:
        """`waiting_since`: arrival times of queued requests, oldest first."""
        cfg = self.config
        n = len(waiting_since)
        if n == 0:
            return Decision(0, None)
        if cfg.policy == "none":
            return Decision(1 if running == 0 else 0, None)
        window = cfg.window_ms / 1000.0
        if cfg.policy == "fixed":
            if running:
                return Decision(0, None)
            deadline = waiting_since[0] + window
            if n >= cfg.max_batch or now >= deadline:
                return Decision(min(n, cfg.max_batch), None)
            return Decision(0, deadline)
        if cfg.policy == "adaptive":
            room = cfg.max_batch - running
            if room <= 0:
                return Decision(0, None)
            target = self.target_batch()
            # Newcomers are admitted in groups, idle or not (continuous batching): one padded
            # prefill for the group instead of one prefill per arrival, each of which would
            # stall every running sequence's next token. The group size follows the arrival
            # rate (half the expected batch); the wait is bounded by a few decode steps.
            group = max(1, min(room, target // 2)) if running else target
            if n >= group or target == 1:
                return Decision(min(n, room), None)
            steps = 4 if running else 2
            wait = min(window, (group - n) / max(self.rate.rate, 1e-9), steps * self.step_time_s)
            deadline = waiting_since[0] + wait
            if now >= deadline:
                return Decision(min(n, room), None)
            return Decision(0, deadline)
        raise ValueError(f"batching.policy: {cfg.policy!r} is not one of none, fixed, adaptive")
