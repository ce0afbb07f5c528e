"""Load generator: Poisson or bursty arrivals, a task mix, sticky users, client-side RUM.

Arrival processes and request synthesis are pure (seeded ``random.Random`` in, values
out). :func:`run_traffic` sends them to a worker over HTTP from a thread pool, measures
the client-side end-to-end time with ``perf_counter``, emits a ``rum`` event per
response and appends a ground-truth record per request to a ledger the labeler reads.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ablab.inference import tasks
from ablab.inference.serving import events as ev


@dataclass(frozen=True)
class TrafficConfig:
    rate: float = 5.0  # mean requests/s
    duration_s: float = 10.0
    pattern: str = "poisson"  # poisson | bursty
    burst_factor: float = 5.0  # rate multiplier inside a burst
    burst_fraction: float = 0.2  # share of time spent in bursts
    burst_period_s: float = 5.0
    users: int = 200
    mix: dict[str, float] = field(default_factory=lambda: {d: 1.0 for d in tasks.DOMAINS})
    seed: int = 7

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate: must be > 0, got {self.rate}")
        if self.pattern not in ("poisson", "bursty"):
            raise ValueError(f"pattern: {self.pattern!r} is not 'poisson' or 'bursty'")
        unknown = set(self.mix) - set(tasks.DOMAINS)
        if unknown:
            raise ValueError(f"mix: unknown domains {sorted(unknown)}; known: {tasks.DOMAINS}")


def arrival_times(cfg: TrafficConfig, rng: random.Random) -> Iterator[float]:
    """Offsets (s) from the start. Bursty keeps the mean rate: λ_hi in bursts, λ_lo between."""
    t = 0.0
    if cfg.pattern == "poisson":
        while True:
            t += rng.expovariate(cfg.rate)
            if t >= cfg.duration_s:
                return
            yield t
    f, k = cfg.burst_fraction, cfg.burst_factor
    lo = cfg.rate / (f * k + (1 - f))
    hi = lo * k
    while True:  # thinning of a piecewise-constant rate
        t += rng.expovariate(hi)
        if t >= cfg.duration_s:
            return
        in_burst = (t % cfg.burst_period_s) < f * cfg.burst_period_s
        if in_burst or rng.random() < lo / hi:
            yield t


@dataclass(frozen=True)
class PlannedRequest:
    at: float
    unit_id: str
    domain: str
    prompt: str
    answer: str


def plan_requests(cfg: TrafficConfig, *, split: tasks.Split = "heldout") -> list[PlannedRequest]:
    """Sticky users: a Zipf-like user popularity, each user keeps a favourite domain."""
    rng = random.Random(cfg.seed)
    users = [f"user-{i}" for i in range(cfg.users)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(cfg.users)]
    domains, mix_w = zip(*cfg.mix.items())
    favourite = {u: rng.choices(domains, mix_w)[0] for u in users}
    planned = []
    for at in arrival_times(cfg, rng):
        user = rng.choices(users, weights)[0]
        domain = favourite[user] if rng.random() < 0.7 else rng.choices(domains, mix_w)[0]
        ex = tasks.sample(domain, rng, split=split)
        planned.append(PlannedRequest(at, user, domain, ex.text, ex.answer))
    return planned


@dataclass
class TrafficResult:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    shed: int = 0  # of failed: refused with 503 by a worker shedding load (batching.shed_late)
    correct: int = 0
    rum_ms: list[float] = field(default_factory=list)


def run_traffic(
    *, worker_url: str, cfg: TrafficConfig, sink: ev.EventSink, ledger: Path | None = None, concurrency: int = 32, timeout_s: float = 60.0
) -> TrafficResult:
    import httpx

    planned = plan_requests(cfg)
    result = TrafficResult()
    lock = threading.Lock()
    if ledger:
        ledger.parent.mkdir(parents=True, exist_ok=True)
    ledger_file = ledger.open("a") if ledger else None
    client = httpx.Client(base_url=worker_url.rstrip("/"), timeout=timeout_s)

    def send(p: PlannedRequest) -> None:
        t0 = time.perf_counter()
        try:
            r = client.post("/v1/infer", json={"unit_id": p.unit_id, "prompt": p.prompt, "domain": p.domain})
            e2e_ms = (time.perf_counter() - t0) * 1000
            body = r.json()
            ok = r.status_code == 200
        except Exception:  # the worker is down or slow: counted, not fatal
            with lock:
                result.failed += 1
            return
        with lock:
            result.sent += 1
            if not ok:
                result.failed += 1
                result.shed += int(r.status_code == 503)
                return
            result.ok += 1
            result.rum_ms.append(e2e_ms)
            result.correct += int(body["output"].strip() == p.answer)
            sink.emit(ev.rum_event(trace_id=body["trace_id"], e2e_ms=e2e_ms, experiment=body.get("experiment"), variant=body.get("variant"), unit_id=p.unit_id))
            if ledger_file:
                ledger_file.write(json.dumps({**asdict(p), "trace_id": body["trace_id"], "output": body["output"], "served_at": time.time()}) + "\n")
                ledger_file.flush()

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for p in planned:
            delay = start + p.at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, p)
    client.close()
    if ledger_file:
        ledger_file.close()
    return result
