"""Flink job draining a pre-filled topic: events/s of the pure-SQL window job.

    .venv/bin/python benchmarks/bench_flink.py --events 5000000

Starts a local broker (or uses --bootstrap), pre-fills a fresh inference topic with
``--events`` valid inference events spread over event time, then runs the real job
(bounded: it stops at the offsets that were the latest at start, exactly-once sinks,
checkpoints on) in a mini-cluster child process. The job is run twice, on an empty topic
and on the full one, in the same run; throughput = events / (full − empty) wall time, so
JVM start-up and the final checkpoint are not counted as processing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import tempfile
import time
import uuid
from pathlib import Path


def _produce(args: tuple[str, str, int, int, int]) -> int:
    bootstrap, topic, count, seed, events_per_s = args
    from kafka import KafkaProducer

    rng = random.Random(seed)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=50, batch_size=512 * 1024,
                             compression_type="lz4")
    base_ms = 1_767_225_600_000
    for i in range(count):
        ts_ms = base_ms + (i * 1000) // events_per_s
        trace = uuid.uuid4().hex
        ttft = rng.randint(20, 400) / 4
        value = json.dumps({
            "v": 1, "type": "inference", "event_id": trace, "trace_id": trace,
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts_ms // 1000)) + f".{ts_ms % 1000:03d}Z",
            "experiment": "bench", "variant": "ab"[i % 2], "unit_id": f"u{i % 1000}", "ttft_ms": ttft,
            "e2e_ms": ttft + rng.randint(0, 4000) / 4, "tpot_ms": 1.5, "prompt_tokens": 100, "output_tokens": 20,
            "device_s": 0.01, "cost_usd": 0.0001, "price_version": "p1", "strategy": "s",
        }, separators=(",", ":")).encode()
        producer.send(topic, key=trace.encode(), value=value)
    producer.flush()
    producer.close()
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rate", type=int, default=20_000, help="event-time events per second in the data")
    args = parser.parse_args()

    from ablab.streaming.flink.harness import FlinkProcess, PipelineTopics, job_config

    workdir = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    broker_dir = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from ablab.streaming.kafka.broker import BrokerConfig, free_port, start_broker

        broker_dir = workdir / "kafka"
        config = BrokerConfig(directory=broker_dir, port=free_port(), heap_mb=512)
        bootstrap = start_broker(config=config).bootstrap or config.bootstrap
    try:
        empty, full = PipelineTopics.unique("benche"), PipelineTopics.unique("benchf")
        empty.create(bootstrap=bootstrap)
        full.create(bootstrap=bootstrap)
        started = time.perf_counter()
        per = args.events // args.producers
        with multiprocessing.Pool(args.producers) as pool:
            produced = sum(pool.map(_produce, [(bootstrap, full.inference, per, seed, args.rate)
                                               for seed in range(args.producers)]))
        fill_s = time.perf_counter() - started
        print(f"pre-filled {produced:,} events in {fill_s:.1f}s ({produced / fill_s:,.0f}/s with {args.producers} producers)")

        timings = {}
        for label, topics in (("empty", empty), ("full", full)):
            job = FlinkProcess(job_config(topics, bootstrap=bootstrap, checkpoint_dir=workdir / f"ckpt-{label}",
                                          bounded=True, checkpoint_interval_s=5.0),
                               log_path=workdir / f"flink-{label}.log")
            t0 = time.perf_counter()
            job.start()
            rc = job.wait(timeout_s=3600)
            timings[label] = time.perf_counter() - t0
            print(f"job on {label} topic: exit {rc}, {timings[label]:.1f}s")
            if rc != 0:
                print(job.log_tail())
        processing = timings["full"] - timings["empty"]
        print(f"processing time {processing:.1f}s for {produced:,} events -> {produced / processing:,.0f} events/s "
              f"(end to end incl. start-up: {produced / timings['full']:,.0f} events/s)")
        print(f"machine: {os.cpu_count()} cores; JVM_ARGS={os.environ.get('JVM_ARGS', '-Xmx512m')}; parallelism 1")
    finally:
        if broker_dir is not None:
            from ablab.streaming.kafka.broker import stop_broker

            stop_broker(directory=broker_dir)


if __name__ == "__main__":
    main()
