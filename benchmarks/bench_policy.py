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

``--gateway N``: instead, the gateway's CPU per request with a policy variant against a fixed
variant (issue goal: ≤ 1.1×). The scripted backend and the gateway (the real app, uvicorn, one
process, its outbox on) each run in their own process; this process sends N non-streamed chat
requests one at a time per round, alternating the two gateways round by round, and reads each
gateway process's CPU (user + system, ``/proc/<pid>/stat``) around its rounds. The policy is
the simulated router with its fitted model (the costliest decision: prompt-token estimate,
cell lookup, draw), arms differing by system prompt; the fixed variant serves one of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

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


# --------------------------------------------------------------------------- the gateway


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _serve_backend(port: int) -> None:
    from ablab.platform.gateway.scripted import ScriptedBackend

    backend = ScriptedBackend(tokens=8, port=port).start()
    while True:
        time.sleep(3600)
        del backend


def _serve_gateway(port: int, backend_url: str, strategy: dict[str, object], model: str | None, outbox: str) -> None:
    import json
    from pathlib import Path

    import uvicorn

    from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.settings import Backend, GatewaySettings
    from ablab.platform.sdk import AblabClient

    if os.environ.get("BENCH_POLICY_FAST_CHECK") == "1":
        _teach_fast_check()
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    spec = ExperimentSpec(key="bench", salt="bench-salt", control="v", variants=(VariantSpec("v", 1.0, strategy),))
    models = {("bench", "v"): json.loads(model)} if model else {}
    sdk.config = AssignmentConfig(experiments=(spec,), revision="1", policy_models=models)
    sdk._ready.set()
    settings = GatewaySettings(backends={"scripted": Backend("scripted", backend_url, timeout_s=10.0)},
                               default_backend="scripted", outbox_dir=Path(outbox))
    uvicorn.run(create_app(settings, sdk=sdk, ship=False), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


def _teach_fast_check() -> None:
    """``--fast-check``: what the outbox's fast acceptance check (gateway/event_check.py, when
    present) would cost if it knew the policy fields: it checks the event without them and the
    three fields as the models do (an estimate of that change, not the change itself)."""
    import re

    try:
        from ablab.platform.gateway import event_check
    except ImportError:
        return
    fast = event_check.fast_accepts
    arm_ok = re.compile(r"[a-z][a-z0-9_]{0,63}").fullmatch
    version_ok = re.compile(r"[A-Za-z0-9_.:\-]{1,128}").fullmatch

    def accepts(event: dict[str, object]) -> bool:
        if "arm" not in event and "propensity" not in event and "policy_version" not in event:
            return bool(fast(event))
        arm, p, version = event.get("arm"), event.get("propensity"), event.get("policy_version")
        ok = (arm is None or (type(arm) is str and arm_ok(arm) is not None)) and \
            (p is None or (type(p) is float and 0.0 < p <= 1.0)) and \
            (version is None or (type(version) is str and version_ok(version) is not None))
        rest = {k: v for k, v in event.items() if k not in ("arm", "propensity", "policy_version")}
        return ok and bool(fast(rest))

    event_check.fast_accepts = accepts


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_bench(n: int, rounds: int) -> None:
    import json
    import multiprocessing
    import tempfile

    import httpx

    env = Environment()
    router = router_policy(env)
    model = fit_after_exploring(router, env)
    policy = {"policy": router.model_dump(mode="json")}
    fixed = dict(router.arms["helpful"])
    ctx = multiprocessing.get_context("spawn")
    bport = _free_port()
    procs = [ctx.Process(target=_serve_backend, args=(bport,), daemon=True)]
    ports = {"fixed": _free_port(), "policy": _free_port()}
    tmp = tempfile.mkdtemp(prefix="bench-policy-")
    backend_url = f"http://127.0.0.1:{bport}/v1"
    procs.append(ctx.Process(target=_serve_gateway, args=(ports["fixed"], backend_url, fixed, None, f"{tmp}/fixed"), daemon=True))
    procs.append(ctx.Process(target=_serve_gateway, args=(ports["policy"], backend_url, policy, model.to_json(),
                                                          f"{tmp}/policy"), daemon=True))
    for p in procs:
        p.start()
    pids = {"fixed": procs[1].pid, "policy": procs[2].pid}
    rng = np.random.default_rng(1)
    bodies = [{"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "word " * int(k)}]}
              for k in rng.integers(5, 1500, n)]
    plans = rng.choice(["free", "pro", "team"], n)
    clients = {k: httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) for k, port in ports.items()}
    for client in clients.values():  # wait for both, then warm up
        for _ in range(600):
            try:
                if client.post("/v1/chat/completions", json=bodies[0], headers={"X-Ablab-Unit": "u"}).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        for i in range(300):
            client.post("/v1/chat/completions", json=bodies[i % n], headers={"X-Ablab-Unit": f"w{i}"})
    cpu = {k: 0.0 for k in clients}
    arms: dict[str, int] = {}
    for r in range(rounds):
        for name in (("fixed", "policy") if r % 2 == 0 else ("policy", "fixed")):
            client = clients[name]
            before = _cpu_s(pids[name])
            for i in range(n):
                resp = client.post("/v1/chat/completions", json=bodies[i],
                                   headers={"X-Ablab-Unit": f"u{i}", "X-Ablab-Attr-Plan": str(plans[i])})
                assert resp.status_code == 200, resp.text
            cpu[name] += _cpu_s(pids[name]) - before
    for path in sorted(__import__("pathlib").Path(f"{tmp}/policy").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e.get("type") == "inference" and e.get("arm"):
                arms[e["arm"]] = arms.get(e["arm"], 0) + 1
    total = n * rounds
    per = {k: 1e6 * v / total for k, v in cpu.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; {total:,} requests per gateway in {rounds} alternating rounds")
    print(f"gateway CPU per request: fixed variant {per['fixed']:.0f} µs, policy variant {per['policy']:.0f} µs "
          f"-> {per['policy'] / per['fixed']:.3f}x  (arms served: {arms}; model {model.version})")
    for p in procs:
        p.terminate()


def gateway_parts(n: int) -> None:
    """``--parts N``: the policy's own share of a gateway request, in-process (the app through
    httpx's ASGI transport, the scripted backend on a thread): thread CPU time
    (``thread_time_ns``) of the hook (``choose_arm``), the events' annotation and the outbox
    write, per request, for a policy and a fixed gateway, twice each."""
    import asyncio
    import json
    import tempfile
    from pathlib import Path

    import httpx

    from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
    from ablab.platform.gateway import policy_hook, serving
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.scripted import ScriptedBackend
    from ablab.platform.gateway.settings import Backend, GatewaySettings
    from ablab.platform.sdk import AblabClient

    router = router_policy()
    model = fit_after_exploring(router)
    acc: dict[str, int] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0) + time.thread_time_ns() - t
        return wrapper

    policy_hook.choose_arm = timed("choose_arm", policy_hook.choose_arm)  # serving.py imports them per call
    policy_hook.annotate = timed("annotate", policy_hook.annotate)
    serving.GatewayState.write_events = timed("write_events", serving.GatewayState.write_events)  # type: ignore[method-assign]  # timing wrapper
    backend = ScriptedBackend(tokens=8).start()
    rng = np.random.default_rng(1)
    bodies = [{"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "word " * int(k)}]}
              for k in rng.integers(5, 1500, n)]
    tmp = tempfile.mkdtemp(prefix="bench-policy-parts-")

    async def run(app: Any) -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            for i in range(min(300, n)):
                await client.post("/v1/chat/completions", json=bodies[i], headers={"X-Ablab-Unit": f"w{i}"})
            acc.clear()
            for i in range(n):
                r = await client.post("/v1/chat/completions", json=bodies[i],
                                      headers={"X-Ablab-Unit": f"u{i}", "X-Ablab-Attr-Plan": "pro"})
                assert r.status_code == 200, r.text

    print(f"load average {os.getloadavg()[0]:.2f}; {n:,} requests per run, thread CPU per request:")
    for k, which in enumerate(("fixed", "policy", "fixed", "policy")):
        strategy: dict[str, Any] = dict(router.arms["helpful"]) if which == "fixed" else {"policy": router.model_dump(mode="json")}
        models = {} if which == "fixed" else {("bench", "v"): json.loads(model.to_json())}
        sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
        spec = ExperimentSpec(key="bench", salt="s", control="v", variants=(VariantSpec("v", 1.0, strategy),))
        sdk.config = AssignmentConfig(experiments=(spec,), revision="1", policy_models=models)
        settings = GatewaySettings(backends={"scripted": Backend("scripted", backend.url, timeout_s=10.0)},
                                   default_backend="scripted", outbox_dir=Path(tmp) / f"{which}-{k}")
        asyncio.run(run(create_app(settings, sdk=sdk, ship=False)))
        print(f"  {which:7s}", "  ".join(f"{name} {v / n / 1000:.1f} µs" for name, v in acc.items()))
    backend.stop()


if __name__ == "__main__":
    import sys

    if "--parts" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--parts", type=int, default=3000)
        gateway_parts(ap.parse_args().parts)
    elif "--gateway" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--gateway", type=int, default=2000, help="requests per round")
        ap.add_argument("--rounds", type=int, default=4)
        ap.add_argument("--fast-check", action="store_true", help="see _teach_fast_check")
        a = ap.parse_args()
        if a.fast_check:
            os.environ["BENCH_POLICY_FAST_CHECK"] = "1"  # the spawned gateways read it
        gateway_bench(a.gateway, a.rounds)
    else:
        main()
