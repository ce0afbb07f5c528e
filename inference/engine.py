"""The engine loop: schedule → execute → update, on one thread per runtime configuration.

Requests are submitted from any thread and complete through a :class:`GenRequest`'s
event. Timing uses ``perf_counter`` exactly as docs/architecture.md defines the metrics: TTFT is
submission → first generated token, E2E is submission → last token. Device-seconds are
attributed per step by tokens processed: a step carrying b decode tokens and a 13-token
prompt chunk gives each decoding sequence 1/(b+13) of it and the prompt 13/(b+13).

A step is one forward (:meth:`Executor.forward_chunks`): one decode token for every
running sequence plus prompt chunks up to the scheduler's token budget (chunked prefill),
so a newcomer's prompt never stalls the running batch by more than the budget allows.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ablab.inference.runtime.executor import Executor
from ablab.inference.scheduler import MIN_CHUNK, BatchingConfig, Scheduler


@dataclass
class GenRequest:
    prompt_ids: list[int]
    adapter: int = 0
    max_new_tokens: int = 8
    # serving-benchmark mode (vLLM-style fixed output length): EOS is an ordinary token and
    # generation runs to max_new_tokens (or the model's max_len); off everywhere else
    ignore_eos: bool = False
    submitted: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    device_s: float = 0.0
    error: str | None = None
    shed: bool = False  # refused by load shedding (the error says why); retrying elsewhere may succeed
    done: threading.Event = field(default_factory=threading.Event)
    # engine-internal
    slot: int = -1
    length: int = 0  # tokens in the cache once decoding
    prefilled: int = 0  # prompt tokens in the cache (chunked prefill)

    @property
    def ttft_s(self) -> float:
        return (self.first_token_at or self.submitted) - self.submitted

    @property
    def e2e_s(self) -> float:
        return (self.finished_at or self.submitted) - self.submitted


def _pick(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    logp = torch.log_softmax(logits.float(), dim=-1)
    best = logp.argmax(dim=-1)
    return best.tolist(), logp.gather(-1, best.unsqueeze(-1)).squeeze(-1).tolist()


class Engine:
    """Runs one executor; `step()` is usable synchronously (tests, benchmarks) or from `start()`."""

    def __init__(self, executor: Executor, *, batching: BatchingConfig, eos_id: int, slots: int | None = None):
        self.executor = executor
        self.scheduler = Scheduler(batching)
        self.eos_id = eos_id
        self.pool = executor.new_pool(slots or max(batching.max_batch, 1))
        self.waiting: deque[GenRequest] = deque()
        self.prefilling: list[GenRequest] = []  # admitted; prompt partly in the cache
        self.running: list[GenRequest] = []  # decoding
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.steps = 0
        self.shed = 0  # requests refused by load shedding (BatchingConfig.shed_late)

    # ------------------------------------------------------------- submission
    def submit(self, req: GenRequest) -> GenRequest:
        with self._cv:
            req.submitted = time.perf_counter()
            self.scheduler.on_arrival(req.submitted)
            self.waiting.append(req)
            self._cv.notify()
        return req

    def generate(
        self, prompt_ids: list[int], *, adapter: int = 0, max_new_tokens: int = 8, timeout: float = 60.0,
        on_submit: Callable[[GenRequest], None] | None = None,
    ) -> GenRequest:
        """Run one request to completion; `on_submit` sees it queued (a streamer reads its tokens as they come)."""
        req = self.submit(GenRequest(prompt_ids=prompt_ids, adapter=adapter, max_new_tokens=max_new_tokens))
        if on_submit is not None:
            on_submit(req)
        if self._thread is None:
            while not req.done.is_set():
                self.step(block=False)
        elif not req.done.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        return req

    # ------------------------------------------------------------- the loop
    def start(self) -> Engine:
        self._thread = threading.Thread(target=self._loop, name="ablab-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._cv:
                if self._stop:
                    return
            self.step(block=True)

    def step(self, *, block: bool) -> None:
        """One iteration: admit what the scheduler allows, then one forward that carries a
        decode token for every running sequence plus prompt chunks within the step budget."""
        with self._cv:
            now = time.perf_counter()
            self._shed_late(now)
            order = self.scheduler.admission_order([r.submitted for r in self.waiting], now)
            if order != list(range(len(order))):
                self.waiting = deque(self.waiting[i] for i in order)
            decision = self.scheduler.schedule(
                waiting_since=[r.submitted for r in self.waiting], running=len(self.running) + len(self.prefilling), now=now
            )
            if decision.admit and not self.running and not self.prefilling and self.scheduler.config.shed_late:
                admitted = self._feasible_group(decision.admit, now)
            else:
                admitted = [self.waiting.popleft() for _ in range(decision.admit)]
            if not admitted and not self.running and not self.prefilling:
                if block and not self._stop:
                    timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
                    self._cv.wait(timeout=timeout if timeout is not None else 0.5)
                elif decision.wake_at is not None:
                    time.sleep(max(0.0, min(decision.wake_at - now, 0.01)))
                return
        for req in admitted:
            self._admit(req)
        if self.running or self.prefilling:
            self._forward()

    def _admit(self, req: GenRequest) -> None:
        n = len(req.prompt_ids)
        if n == 0 or n >= self.executor.cfg.max_len:  # fails alone, before it shares a forward
            self._finish(req, error=f"ValueError: prompt: {n} tokens leave no room to generate (max_len {self.executor.cfg.max_len})")
            return
        try:
            req.slot = self.pool.acquire()
        except RuntimeError as exc:
            self._finish(req, error=f"{type(exc).__name__}: {exc}")
            return
        req.prefilled = 0
        self.prefilling.append(req)

    def _shed_late(self, now: float) -> None:
        """Refuse requests that can no longer meet the TTFT SLO (``shed_late``; caller holds the
        lock): queued ones, and admitted ones whose prompt has not started (they hold a slot
        while they wait for slack, and would otherwise run late)."""
        if not self.scheduler.config.shed_late:
            return
        candidates = [*self.waiting, *(r for r in self.prefilling if r.prefilled == 0)]
        late = [candidates[i] for i in self.scheduler.to_shed([r.submitted for r in candidates], now)]
        if not late:
            return
        for req in late:
            self._refuse(req, now)
        gone = {id(r) for r in late}
        self.waiting = deque(r for r in self.waiting if id(r) not in gone)
        self.prefilling = [r for r in self.prefilling if id(r) not in gone]

    def _feasible_group(self, room: int, now: float) -> list[GenRequest]:
        """With load shedding, the group prefilled in one step while nothing runs, chosen from
        the whole queue (`Scheduler.group_admission`); refuses those that would miss the TTFT
        SLO even alone. Caller holds the lock."""
        queue = list(self.waiting)
        keep, refuse = self.scheduler.group_admission([r.submitted for r in queue], [len(r.prompt_ids) for r in queue], now, room=room)
        for i in refuse:
            self._refuse(queue[i], now)
        gone = set(keep) | set(refuse)
        self.waiting = deque(r for i, r in enumerate(queue) if i not in gone)
        return [queue[i] for i in keep]

    def _refuse(self, req: GenRequest, now: float) -> None:
        """Load shedding: the request can no longer meet the TTFT SLO; it ends with no tokens."""
        slo = self.scheduler.config.ttft_slo_ms
        self._finish(req, error=f"overloaded: queued {(now - req.submitted) * 1000:.0f} ms, too late for the {slo:g} ms TTFT SLO; retry later or on another worker", shed=True)

    def _finish(self, req: GenRequest, *, error: str | None = None, shed: bool = False) -> None:
        req.finished_at = time.perf_counter()
        req.error = error
        req.shed = shed
        if shed:  # refused before generating: not a sample of how long requests run
            self.shed += 1
        else:
            self.scheduler.on_finish(len(req.tokens) + 1)
        if req.slot >= 0:
            self.pool.release(req.slot)
            req.slot = -1
        req.done.set()

    def _plan_chunks(self) -> list[tuple[GenRequest, int]]:
        """Prompt chunks for this step, oldest first, within the scheduler's token budget
        (None: whole prompts). Chunked prefill: a long prompt batch is spread over steps
        instead of stalling every running sequence's next token behind it."""
        now = time.perf_counter()
        progress = [(len(r.tokens), now - (r.first_token_at or now)) for r in self.running]
        budget = self.scheduler.prefill_budget(decoding=len(self.running), progress=progress)
        plan = []
        for req in self.prefilling:
            left = len(req.prompt_ids) - req.prefilled
            take = left if budget is None else min(left, budget)
            if take <= 0 or (self.running and take < min(left, MIN_CHUNK)):  # a sliver: a step's overhead for little
                break
            plan.append((req, take))
            if budget is not None:
                budget -= take
        return plan

    def _forward(self) -> None:
        plan = self._plan_chunks()
        if not plan:
            if self.running:
                self._decode()
            return
        try:
            self._run(self.running, plan)
        except Exception:  # retry each prompt chunk alone, so a bad request fails alone
            for item in plan:
                try:
                    self._run([], [item])
                except Exception as exc:
                    self.prefilling.remove(item[0])
                    self._finish(item[0], error=f"{type(exc).__name__}: {exc}")
            if self.running:
                self._decode()

    def _run(self, decode: list[GenRequest], plan: list[tuple[GenRequest, int]]) -> None:
        """One forward: a decode token per sequence in `decode` plus the planned prompt chunks."""
        chunks = [[r.tokens[-1]] for r in decode] + [r.prompt_ids[r.prefilled : r.prefilled + n] for r, n in plan]
        reqs = decode + [r for r, _ in plan]
        t0 = time.perf_counter()
        logits = self.executor.forward_chunks(
            chunks,
            pool=self.pool,
            slots=[r.slot for r in reqs],
            starts=[r.length for r in decode] + [r.prefilled for r, _ in plan],
            adapters=[r.adapter for r in reqs],
            n_decode=len(decode),
        )
        toks, lps = _pick(logits)
        t1 = time.perf_counter()
        self.steps += 1
        n_tokens = sum(len(c) for c in chunks)
        self.scheduler.on_step(t1 - t0, tokens=n_tokens, decoding=len(decode))
        for r, c in zip(reqs, chunks):
            r.device_s += (t1 - t0) * len(c) / n_tokens  # the step's time, by tokens processed
        for r, tok, lp in zip(decode, toks, lps):
            r.length += 1
            self._append(r, tok, lp, t1)
        for (r, n), tok, lp in zip(plan, toks[len(decode) :], lps[len(decode) :]):
            r.prefilled += n
            if r.prefilled < len(r.prompt_ids):
                continue  # mid-prompt logits are not a generated token
            r.length = len(r.prompt_ids)
            self._append(r, tok, lp, t1)
            self.prefilling.remove(r)
            if not r.done.is_set():
                self.running.append(r)
        self.running = [r for r in self.running if not r.done.is_set()]

    def _append(self, req: GenRequest, tok: int, lp: float, now: float) -> None:
        if req.first_token_at is None:
            req.first_token_at = now
        if tok == self.eos_id and not req.ignore_eos:
            self._finish(req)
            return
        req.tokens.append(tok)
        req.logprobs.append(lp)
        if len(req.tokens) >= req.max_new_tokens or req.length + 1 >= self.executor.cfg.max_len:
            self._finish(req)

    def _decode(self) -> None:
        """A step with no prompt work: the plain batched decode kernel path."""
        batch = self.running
        t0 = time.perf_counter()
        try:
            logits = self.executor.decode(
                [r.tokens[-1] for r in batch],
                pool=self.pool,
                slots=[r.slot for r in batch],
                lengths=[r.length for r in batch],
                adapters=[r.adapter for r in batch],
            )
        except Exception as exc:
            for r in batch:
                self._finish(r, error=f"{type(exc).__name__}: {exc}")
            self.running = []
            return
        toks, lps = _pick(logits)
        t1 = time.perf_counter()
        self.steps += 1
        self.scheduler.on_step(t1 - t0, tokens=len(batch), decoding=len(batch))
        share = (t1 - t0) / len(batch)  # one token each: equal shares of the step
        for r, tok, lp in zip(batch, toks, lps):
            r.device_s += share
            r.length += 1
            self._append(r, tok, lp, t1)
        self.running = [r for r in batch if not r.done.is_set()]
