"""The engine loop: schedule → execute → update, on one thread per runtime configuration.

Requests are submitted from any thread and complete through a :class:`GenRequest`'s
event. Timing uses ``perf_counter`` exactly as DESIGN.md defines the metrics: TTFT is
submission → first generated token, E2E is submission → last token. Device-seconds are
attributed per step: a prefill belongs to its request, a decode step over b sequences
(one token each) is split equally between them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ablab.inference.runtime.executor import Executor
from ablab.inference.scheduler import BatchingConfig, Scheduler


@dataclass
class GenRequest:
    prompt_ids: list[int]
    adapter: int = 0
    max_new_tokens: int = 8
    submitted: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    device_s: float = 0.0
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    # engine-internal
    slot: int = -1
    length: int = 0

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
        self.running: list[GenRequest] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = False
        self.steps = 0

    # ------------------------------------------------------------- submission
    def submit(self, req: GenRequest) -> GenRequest:
        with self._cv:
            req.submitted = time.perf_counter()
            self.scheduler.on_arrival(req.submitted)
            self.waiting.append(req)
            self._cv.notify()
        return req

    def generate(self, prompt_ids: list[int], *, adapter: int = 0, max_new_tokens: int = 8, timeout: float = 60.0) -> GenRequest:
        req = self.submit(GenRequest(prompt_ids=prompt_ids, adapter=adapter, max_new_tokens=max_new_tokens))
        if self._thread is None:
            while not req.done.is_set():
                self.step(block=False)
        elif not req.done.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        return req

    # ------------------------------------------------------------- the loop
    def start(self) -> "Engine":
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
        """One iteration: admit (prefill) what the scheduler allows, then one decode step."""
        with self._cv:
            now = time.perf_counter()
            decision = self.scheduler.schedule(
                waiting_since=[r.submitted for r in self.waiting], running=len(self.running), now=now
            )
            admitted = [self.waiting.popleft() for _ in range(decision.admit)]
            if not admitted and not self.running:
                if block and not self._stop:
                    timeout = None if decision.wake_at is None else max(0.0, decision.wake_at - now)
                    self._cv.wait(timeout=timeout if timeout is not None else 0.5)
                elif decision.wake_at is not None:
                    time.sleep(max(0.0, min(decision.wake_at - now, 0.01)))
                return
        if len(admitted) > 1:
            self._prefill_batch(admitted)
        else:
            for req in admitted:
                self._prefill(req)
        if self.running:
            self._decode()

    def _finish(self, req: GenRequest, *, error: str | None = None) -> None:
        req.finished_at = time.perf_counter()
        req.error = error
        self.scheduler.on_finish(len(req.tokens) + 1)
        if req.slot >= 0:
            self.pool.release(req.slot)
            req.slot = -1
        req.done.set()

    def _prefill(self, req: GenRequest) -> None:
        t0 = time.perf_counter()
        try:
            if req.slot < 0:
                req.slot = self.pool.acquire()
            logits = self.executor.prefill(req.prompt_ids, pool=self.pool, slot=req.slot, adapter=req.adapter)
        except Exception as exc:  # a bad request fails alone, the engine keeps serving
            self._finish(req, error=f"{type(exc).__name__}: {exc}")
            return
        (tok,), (lp,) = _pick(logits.unsqueeze(0))
        t1 = time.perf_counter()
        req.device_s += t1 - t0
        req.length = len(req.prompt_ids)
        self._append(req, tok, lp, t1)
        if not req.done.is_set():
            self.running.append(req)

    def _prefill_batch(self, reqs: list[GenRequest]) -> None:
        """Requests admitted together share one padded prefill (batch-1 kernels are
        overhead-bound, so m prompts in one call cost far less than m calls)."""
        for req in reqs:
            req.slot = self.pool.acquire()
        t0 = time.perf_counter()
        try:
            logits = self.executor.prefill_batch([r.prompt_ids for r in reqs], pool=self.pool, slots=[r.slot for r in reqs], adapters=[r.adapter for r in reqs])
        except Exception:  # fall back to one at a time, so a bad request fails alone
            for req in reqs:
                self.pool.release(req.slot)
                req.slot = -1
                self._prefill(req)
            return
        toks, lps = _pick(logits)
        t1 = time.perf_counter()
        total = sum(len(r.prompt_ids) for r in reqs)
        for req, tok, lp in zip(reqs, toks, lps):
            req.device_s += (t1 - t0) * len(req.prompt_ids) / total  # by prompt tokens
            req.length = len(req.prompt_ids)
            self._append(req, tok, lp, t1)
            if not req.done.is_set():
                self.running.append(req)

    def _append(self, req: GenRequest, tok: int, lp: float, now: float) -> None:
        if req.first_token_at is None:
            req.first_token_at = now
        if tok == self.eos_id:
            self._finish(req)
            return
        req.tokens.append(tok)
        req.logprobs.append(lp)
        if len(req.tokens) >= req.max_new_tokens or req.length + 1 >= self.executor.cfg.max_len:
            self._finish(req)

    def _decode(self) -> None:
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
        self.scheduler.on_step(t1 - t0)
        share = (t1 - t0) / len(batch)  # one token each: equal shares of the step
        for r, tok, lp in zip(batch, toks, lps):
            r.device_s += share
            r.length += 1
            self._append(r, tok, lp, t1)
        self.running = [r for r in batch if not r.done.is_set()]
