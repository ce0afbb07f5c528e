"""Shadow isolation: the primary's latency with and without shadows that hang, error or are
10× slower, side by side in one run, and every dropped or failed shadow counted.

Processes: the primary backend and the candidate (shadow) backend are two scripted OpenAI
servers (``ablab.platform.gateway.scripted``); one ``ablab gateway`` process per target, each
with its own assignment config (a one-variant experiment) and outbox; the client in another
process. Targets, measured in interleaved rounds after a warm-up (the machine's noise hits all):

- ``none`` and ``none-bis``: no shadow, twice: their difference is the run's own noise (A/A);
- ``hang``: the shadow's backend accepts and never answers (its ``timeout_s`` ends it);
- ``error``: it answers HTTP 500 to every request;
- ``slow10x``: it answers like the primary's backend, 10× slower (the primary's answer is
  ``--tokens`` chunks ``--chunk-ms`` apart, the shadow's ``10 × --chunk-ms`` apart);
- the same three with ``--beside`` also launched beside the primary instead of after it.

Each shadow has ``--fraction``, ``--cap`` (max_concurrency) and ``--timeout-s``. Per target:
TTFT and e2e p50 / p99 as the client sees them, with bootstrap 95 % intervals; responses lost
(not 200, or a stream without ``[DONE]``); the gateway's CPU per request; and the shadow ledger:
requests the fraction chose (recomputed from the returned trace ids), sent and dropped
(``/metrics``), ok and failed by reason, against the events in the outbox (primaries marked
``sent``/``dropped``, shadow events by error).

    .venv/bin/python benchmarks/bench_shadow.py --levels 1,16 --requests 400 --rounds 4 [--beside]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_gateway import _has_content, cpu_seconds, free_port, spawn, wait_up

MSGS = [{"role": "user", "content": "Say hello."}]
KINDS = {"hang": "hang", "error": "http500"}  # the candidate's script per kind; slow10x: sleep-<10 × chunk ms>


# --- processes -------------------------------------------------------------------------


def serve_gateway(port: int, primary_url: str, candidate_url: str, outbox: str, shadow_json: str, launch: str) -> None:
    import uvicorn

    from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.settings import Backend, GatewaySettings
    from ablab.platform.sdk import AblabClient

    shadow = json.loads(shadow_json) or None
    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    sdk.config = AssignmentConfig(revision="1", experiments=(ExperimentSpec(
        key="bench", salt="bench", control="a", shadow=shadow, variants=(VariantSpec("a", 1.0, {}),)),))
    sdk._ready.set()
    settings = GatewaySettings(backends={"primary": Backend("primary", primary_url, timeout_s=300),
                                         "candidate": Backend("candidate", candidate_url, timeout_s=300)},
                               default_backend="primary", outbox_dir=Path(outbox), shadow_launch=launch)
    uvicorn.run(create_app(settings, sdk=sdk, ship=False), host="127.0.0.1", port=port, log_level="warning",
                access_log=False, loop="uvloop", http="httptools")


# --- the client ------------------------------------------------------------------------


async def one(client, url: str, model: str, unit: str) -> tuple[float, float, str, bool]:
    """(TTFT ms, e2e ms, trace id, complete): complete = 200 and the stream's ``[DONE]`` arrived."""
    body = {"model": model, "messages": MSGS, "stream": True, "user": unit}
    t0 = time.perf_counter()
    ttft = None
    tail = b""
    try:
        async with client.stream("POST", url + "/chat/completions", json=body) as r:
            trace = r.headers.get("x-ablab-trace-id", "")
            async for chunk in r.aiter_raw():
                if ttft is None and _has_content(chunk):
                    ttft = time.perf_counter() - t0
                tail = (tail + chunk)[-64:]
            ok = r.status_code == 200 and b"data: [DONE]" in tail
    except Exception:
        return float("nan"), float("nan"), "", False
    e2e = time.perf_counter() - t0
    return (ttft if ttft is not None else e2e) * 1000, e2e * 1000, trace, ok


async def measure(targets: dict[str, str], model: str, concurrency: int, requests: int, rounds: int) -> dict[str, list]:
    import httpx

    results: dict[str, list] = {name: [] for name in targets}
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for name, url in targets.items():  # warm-up: connections, caches (traces kept for the ledger)
            warm = await asyncio.gather(*(one(client, url, model, f"w{i}") for i in range(min(concurrency, 8))))
            results[name].extend(("warm", *w) for w in warm)
        per_round = max(concurrency, requests // rounds)
        for r in range(rounds):
            for name, url in targets.items():
                queue = list(range(per_round))

                async def worker() -> None:
                    while queue:
                        i = queue.pop()
                        results[name].append(("run", *(await one(client, url, model, f"u{r}-{i}"))))

                await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


# --- figures ---------------------------------------------------------------------------


def pct(values: np.ndarray, q: float) -> float:
    return float(np.quantile(values, q, method="inverted_cdf"))


def boot_ci(values: np.ndarray, q: float, rng: np.random.Generator, n: int = 2000) -> tuple[float, float]:
    idx = rng.integers(0, len(values), size=(n, len(values)))
    stats = np.quantile(values[idx], q, axis=1, method="inverted_cdf")
    return float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))


def metrics_of(url: str) -> dict[tuple[str, ...], float]:
    import httpx

    out: dict[tuple[str, ...], float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("ablab_gateway_shadow") and "{" in line:
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            pairs = tuple(p.split("=", 1)[1].strip('"') for p in labels.split(","))
            out[(name, *pairs)] = float(value)
    return out


def outbox_events(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def ledger(name: str, url: str, outbox: Path, rows: list, fraction: float, wait_s: float) -> dict:
    """Chosen (recomputed), sent/dropped/ok/failed (/metrics), and the outbox's events, once no
    shadow is in flight (a hung one ends at its timeout)."""
    from ablab.platform.gateway.shadow import chosen

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        m = metrics_of(url)
        if not any(v for k, v in m.items() if k[0] == "ablab_gateway_shadow_inflight"):
            break
        time.sleep(0.25)
    m = metrics_of(url)
    traces = [r[3] for r in rows if r[3]]
    events = [e for e in outbox_events(outbox) if e["type"] == "inference"]
    shadows = [e for e in events if e.get("shadow_of")]
    primaries = [e for e in events if not e.get("shadow_of")]
    failed_by: dict[str, int] = {}
    for s in shadows:
        if s["error"]:
            failed_by[s["error"]] = failed_by.get(s["error"], 0) + 1
    return {
        "requests": len(rows), "chosen": sum(chosen(t, "bench", fraction) for t in traces) if fraction else 0,
        "sent": m.get(("ablab_gateway_shadows_total", "bench", "sent"), 0.0),
        "dropped": m.get(("ablab_gateway_shadows_total", "bench", "dropped"), 0.0),
        "ok": m.get(("ablab_gateway_shadows_total", "bench", "ok"), 0.0),
        "failed": m.get(("ablab_gateway_shadows_total", "bench", "failed"), 0.0),
        "failed_by_reason": {k[2]: v for k, v in m.items() if k[0] == "ablab_gateway_shadow_failures_total"},
        "inflight_at_end": sum(v for k, v in m.items() if k[0] == "ablab_gateway_shadow_inflight"),
        "events": {"primaries": len(primaries), "primary_sent": sum(e.get("shadow") == "sent" for e in primaries),
                   "primary_dropped": sum(e.get("shadow") == "dropped" for e in primaries),
                   "shadow_events": len(shadows), "shadow_ok": sum(not s["error"] for s in shadows),
                   "shadow_failed_by_error": failed_by},
    }


STATS = ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")


def report(level: int, results: dict[str, list], cpu_ms: dict[str, float], rng: np.random.Generator) -> list[dict]:
    """Percentiles with bootstrap intervals per target, then each against the no-shadow band:
    the span of the ``none`` and ``none-bis`` intervals (where a no-shadow gateway landed in
    this run). ``in``: the target's interval overlaps the band (within the run's noise);
    ``below``: entirely under it (faster); ``ABOVE``: entirely over it (the shadows cost the
    primary time)."""
    rows = []
    print(f"\n{level} concurrent streams (ms; [95 % bootstrap interval])")
    print(f"{'target':16} {'n':>5} {'lost':>4} {'TTFT p50':>22} {'TTFT p99':>22} {'e2e p50':>22} {'e2e p99':>22} {'CPU ms/req':>10}")
    for name, vals in results.items():
        run = [v for v in vals if v[0] == "run"]
        lost = sum(not v[4] for v in vals)
        ttft = np.array([v[1] for v in run if v[4]])
        e2e = np.array([v[2] for v in run if v[4]])
        row = {"target": name, "n": len(run), "lost": lost, "cpu_ms_per_req": cpu_ms.get(name)}
        cells = []
        for label, arr in (("ttft", ttft), ("e2e", e2e)):
            for q in (0.5, 0.99):
                p = pct(arr, q)
                lo, hi = boot_ci(arr, q, rng)
                row[f"{label}_p{int(q * 100)}"] = p
                row[f"{label}_p{int(q * 100)}_ci"] = (lo, hi)
                cells.append(f"{p:7.2f} [{lo:6.2f},{hi:6.2f}]")
        cpu = f"{cpu_ms[name]:10.2f}" if name in cpu_ms else ""
        print(f"{name:16} {len(run):5d} {lost:4d} {' '.join(f'{c:>22}' for c in cells)} {cpu}")
        rows.append(row)
    base = [r for r in rows if r["target"] in ("none", "none-bis")]
    if base:
        band = {k: (min(r[k + "_ci"][0] for r in base), max(r[k + "_ci"][1] for r in base)) for k in STATS}
        print(f"\n{'':16} against the no-shadow band (none and none-bis intervals' span): difference of the estimate "
              "from none's; in = the interval overlaps the band, below / ABOVE = entirely under / over it")
        print(f"{'band':16} " + " ".join(f"{f'[{band[k][0]:.2f}, {band[k][1]:.2f}]':>22}" for k in STATS))
        for row in rows:
            row["within_noise"] = {k: _overlap(row[k + "_ci"], band[k]) for k in STATS}
            row["vs_band"] = {k: "in" if row["within_noise"][k] else ("below" if row[k + "_ci"][1] < band[k][0] else "ABOVE")
                              for k in STATS}
            delta = {k: row[k] - rows[0][k] for k in STATS}
            cells = [f"{delta[k]:+8.2f} {row['vs_band'][k]:>5}" for k in STATS]
            print(f"{row['target']:16} " + " ".join(f"{c:>22}" for c in cells))
    return rows


def verdict(levels: dict[int, list[dict]]) -> str:
    above = [f"{r['target']} {k} at {c}" for c, rows in levels.items() for r in rows for k, v in r.get("vs_band", {}).items()
             if v == "ABOVE"]
    lost = sum(r["lost"] for rows in levels.values() for r in rows)
    return (f"primary responses lost: {lost}; percentiles above the no-shadow band: "
            + (", ".join(above) if above else "none"))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--requests", type=int, default=400, help="Requests per target per level.")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16, help="Content chunks per answer.")
    ap.add_argument("--chunk-ms", type=float, default=2.0, help="The primary's backend: ms between chunks (10× for slow10x).")
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--cap", type=int, default=8, help="The shadow's max_concurrency.")
    ap.add_argument("--timeout-s", type=float, default=5.0, help="The shadow's timeout_s.")
    ap.add_argument("--beside", action="store_true", help="Also the three shadows launched beside the primary.")
    ap.add_argument("--json", type=Path, help="Write all figures here.")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    procs: list[subprocess.Popen] = []
    out: dict = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "uptime_before": _uptime()},
                 "command": " ".join(sys.argv), "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    py, me = sys.executable, str(Path(__file__).resolve())
    rng = np.random.default_rng(7)
    primary_model = f"sleep-{args.chunk_ms:g}"
    try:
        urls = {}
        for role in ("primary", "candidate"):
            port = free_port()
            p = spawn([py, me, "--serve-scripted", str(port), str(args.tokens)], tmp / f"{role}.log")
            procs.append(p)
            urls[role] = f"http://127.0.0.1:{port}/v1"
            wait_up(urls[role] + "/models", p, tmp / f"{role}.log")

        def shadow(kind: str) -> dict:
            model = KINDS.get(kind) or f"sleep-{10 * args.chunk_ms:g}"
            return {"strategy": {"backend": "candidate", "model": model}, "fraction": args.fraction,
                    "max_concurrency": args.cap, "timeout_s": args.timeout_s}

        plan: dict[str, tuple[dict | None, str]] = {"none": (None, "after"), "none-bis": (None, "after")}
        for kind in ("hang", "error", "slow10x"):
            plan[kind] = (shadow(kind), "after")
        if args.beside:
            for kind in ("hang", "error", "slow10x"):
                plan[f"{kind}-beside"] = (shadow(kind), "beside")
        targets, pids, outboxes = {}, {}, {}
        for name, (spec, launch) in plan.items():
            port = free_port()
            outboxes[name] = tmp / f"outbox-{name}"
            p = spawn([py, me, "--serve-gateway", str(port), urls["primary"], urls["candidate"], str(outboxes[name]),
                       json.dumps(spec), launch], tmp / f"gateway-{name}.log")
            procs.append(p)
            pids[name] = p.pid
            targets[name] = f"http://127.0.0.1:{port}/v1"
            wait_up(f"http://127.0.0.1:{port}/healthz", p, tmp / f"gateway-{name}.log")
        out["plan"] = {k: {"shadow": v[0], "launch": v[1]} for k, v in plan.items()}
        all_rows: dict[str, list] = {name: [] for name in targets}
        out["levels"] = {}
        for c in [int(x) for x in args.levels.split(",")]:
            cpu0 = {n: cpu_seconds(pid) for n, pid in pids.items()}
            res = asyncio.run(measure(targets, primary_model, c, max(args.requests, c * 4), args.rounds))
            cpu_ms = {n: (cpu_seconds(pid) - cpu0[n]) * 1000 / max(1, len(res[n])) for n, pid in pids.items()}
            out["levels"][c] = report(c, res, cpu_ms, rng)
            for n, rows in res.items():
                all_rows[n].extend(rows)
        print("\n" + verdict(out["levels"]))
        print(f"\nshadow ledger (fraction {args.fraction}, cap {args.cap}, timeout {args.timeout_s} s): "
              "chosen = recomputed from the returned trace ids; sent/dropped/ok/failed from /metrics; events from the outbox")
        print(f"{'target':16} {'requests':>8} {'chosen':>7} {'sent':>6} {'dropped':>7} {'ok':>6} {'failed':>6}  "
              f"{'ev: sent':>8} {'dropped':>7} {'shadows':>7}  failed by reason")
        out["ledger"] = {}
        for name, url in targets.items():
            base = url.removesuffix("/v1")
            led = ledger(name, base, outboxes[name], all_rows[name], plan[name][0]["fraction"] if plan[name][0] else 0.0,
                         wait_s=args.timeout_s + 10)
            out["ledger"][name] = led
            ev = led["events"]
            print(f"{name:16} {led['requests']:8d} {led['chosen']:7d} {led['sent']:6.0f} {led['dropped']:7.0f} {led['ok']:6.0f} "
                  f"{led['failed']:6.0f}  {ev['primary_sent']:8d} {ev['primary_dropped']:7d} {ev['shadow_events']:7d}  "
                  f"{led['failed_by_reason'] or ''}")
            led["balanced"] = (led["chosen"] == led["sent"] + led["dropped"] and led["sent"] == led["ok"] + led["failed"]
                               and ev["primary_sent"] == led["sent"] and ev["primary_dropped"] == led["dropped"]
                               and ev["shadow_events"] == led["sent"] and led["inflight_at_end"] == 0)
        print("every chosen request is sent or dropped, every sent one ends ok or failed, and the events say the same: "
              + ("yes" if all(v["balanced"] for v in out["ledger"].values()) else
                 "NO: " + ", ".join(k for k, v in out["ledger"].items() if not v["balanced"])))
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    out["machine"]["load_after"] = os.getloadavg()
    out["machine"]["uptime_after"] = _uptime()
    print(f"\nuptime before: {out['machine']['uptime_before']}\nuptime after:  {out['machine']['uptime_after']}; cpus {os.cpu_count()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return f"load average {os.getloadavg()}"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-scripted":
        from bench_gateway import serve_scripted

        serve_scripted(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-gateway":
        serve_gateway(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7])
    else:
        main()
