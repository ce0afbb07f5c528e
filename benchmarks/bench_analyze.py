"""Benchmark the stats engine's two entry points.

1. ``ablab analyze`` on a 1 M-row Parquet event file, end to end (a fresh process:
   imports, read, validate, aggregate, engine, JSON) — goal ≤ 3 s.
2. Results for an experiment with 10 M raw events in ClickHouse (chDB through
   clickhouse-connect): the per-unit GROUP BY, two histogram queries, exposures and the
   engine — goal ≤ 2 s. Timed on the API's path (the per-unit rollup ``unit_stats`` of
   migration 0006, which the loader maintains; filled here from the raw events as the
   migration does for a pre-existing store), the rollup step of a loader batch, and the
   raw scan with and without ``FINAL`` for comparison.
3. The same store with three custom metrics (a judge score, a measure per user, a ratio)
   and a breakdown by ``dims.domain`` (5 values): the raw scan of the per-unit plan
   (``ablab.platform.stats.unit_agg``), with and without ``FINAL`` — goal ≤ 2 s.

Usage: .venv/bin/python benchmarks/bench_analyze.py [--rows 1000000] [--store-rows 10000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ablab.platform.analytics.event_files import write_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events

ABLAB = str(Path(sys.executable).with_name("ablab"))
SPEC = spec_dict(
    slos={"ttft_ms": 200, "tpot_ms": 25},
    guardrails=[{"metric": "ttft_ms_p95", "max": 400}, {"metric": "accuracy", "margin": 0.02}],
)
# three experiment-defined metrics (a judge score, a custom measure per user, a ratio) and a
# breakdown by one dimension with 5 values
CUSTOM = [
    {"name": "judge_score", "type": "mean", "column": "score"},
    {"name": "tools_per_user", "type": "mean", "column": "measures.tool_calls", "aggregation": "unit_mean"},
    {"name": "cost_per_1k_out", "type": "ratio", "numerator": "cost_usd", "denominator": "output_tokens", "scale": 1000},
]


def custom_spec(base: dict) -> dict:
    metrics = dict(base.get("metrics") or {})
    return {**base, "metrics": {**metrics, "custom": CUSTOM, "segments": ["dims.domain"]}}


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # chDB runs inside this process
    return r.ru_utime + r.ru_stime


def bench_cli(rows: int, repeat: int, work: Path) -> None:
    # ~1.29 events per request (labels for 20 %, one exposure per user): size the file to `rows` events
    requests = int(rows / 1.29)
    events = synthetic_events(n_requests=requests, n_units=max(requests // 10, 10), seed=1)
    events = events.iloc[:rows]
    path = write_events(events, work / "events.parquet")
    cfg = work / "exp.yaml"
    cfg.write_text(yaml.safe_dump(SPEC))
    times, cpu = [], []
    for _ in range(repeat):
        c0 = _child_cpu()
        t = time.perf_counter()
        out = subprocess.run([ABLAB, "analyze", str(path), "--config", str(cfg), "--json"], capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        cpu.append(_child_cpu() - c0)
        if out.returncode:
            raise SystemExit(out.stderr)
    result = json.loads(out.stdout)
    c0 = _child_cpu()
    help_t = time.perf_counter()
    subprocess.run([ABLAB, "--help"], capture_output=True)
    help_t, help_cpu = time.perf_counter() - help_t, _child_cpu() - c0
    print(f"[cli] ablab analyze on {len(events):,} rows ({path.stat().st_size / 2**20:.1f} MiB parquet): "
          f"wall median {statistics.median(times):.2f} s (min {min(times):.2f}), CPU median {statistics.median(cpu):.2f} s "
          f"over {repeat} runs; `ablab --help` alone: wall {help_t:.2f} s, CPU {help_cpu:.2f} s; "
          f"load avg {os.getloadavg()[0]:.1f}; metrics rows {len(result['metrics'])}")


INSERT_INFERENCE = """
INSERT INTO raw_events (event_id, type, ts, trace_id, experiment, variant, unit_id, ttft_ms, e2e_ms, tpot_ms,
                        output_tokens, cost_usd, price_version, error, strategy, source, payload, kafka_partition, kafka_offset,
                        measures, dims)
SELECT concat('i', toString(number)), 'inference',
       toDateTime64('2026-12-01 00:00:00', 3, 'UTC') + toIntervalMillisecond(intDiv(number * {span_ms:UInt64}, {n:UInt64})),
       concat('t', toString(number)), 'bench', if(u % 2 = 0, 'control', 'compressed'), concat('u', toString(u)),
       120 * exp(randNormal(0, 0.35)) * if(u % 2 = 0, 1.0, 0.9) AS ttft,
       ttft + 40 * 18 * exp(randNormal(0, 0.2)) * if(u % 2 = 0, 1.0, 0.9),
       18 * exp(randNormal(0, 0.2)) * if(u % 2 = 0, 1.0, 0.9), 41,
       0.0001 * exp(randNormal(0, 0.3)), 'p1', if(rand() % 100 = 0, 'timeout', NULL), '{{}}', '', '', 0, number,
       map('tool_calls', toFloat64(rand() % 5), 'steps', toFloat64(1 + rand() % 9)),
       map('domain', concat('d', toString(cityHash64(number, 3) % 5)))
FROM (SELECT number, cityHash64(number, 7) % {units:UInt64} AS u FROM numbers({n:UInt64}))
"""
INSERT_FEEDBACK = """
INSERT INTO raw_events (event_id, type, ts, trace_id, experiment, variant, unit_id, correct, score, price_version,
                        strategy, source, payload, kafka_partition, kafka_offset)
SELECT concat('f', toString(number)), 'feedback', toDateTime64('2026-12-01 01:00:00', 3, 'UTC'),
       concat('t', toString(number)), '', '', '', toUInt8(rand() % 100 < 80), (rand() % 1000) / 100, '', '',
       'judge', '', 0, number
FROM numbers({n:UInt64}) WHERE number % {every:UInt64} = 0
"""
INSERT_EXPOSURE = """
INSERT INTO raw_events (event_id, type, ts, trace_id, experiment, variant, unit_id, price_version, strategy,
                        source, payload, kafka_partition, kafka_offset)
SELECT concat('x', toString(number)), 'exposure', toDateTime64('2026-12-01 00:00:00', 3, 'UTC'), '', 'bench',
       if(number % 2 = 0, 'control', 'compressed'), concat('u', toString(number)), '', '', '', '', 0, number
FROM numbers({units:UInt64})
"""


def _loader_batch(n: int, units: int, seed: int) -> list[tuple]:
    """``n`` raw inference rows in the loader's column order (RAW_COLUMNS), on ``units`` users."""
    import random
    from datetime import UTC, datetime, timedelta

    from ablab.streaming.loader.rows import RAW_COLUMNS

    rng = random.Random(seed)
    base = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    # by name, so a column the loader adds or moves cannot shift the values
    fixed = {"type": "inference", "experiment": "bench", "tpot_ms": 18.0, "prompt_tokens": 10, "output_tokens": 41,
             "device_s": 0.1, "cost_usd": 0.0001, "price_version": "p1", "strategy": "{}", "source": "", "payload": "",
             "measures": {}, "dims": {}, "kafka_partition": 0, "shadow_of": "", "shadow": ""}
    rows = []
    for i in range(n):
        u = rng.randrange(units)
        ttft = 120 * rng.lognormvariate(0, 0.35)
        row = {**fixed, "event_id": f"b{seed}-{i}", "ts": base + timedelta(milliseconds=i), "trace_id": f"bt{seed}-{i}",
               "variant": "control" if u % 2 == 0 else "compressed", "unit_id": f"u{u}", "ttft_ms": ttft,
               "e2e_ms": ttft + 700, "kafka_offset": i}
        rows.append(tuple(row.get(c) for c in RAW_COLUMNS))
    return rows


def bench_store(rows: int, repeat: int, work: Path, *, raw: bool = True, hours: int = 1) -> None:
    from ablab.platform.analytics.results import results, results_from_raw
    from ablab.streaming.loader.rows import RAW_COLUMNS
    from ablab.streaming.store import apply_ddl, make_client, rollup
    from ablab.streaming.store.reads import StoreReads
    from ablab.streaming.store.rollup import sync as sync_rollup

    client = make_client(f"chdb:///{work / 'chdb'}")
    apply_ddl(client)
    reads = StoreReads(client)  # results read the store through its port, as the API does
    units = 100_000
    # 85 % inference, 15 % labels (every 6th request is labelled, late), plus one exposure per user
    n_inf = int((rows - units) / (1 + 1 / 5.67))
    t = time.perf_counter()
    # the requests spread evenly over `hours` (what a rollup kept per unit and time is sensitive to)
    client.command(INSERT_INFERENCE, parameters={"n": n_inf, "units": units, "span_ms": hours * 3_600_000})
    client.command(INSERT_FEEDBACK, parameters={"n": n_inf, "every": 6})
    client.command(INSERT_EXPOSURE, parameters={"units": units})
    client.command("OPTIMIZE TABLE raw_events FINAL")
    total = client.query("SELECT count() FROM raw_events").result_rows[0][0]
    print(f"[store] loaded {total:,} raw events into chDB in {time.perf_counter() - t:.1f} s "
          f"({n_inf:,} inference, {units:,} users, over {hours} h)")
    spec = parse_spec({**SPEC, "key": "bench"})
    # the events went straight into raw_events (not through the loader): copy them into the
    # rollup's lookup tables as migration 0006 does, then let the first read compute every unit
    t = time.perf_counter()
    rollup.backfill_from_raw(client)
    print(f"[rollup] backfilled unit_events/trace_facts from raw in {time.perf_counter() - t:.1f} s (one-off)")
    t = time.perf_counter()
    repaired = sync_rollup(client, spec)
    print(f"[rollup] maintenance step computed {repaired['missing']:,} units in {time.perf_counter() - t:.1f} s (one-off)")
    times, cpu = [], []
    for _ in range(repeat):
        c0 = _self_cpu()
        t = time.perf_counter()
        result = results(reads, spec).model_dump(mode="json")  # what GET /v1/experiments/{key}/results runs: SLO check + rollup read + engine
        times.append(time.perf_counter() - t)
        cpu.append(_self_cpu() - c0)
    print(f"[rollup] results for {total:,} events (API path: SLO check + unit_stats read + engine): "
          f"wall median {statistics.median(times):.2f} s (min {min(times):.2f}), CPU median {statistics.median(cpu):.2f} s "
          f"over {repeat} runs; load avg {os.getloadavg()[0]:.1f}; decision {result['decisions'][0]['decision']}")
    # what one loader batch costs the rollup on this store: 2,000 new requests from 1,000 users,
    # each user's unit row recomputed from all of its (~85) requests
    for seed in range(1, 1 + min(repeat, 3)):
        batch = _loader_batch(2_000, 1_000, seed)
        client.insert("raw_events", batch, column_names=list(RAW_COLUMNS))
        c0 = _self_cpu()
        t = time.perf_counter()
        done = rollup.feed(client, batch)
        print(f"[loader] rollup step of a 2,000-event batch ({done['bench']:,} units recomputed): "
              f"wall {time.perf_counter() - t:.2f} s, CPU {_self_cpu() - c0:.2f} s; load avg {os.getloadavg()[0]:.1f}")
    t = time.perf_counter()
    result = results(reads, spec).model_dump(mode="json")
    print(f"[rollup] results after those batches: wall {time.perf_counter() - t:.2f} s; load avg {os.getloadavg()[0]:.1f}")
    bench_custom(client, total, repeat)
    for final in (True, False) if raw else ():
        times, cpu = [], []
        for _ in range(repeat):
            c0 = _self_cpu()
            t = time.perf_counter()
            result = results_from_raw(reads, spec, final=final).model_dump(mode="json")
            times.append(time.perf_counter() - t)
            cpu.append(_self_cpu() - c0)
        e2e = next(r for r in result["metrics"] if r["metric"] == "e2e_ms" and r["variant"] != "control")
        print(f"[store] raw scan results for {total:,} events, FINAL={final}: wall median {statistics.median(times):.2f} s "
              f"(min {min(times):.2f}), CPU median {statistics.median(cpu):.2f} s over {repeat} runs; "
              f"load avg {os.getloadavg()[0]:.1f}; e2e_ms rel_diff {e2e['rel_diff']:+.4f}, "
              f"decision {result['decisions'][0]['decision']}")


def bench_custom(client, total: int, repeat: int) -> None:
    """Results with three custom metrics and a 5-value segment breakdown: from the per-unit
    rollup (``unit_stats`` + ``unit_segment_stats``, what ``GET …/results`` reads), then the raw
    scan of the one per-unit plan side by side."""
    from ablab.platform.analytics.results import _analyze, aggregates, aggregates_from_raw
    from ablab.streaming.store.reads import StoreReads
    from ablab.streaming.store.rollup import sync as sync_rollup

    reads = StoreReads(client)
    spec = parse_spec(custom_spec({**SPEC, "key": "bench"}))
    sync_rollup(client, spec)
    times, cpu = [], []
    for _ in range(repeat):
        c0 = _self_cpu()
        t = time.perf_counter()
        agg = aggregates(reads, spec)
        result = _analyze(reads, spec, agg).model_dump(mode="json")
        times.append(time.perf_counter() - t)
        cpu.append(_self_cpu() - c0)
    print(f"[custom] results for {total:,} events, 3 custom metrics + dims.domain "
          f"({len(agg.segments['dims.domain'])} values), source={agg.source}: wall median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}), CPU median {statistics.median(cpu):.2f} s over {repeat} runs; "
          f"load avg {os.getloadavg()[0]:.1f}; {sum(len(s.get('rows', [])) for s in result.get('segments', []))} segment rows")
    rollup_rows = result
    for final in (True, False):
        times, cpu, agg_t = [], [], []
        for _ in range(repeat):
            c0 = _self_cpu()
            t = time.perf_counter()
            agg = aggregates_from_raw(reads, spec, final=final)
            agg_t.append(time.perf_counter() - t)
            try:
                result = _analyze(reads, spec, agg).model_dump(mode="json")
            except (KeyError, ValueError) as exc:  # an engine without custom metrics yet
                result = {"error": str(exc)}
            times.append(time.perf_counter() - t)
            cpu.append(_self_cpu() - c0)
        seg = agg.segments["dims.domain"]
        print(f"[custom] results for {total:,} events, 3 custom metrics + dims.domain ({len(seg)} values), FINAL={final}: "
              f"wall median {statistics.median(times):.2f} s (min {min(times):.2f}; aggregation alone median "
              f"{statistics.median(agg_t):.2f} s), CPU median {statistics.median(cpu):.2f} s over {repeat} runs; "
              f"load avg {os.getloadavg()[0]:.1f}; {sum(len(s.get('rows', [])) for s in result.get('segments', []))} segment rows"
              + (f"; engine: {result['error'][:80]}" if "error" in result else ""))
        if final and "error" not in result:  # the two paths give the same figures
            same = all(abs((a.get("estimate") or 0) - (b.get("estimate") or 0)) <= 1e-9 * max(1.0, abs(b.get("estimate") or 0))
                       for a, b in zip(rollup_rows["metrics"], result["metrics"], strict=True))
            print(f"[custom] rollup and raw scan estimates agree to 1e-9: {same}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--store-rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-store", action="store_true")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-raw", action="store_true", help="time only the rollup read on the store")
    ap.add_argument("--store-hours", type=int, default=1, help="hours the store's requests span")
    args = ap.parse_args()
    if args.store_hours < 1:
        ap.error("--store-hours must be at least 1")
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; load avg {os.getloadavg()[0]:.2f}")
    work = Path(tempfile.mkdtemp(prefix="ablab-bench-stats-"))
    try:
        if not args.skip_cli:
            bench_cli(args.rows, args.repeat, work)
        if not args.skip_store:
            bench_store(args.store_rows, args.repeat, work, raw=not args.skip_raw, hours=args.store_hours)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
