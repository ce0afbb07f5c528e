"""Batching policies as a pure scheduler: it decides which waiting requests join the
running batch, how many prompt tokens each step may carry, and when to wake up, and never
runs a kernel (vLLM's schedule → execute → update split), so it is unit-tested with a
fake clock.

- ``none``: one request at a time.
- ``fixed``: static batches. When idle, wait until ``max_batch`` requests are queued or
  the oldest has waited ``window_ms``; the batch then runs to completion while newcomers
  wait (the classic fixed-batch server).
- ``adaptive``: continuous batching of decode steps with chunked prefill. Every step is
  one forward carrying a decode token for each running sequence plus prompt chunks, so a
  newcomer joins at the next step. The step's token budget is sized from a live cost
  model (step time = a + b·tokens, fitted online) so that a step with prompt work stays
  within ``step_budget_ms`` (the TPOT target a running sequence must see); admission
  stops when the decoding batch alone would fill it. When idle, the wait to gather a
  batch follows the live arrival rate: none at low load, a couple of steps at high load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchingConfig:
    policy: str = "none"
    max_batch: int = 8
    window_ms: float = 5.0
    # adaptive: the longest a step may take when it carries prompt chunks (a running
    # sequence's TPOT target, e.g. from the TPOT SLO); None: 3× a pure decode step
    step_budget_ms: float | None = None
    # adaptive, SLO-aware: with a TPOT SLO, a step's budget is the smallest TPOT slack of the
    # running sequences (see `Scheduler.tpot_slack_s`) instead of a flat step budget; with a
    # TTFT SLO, waiting requests that can still meet it are admitted before those that cannot
    tpot_slo_ms: float | None = None
    ttft_slo_ms: float | None = None
    # adaptive, with a TTFT SLO: refuse a waiting request once it can no longer meet the SLO
    # (load shedding) instead of running it after the ones that can. It only drops requests
    # that have already missed their SLO, so it never costs goodput; under overload it frees
    # the capacity they would take for requests that can still make it
    shed_late: bool = False


MIN_CHUNK = 8  # prompt tokens a step always carries, so prefill progresses under any budget
# adaptive: when requests generate this few tokens on average and arrivals overlap, a newcomer
# waits for the running batch to drain (a step or two) instead of joining it
SHORT_ANSWER_TOKENS = 4.0
SLACK_SAFETY = 0.5  # the cost model's error and the engine's own time between steps


@dataclass
class StepCost:
    """Step seconds ≈ a + b·tokens, fitted by exponentially weighted least squares."""

    a: float = 0.002
    b: float = 0.0002
    decay: float = 0.97
    _w: float = 0.0
    _sn: float = 0.0
    _snn: float = 0.0
    _st: float = 0.0
    _snt: float = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self._w = d * self._w + 1
        self._sn = d * self._sn + tokens
        self._snn = d * self._snn + tokens * tokens
        self._st = d * self._st + seconds
        self._snt = d * self._snt + tokens * seconds
        var = self._snn / self._w - (self._sn / self._w) ** 2
        if self._w > 5 and var > 4.0:  # enough spread in token counts to fit a slope
            b = (self._snt / self._w - self._sn / self._w * self._st / self._w) / var
            if b > 0:
                self.b = b
                self.a = max(0.0, self._st / self._w - b * self._sn / self._w)
                return
        # one size seen so far: keep the slope, move the intercept
        self.a = max(0.0, self._st / self._w - self.b * self._sn / self._w)

    def seconds(self, tokens: int) -> float:
        return self.a + self.b * tokens

    def tokens_within(self, seconds: float) -> int:
        return int((seconds - self.a) / self.b + 1e-6) if self.b > 0 else 1 << 30


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
    cost: StepCost = field(default_factory=StepCost)

    def on_arrival(self, t: float) -> None:
        self.rate.observe(t)

    def on_step(self, seconds: float, *, tokens: int = 1, decoding: int = 1) -> None:
        """One forward took `seconds` for `tokens` tokens, `decoding` of them decode steps."""
        self.cost.observe(tokens, seconds)
        if tokens == decoding:  # a pure decode step: the per-token pace when nothing stalls it
            self.step_time_s = 0.9 * self.step_time_s + 0.1 * seconds

    def step_target_s(self, decoding: int) -> float:
        cfg = self.config
        if cfg.tpot_slo_ms is not None:
            return cfg.tpot_slo_ms / 2000.0  # a 2-token answer's TPOT spans two steps
        if cfg.step_budget_ms is not None:
            return cfg.step_budget_ms / 1000.0
        return 3.0 * self.cost.seconds(max(decoding, 1))

    def step_tokens(self, decoding: int) -> int:
        """Tokens one step may carry and stay within the step target."""
        return self.cost.tokens_within(self.step_target_s(decoding))

    def tpot_slack_s(self, progress: list[tuple[int, float]]) -> float | None:
        """The longest next step every running sequence that can still meet the TPOT SLO
        survives, whatever its answer's length. `progress`: (tokens generated, seconds since
        its first token) per sequence. With g ≥ 2 tokens the next step may bring EOS, so
        TPOT = (e + s) / (g − 1); with g = 1 an EOS next leaves TPOT undefined, and the
        tightest case is EOS one pure decode step d later: (e + s + d) / 1. Sequences that
        have already lost the SLO are not protected (the step would only slow the rest).
        None: nobody to protect."""
        slo = self.config.tpot_slo_ms / 1000.0
        d = self.cost.seconds(len(progress))
        slacks = []
        for g, e in progress:
            slack = slo * (g - 1) - e if g >= 2 else slo - e - d
            if slack > d:
                slacks.append(slack)
        return SLACK_SAFETY * min(slacks) if slacks else None

    def prefill_budget(self, *, decoding: int, progress: list[tuple[int, float]] | None = None) -> int | None:
        """Prompt tokens the next step may carry; None: whole prompts (no one to stall, or
        a policy that does not chunk)."""
        if self.config.policy != "adaptive" or decoding == 0:
            return None
        if self.config.tpot_slo_ms is not None and progress is not None:
            # SLO-aware: prompt work rides a step only as far as every protected sequence's
            # slack allows, else the step decodes alone; prompts then wait for slack or for
            # the batch to drain (its steps end within max_new_tokens), when a whole group is
            # prefilled at once: static batching's efficiency when slack is short,
            # continuous batching when it is not
            slack = self.tpot_slack_s(progress)
            if slack is None:  # nobody left to protect: still no step longer than the flat target
                slack = self.step_target_s(decoding)
            return max(0, self.cost.tokens_within(slack) - decoding)
        return max(MIN_CHUNK, self.step_tokens(decoding) - decoding)

    def admission_order(self, waiting_since: list[float], now: float) -> list[int]:
        """Indices of the waiting requests in the order to admit them: FCFS, except that with
        a TTFT SLO the ones that can still meet it go first (under overload FCFS would make
        every request late; the late ones still run, after)."""
        if self.config.policy != "adaptive" or self.config.ttft_slo_ms is None:
            return list(range(len(waiting_since)))
        limit = self._ttft_wait_limit_s()
        fresh = [i for i, t in enumerate(waiting_since) if now - t < limit]
        late = [i for i, t in enumerate(waiting_since) if now - t >= limit]
        return fresh + late

    def to_shed(self, waiting_since: list[float], now: float) -> list[int]:
        """Indices of waiting requests to refuse now (``shed_late``): those that waited so long
        that even a first prompt chunk right away would miss the TTFT SLO."""
        cfg = self.config
        if cfg.policy != "adaptive" or cfg.ttft_slo_ms is None or not cfg.shed_late:
            return []
        limit = self._ttft_wait_limit_s()
        return [i for i, t in enumerate(waiting_since) if now - t >= limit]

    def group_admission(self, waiting_since: list[float], prompt_tokens: list[int], now: float, *, room: int) -> tuple[list[int], list[int]]:
        """With ``shed_late``, the group to prefill together in one step while nothing runs
        (whole prompts, one forward), from the whole queue (arrival order): (indices to
        prefill now, indices to refuse), each ascending.

        That step ends every member's TTFT, so it is predicted from the step cost model: a
        request meets the SLO iff it has waited less than the SLO minus the step's time. The
        queue-only limit (`to_shed`) assumes a minimum chunk, while a group of 16 prompts
        takes several times that: under overload the requests admitted near the limit all
        missed. So a request that would miss even alone is refused, and the group is filled
        freshest first, up to `room`, with those it still leaves on time: the freshest have
        the most slack, so the group (one efficient forward) can be largest. Below capacity
        the whole queue fits and order does not matter; under overload the oldest, which
        would soon be refused anyway, wait (and are refused when they can no longer make it)."""
        cfg = self.config
        n = len(waiting_since)
        if cfg.policy != "adaptive" or cfg.ttft_slo_ms is None or not cfg.shed_late:
            return list(range(min(n, room))), []
        slo = cfg.ttft_slo_ms / 1000.0
        keep: list[int] = []
        refuse: list[int] = []
        tokens = 0
        oldest: float | None = None
        for i in reversed(range(n)):
            since, p = waiting_since[i], prompt_tokens[i]
            if now - since + self.cost.seconds(p) > slo:
                refuse.append(i)
                continue
            if len(keep) >= room:
                continue
            first = since if oldest is None else min(oldest, since)
            if now - first + self.cost.seconds(tokens + p) <= slo:
                keep.append(i)
                tokens += p
                oldest = first
        return sorted(keep), sorted(refuse)

    def _ttft_wait_limit_s(self) -> float:
        """The longest a request may wait and still get its first token within the TTFT SLO."""
        return self.config.ttft_slo_ms / 1000.0 - self.cost.seconds(MIN_CHUNK)

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
            # admission sized by the step budget: stop while the decoding batch alone would
            # leave less than a minimum prompt chunk in a step (its TPOT would break)
            # (with a TPOT SLO the slack gates prompt work per step instead, so admission
            # only needs a slot)
            cap = cfg.max_batch if cfg.tpot_slo_ms is not None else min(cfg.max_batch, max(1, self.step_tokens(running) - MIN_CHUNK))
            room = cap - running
            if room <= 0:
                return Decision(0, None)
            if running:
                if self.steps_per_request <= SHORT_ANSWER_TOKENS and self.target_batch() > 1:
                    # short answers under load: the batch drains within a step or two, after
                    # which the queue is prefilled as one group (one efficient GEMM, and no
                    # prompt chunk stretches the running sequences' decode steps); at low
                    # load (target 1) a newcomer still joins at once
                    return Decision(0, None)
                return Decision(min(n, room), None)  # newcomers ride the next step (chunked, budgeted)
            # idle: gather the batch the arrival rate predicts, waiting at most two decode
            # steps and the window; at low load target is 1 and nobody waits
            target = min(self.target_batch(), room)
            if n >= target:
                return Decision(min(n, room), None)
            wait = min(window, (target - n) / max(self.rate.rate, 1e-9), 2 * self.step_time_s)
            deadline = waiting_since[0] + wait
            if now >= deadline:
                return Decision(min(n, room), None)
            return Decision(0, deadline)
        raise ValueError(f"batching.policy: {cfg.policy!r} is not one of none, fixed, adaptive")
