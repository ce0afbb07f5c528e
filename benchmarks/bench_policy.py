"""Benchmark one policy decision in-process (issue 33: ≤ 20 µs median).

A decision is what the gateway and the SDK will call per request: features → (arm,
propensity, model version, probability vector), ``Decider.decide``. Timed call by call
(``perf_counter_ns`` around each call, the timer's own median cost subtracted), over
requests with varied features, for:

- ``slo_router``: the simulated environment's router (3 arms, prompt_tokens + attr.plan)
  with a model fitted on 6,000 uniform requests;
- ``slo_router`` before its model (uniform);
- ``rule``: three rules on prompt_tokens and attr.plan, with an exploration floor;
- and, for scale, the model fit and a 100 k-request ``probability_matrix`` (OPE's path).

Usage: .venv/bin/python benchmarks/bench_policy.py [--calls 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from ablab.platform.policy.evaluate import Decider
from ablab.platform.policy.simulate import Environment, fit_after_exploring, router_policy
from ablab.platform.policy.spec import parse_policy


def _timer_cost(n: int) -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = clock()
        samples.append(clock() - t0)
    return float(statistics.median(samples))


def bench(name: str, decider: Decider, features: list[dict[str, object]], keys: list[str], overhead: float) -> None:
    clock = time.perf_counter_ns
    decide = decider.decide
    for f, k in zip(features[:2000], keys[:2000]):  # warm caches
        decide(f, k)
    samples = np.empty(len(features))
    for i, (f, k) in enumerate(zip(features, keys)):
        t0 = clock()
        decide(f, k)
        samples[i] = clock() - t0
    samples = np.maximum(samples - overhead, 0) / 1000.0
    print(f"{name:28s} median {np.median(samples):6.2f} µs   p99 {np.quantile(samples, 0.99):6.2f} µs   "
          f"mean {samples.mean():6.2f} µs   ({len(samples):,} calls)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()
    env = Environment()
    rng = np.random.default_rng(0)
    pts = rng.integers(0, 4000, args.calls)
    plans = rng.choice(["free", "pro", "team"], args.calls)
    features = [{"prompt_tokens": int(p), "attr.plan": str(q), "max_tokens": 256} for p, q in zip(pts, plans)]
    keys = [f"trace-{i:012d}" for i in range(args.calls)]
    overhead = _timer_cost(100_000)
    print(f"load average {os.getloadavg()[0]:.2f}; timer cost {overhead:.0f} ns (subtracted)")
    router = router_policy(env)
    t0 = time.perf_counter()
    model = fit_after_exploring(router, env)
    print(f"model fit on 6,000 requests (simulation included): {1000 * (time.perf_counter() - t0):.1f} ms; "
          f"{model.binning.n_cells} cells, version {model.version}")
    rule = parse_policy({"kind": "rule", "arms": {a: {} for a in env.arms}, "explore": 0.02, "default": "helpful",
                         "rules": [{"when": {"prompt_tokens": {"gt": 1000}}, "arm": "fast"},
                                   {"when": {"attr.plan": {"in": ["pro", "team"]}, "prompt_tokens": {"le": 600}}, "arm": "expert"},
                                   {"when": {"attr.plan": {"eq": "free"}}, "arm": "helpful"}]})
    bench("slo_router (fitted model)", Decider(router, model, salt="bench"), features, keys, overhead)
    bench("slo_router (no model yet)", Decider(router, None, salt="bench"), features, keys, overhead)
    bench("rule (3 rules, explore)", Decider(rule, salt="bench"), features, keys, overhead)
    cols = {"prompt_tokens": pts[:100_000].astype(float), "attr.plan": np.asarray(plans[:100_000], dtype=object)}
    t0 = time.perf_counter()
    Decider(router, model).probability_matrix(cols, 100_000)
    print(f"probability_matrix, 100,000 logged requests: {1000 * (time.perf_counter() - t0):.1f} ms")


if __name__ == "__main__":
    main()
