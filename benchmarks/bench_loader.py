"""The loader alone: Kafka (read_committed) → validate → chDB raw insert (+ per-unit rollup).

    .venv/bin/python benchmarks/bench_loader.py --requests 100000 --variants rollup,no-rollup,poll-only
    .venv/bin/python benchmarks/bench_loader.py --variants rollup --loaders 1,2
    .venv/bin/python benchmarks/bench_loader.py --variants rollup --units 1000
    .venv/bin/python benchmarks/bench_loader.py --variants rollup --batch-records 2000,5000,20000 --batch-s 60
    .venv/bin/python benchmarks/bench_loader.py --variants rollup,rollup-per-batch --units 500 --batch-records 5000

``--units`` sets how many users the requests come from: fewer units, longer histories (100,000
requests over 1,000 units is 100 requests per unit by the end of the drain), which the
rollup's per-unit recompute reads. ``--batch-records`` sets the loader's largest batch (a drain
of pre-filled topics fills it unless ``--batch-s``, the loader's longest batch, ends it first):
each batch pays a fixed cost per statement, so this shows what a live loader's batch length
is worth.

Pre-fills fresh topics with ``--requests`` requests' events (inference and RUM for each, a
label for ``--label-rate`` of them, i.e. ~2.5 events per request), then drains them with
each variant in turn, every one with its own consumer group and its own empty chDB store,
so the variants read the same records in one run on one machine:

- ``rollup``: the loader as the API runs it (raw insert, then the per-unit rollup, whose
  recompute and offset commit a checkpoint does for several batches at once);
- ``rollup-per-batch``: the same with ``rollup_interval_s=0``, a checkpoint after every batch
  (the loader before checkpoints);
- ``no-rollup``: raw insert only (what an external ClickHouse deployment without the
  rollup would do);
- ``poll-only``: consume and validate, insert nothing (the Kafka + validation ceiling).

``--loaders 1,2`` drains each variant with 1 and then 2 loaders in one consumer group
(threads of one process sharing the embedded store, each batching under its own lock as
separate processes against a ClickHouse server would).

Prints events/s and process CPU-seconds per 1,000 events for each, plus the ratios. The
loader runs in this process, so ``time.process_time`` covers chDB's work too.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import random
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

VARIANTS = ("rollup", "rollup-per-batch", "no-rollup", "poll-only")
DEFAULT_BATCH = 20_000  # the Loader's batch_max_records default


def _events(requests: int, *, units: int, label_rate: float, seed: int,
            interval_ms: float = 5.0) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Each request's inference and RUM event, a label for ``label_rate`` of them; request
    times ``interval_ms`` apart, ending before now."""
    rng = random.Random(seed)
    start = datetime.now(UTC) - timedelta(hours=1) - timedelta(milliseconds=requests * interval_ms)
    inference, rum, feedback = [], [], []
    for i in range(requests):
        trace = uuid.UUID(int=rng.getrandbits(128)).hex
        ts = (start + timedelta(milliseconds=i * interval_ms)).isoformat(timespec="milliseconds")
        ttft = rng.uniform(5, 100)
        e2e = ttft + rng.uniform(10, 1000)
        variant = "ab"[i % 2]
        inference.append(json.dumps({
            "v": 1, "type": "inference", "event_id": f"i-{trace}", "trace_id": trace, "ts": ts, "experiment": "bench",
            "variant": variant, "unit_id": f"u{rng.randrange(units)}", "ttft_ms": ttft, "e2e_ms": e2e, "tpot_ms": 2.5,
            "prompt_tokens": 100, "output_tokens": 20, "device_s": e2e / 1000, "cost_usd": 1e-5, "price_version": "p1",
            "strategy": "s",
        }, separators=(",", ":")).encode())
        rum.append(json.dumps({"v": 1, "type": "rum", "event_id": f"r-{trace}", "trace_id": trace, "ts": ts,
                               "e2e_ms": e2e + rng.uniform(1, 30)}, separators=(",", ":")).encode())
        if rng.random() < label_rate:
            feedback.append(json.dumps({"v": 1, "type": "feedback", "event_id": f"f-{trace}", "trace_id": trace,
                                        "ts": ts, "correct": int(rng.random() < 0.7), "source": "human"},
                                       separators=(",", ":")).encode())
    return inference, rum, feedback


def _fill(bootstrap: str, topics: dict[str, str], payloads: dict[str, list[bytes]], progress: Progress) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=512 * 1024,
                             compression_type="lz4")
    total = sum(map(len, payloads.values()))
    task = progress.add_task("pre-fill", total=total)
    for kind, values in payloads.items():
        for value in values:
            producer.send(topics[kind], value=value)
            progress.advance(task)
    producer.flush(timeout=300)
    producer.close()


def discard_batches(loader) -> None:
    """Make ``loader`` drop each batch instead of storing it: it still polls, validates and
    counts every record (``stats.consumed``), and commits nothing.

    Its run loop stores through ``_flush``; replacing the public ``flush`` instead (as this
    benchmark did until 2026-12-05) stored every batch after all."""
    def discard(*, checkpoint: bool = True) -> None:
        loader._discard_pending()
        loader.stats.batches += 1
    loader._flush = discard


def _drain(variant: str, loaders: int, batch: int, batch_s: float | None, bootstrap: str, topics: dict[str, str], total: int, home: str,
           consumed, out, profile: str | None = None) -> None:
    """One variant in its own process (chDB holds one data directory per process)."""
    from ablab.streaming.loader.service import Loader
    from ablab.streaming.store import apply_ddl, make_client

    store = make_client(f"chdb://{Path(home) / f'{variant}-{loaders}-{batch}'}")
    apply_ddl(store)
    group = f"bench-loader-{variant}-{uuid.uuid4().hex[:6]}"
    members = [Loader(store, bootstrap, group_id=group, topics=tuple(topics.values()), known_experiments=lambda: {"bench"},
                      rollup=variant.startswith("rollup"), batch_lock=threading.RLock(), batch_max_records=batch,
                      **({} if batch_s is None else {"batch_max_s": batch_s}),
                      **({"rollup_interval_s": 0.0} if variant == "rollup-per-batch" else {}))
               for _ in range(loaders)]
    if variant == "poll-only":
        for loader in members:
            discard_batches(loader)
    stop = threading.Event()
    profiles = [cProfile.Profile() for _ in members] if profile else []

    def target(i: int) -> None:
        if profiles:
            profiles[i].runcall(members[i].run, stop)
        else:
            members[i].run(stop)

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(len(members))]
    cpu0, first_at = time.process_time(), None
    for thread in threads:
        thread.start()
    while True:
        done = sum(loader.stats.consumed for loader in members)
        consumed.value = done
        if first_at is None and any(loader._consumer is not None and loader._consumer.assignment() for loader in members):
            first_at = time.monotonic()  # the clock starts when the group has given out partitions
        if done >= total:
            break
        time.sleep(0.02)
    stop.set()  # every record is consumed: each loader writes what it holds and stops
    for thread in threads:
        thread.join()
    done_at = time.monotonic()
    cpu = time.process_time() - cpu0
    if profiles:
        stats = pstats.Stats(profiles[0])
        for extra in profiles[1:]:
            stats.add(extra)
        stats.dump_stats(str(Path(profile) / f"{variant}-{loaders}-{batch}.prof"))
    elapsed = done_at - (first_at or done_at)
    done = sum(loader.stats.consumed for loader in members)
    out.put({"variant": f"{variant} ×{loaders}" + (f", {batch:,}/batch" if batch != DEFAULT_BATCH else ""), "consumed": done,
             "loaded": sum(sum(loader.stats.loaded.values()) for loader in members),
             "seconds": elapsed, "events_per_s": done / elapsed if elapsed else float("nan"),
             "cpu_s_per_1k": 1000 * cpu / max(1, done), "batches": sum(loader.stats.batches for loader in members),
             "checkpoints": sum(loader.stats.checkpoints for loader in members),
             "rollup_units": sum(loader.stats.rollup_units for loader in members)})


def _run_variant(variant: str, loaders: int, batch: int, batch_s: float | None, *, bootstrap: str, topics: dict[str, str], total: int, home: Path,
                 progress: Progress, profile: str | None = None) -> dict:
    ctx = multiprocessing.get_context("spawn")
    consumed, out = ctx.Value("q", 0), ctx.Queue()
    task = progress.add_task(f"{variant} ×{loaders}", total=total)
    proc = ctx.Process(target=_drain, args=(variant, loaders, batch, batch_s, bootstrap, topics, total, str(home), consumed, out, profile),
                       daemon=True)
    proc.start()
    while proc.is_alive() and out.empty():
        progress.update(task, completed=consumed.value)
        time.sleep(0.1)
    progress.update(task, completed=consumed.value)
    result = out.get(timeout=60)
    proc.join(timeout=60)
    return result


def _int_list(parser: argparse.ArgumentParser, option: str, value: str) -> list[int]:
    try:
        return [int(n) for n in value.split(",") if n]
    except ValueError:
        parser.error(f"{option}: expected comma-separated integers, got {value!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=100_000, help="requests to pre-fill (~2.5 events each)")
    parser.add_argument("--units", type=int, default=20_000, help="users the requests come from (fewer: longer histories)")
    parser.add_argument("--label-rate", type=float, default=0.5, help="fraction of requests that get a label")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    parser.add_argument("--loaders", default="1", help="comma-separated loader counts per variant (one group each)")
    parser.add_argument("--batch-records", default=str(DEFAULT_BATCH),
                        help="comma-separated largest batch sizes per variant (the loader's batch_max_records)")
    parser.add_argument("--batch-s", type=float, default=None,
                        help="the loader's batch_max_s (default: its own); a long one lets --batch-records decide")
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start one in a temp dir)")
    parser.add_argument("--json", default=None, help="also write the figures as JSON here")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="profile each drain (cProfile, every loader thread) into DIR/<variant>-<loaders>-<batch>.prof; "
                             "the profiler slows the drain, so its figures are not comparable with unprofiled runs")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    counts = _int_list(parser, "--loaders", args.loaders)
    if not counts or min(counts) < 1 or max(counts) > 3:
        parser.error("--loaders: each count must be 1, 2 or 3 (the topics have 3 partitions)")
    batches = _int_list(parser, "--batch-records", args.batch_records)
    if not batches or min(batches) < 1:
        parser.error("--batch-records: each size must be at least 1")

    from ablab.streaming.kafka.broker import BrokerConfig, free_port, start_broker, stop_broker
    from ablab.streaming.kafka.topics import TopicSpec, create_topics

    console = Console()
    work = Path(tempfile.mkdtemp(prefix="ablab-bench-loader-"))
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = BrokerConfig(directory=work / "kafka", port=free_port(), heap_mb=512)
        status = start_broker(config=broker)
        bootstrap = status.bootstrap or broker.bootstrap
    prefix = f"bl-{uuid.uuid4().hex[:6]}"
    topics = {kind: f"{prefix}.{kind}" for kind in ("inference", "rum", "feedback")}
    create_topics(bootstrap=bootstrap, specs=tuple(TopicSpec(name, 3) for name in topics.values()))
    inference, rum, feedback = _events(args.requests, units=args.units, label_rate=args.label_rate, seed=7)
    payloads = {"inference": inference, "rum": rum, "feedback": feedback}
    total = sum(map(len, payloads.values()))
    results = []
    try:
        columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            _fill(bootstrap, topics, payloads, progress)
            for variant in variants:
                for n, batch in ((n, b) for n in counts for b in batches):
                    results.append(_run_variant(variant, n, batch, args.batch_s, bootstrap=bootstrap, topics=topics, total=total, home=work,
                                                progress=progress, profile=args.profile))
    finally:
        if broker is not None:
            stop_broker(directory=broker.directory)
    load = os.getloadavg()
    table = Table(title=f"loader drain, {total:,} events ({args.requests:,} requests from {args.units:,} units), load {load[0]:.1f}")
    for col in ("variant", "events/s", "CPU-s / 1k events", "loaded rows", "batches", "checkpoints", "vs first"):
        table.add_column(col, justify="right")
    base = results[0]["events_per_s"] if results else 1.0
    for r in results:
        table.add_row(r["variant"], f"{r['events_per_s']:,.0f}", f"{r['cpu_s_per_1k']:.3f}", f"{r['loaded']:,}",
                      str(r["batches"]), str(r["checkpoints"]), f"{r['events_per_s'] / base:.2f}×")
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"events": total, "load": load, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
