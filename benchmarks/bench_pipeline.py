"""The live pipeline under load: producers → Kafka → Flink → Kafka → loader → ClickHouse.

    .venv/bin/python benchmarks/bench_pipeline.py --producers 3 --rate 10000 --duration 60

Several producer processes send inference events stamped with the current time at
``--rate`` events/s each; the job runs live (exactly-once, 2 s checkpoints) and the loader
(in this process) writes raw events and window rows to chDB. Prints the sustained rates
(sent, loaded) and the freshness of window rows: loaded_at − window_end, i.e. from the end
of a 10 s window to the row being queryable in ClickHouse (p50/p95/max).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path


def _produce(args: tuple[str, str, int, float, int]) -> int:
    bootstrap, topic, rate, duration_s, seed = args
    from kafka import KafkaProducer

    rng = random.Random(seed)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=256 * 1024,
                             compression_type="lz4")
    sent, started = 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < duration_s:
        target = int(elapsed * rate)
        while sent < target:
            trace = uuid.uuid4().hex
            ttft = rng.randint(20, 400) / 4
            now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            producer.send(topic, key=trace.encode(), value=json.dumps({
                "v": 1, "type": "inference", "event_id": trace, "trace_id": trace, "ts": now,
                "experiment": "live", "variant": "ab"[sent % 2], "unit_id": f"u{sent % 500}", "ttft_ms": ttft,
                "e2e_ms": ttft + rng.randint(0, 4000) / 4, "tpot_ms": 1.5, "prompt_tokens": 100,
                "output_tokens": 20, "device_s": 0.01, "cost_usd": 0.0001, "price_version": "p1", "strategy": "s",
            }, separators=(",", ":")).encode())
            sent += 1
        time.sleep(0.002)
    producer.flush()
    producer.close()
    return sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--rate", type=int, default=10_000, help="events/s per producer")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()

    from ablab.streaming.flink.harness import FlinkProcess, PipelineTopics, job_config, wait_for
    from ablab.streaming.loader.service import Loader
    from ablab.streaming.store import apply_ddl, make_client

    workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    broker_dir, bootstrap = None, args.bootstrap
    if bootstrap is None:
        from ablab.streaming.kafka.broker import BrokerConfig, free_port, start_broker

        broker_dir = workdir / "kafka"
        config = BrokerConfig(directory=broker_dir, port=free_port(), heap_mb=512)
        bootstrap = start_broker(config=config).bootstrap or config.bootstrap
    store = make_client(f"chdb:///{workdir / 'chdb'}")
    apply_ddl(store)
    topics = PipelineTopics.unique("live")
    topics.create(bootstrap=bootstrap)
    job = FlinkProcess(job_config(topics, bootstrap=bootstrap, checkpoint_dir=workdir / "ckpt"),
                       log_path=workdir / "flink.log").start()
    loader = Loader(store, bootstrap, group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.windows),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter)
    stop = threading.Event()
    thread = threading.Thread(target=loader.run, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(25)  # let the mini-cluster start before the clock runs
        started = time.monotonic()
        with multiprocessing.Pool(args.producers) as pool:
            sent = sum(pool.map(_produce, [(bootstrap, topics.inference, args.rate, args.duration, seed)
                                           for seed in range(args.producers)]))
        send_s = time.monotonic() - started

        def raw_count() -> int:
            return store.query("SELECT count() FROM raw_events").result_rows[0][0]

        wait_for(lambda: raw_count() >= sent, timeout_s=600, what="the loader to catch up")
        loaded_s = time.monotonic() - started
        time.sleep(15)  # the last complete windows
        fresh = store.query(
            "SELECT quantile(0.5)(f), quantile(0.95)(f), max(f), count() FROM "
            "(SELECT dateDiff('millisecond', window_end, loaded_at) / 1000 AS f FROM window_stats FINAL)"
        ).result_rows[0]
        windowed = store.query("SELECT sum(n) FROM window_stats FINAL").result_rows[0][0]
        print(f"sent {sent:,} events in {send_s:.1f}s: {sent / send_s:,.0f} events/s ({args.producers} producers)")
        print(f"loaded {sent:,} raw events {loaded_s:.1f}s after the start: {sent / loaded_s:,.0f} events/s sustained")
        print(f"window rows: {fresh[3]} windows, {windowed:,} events windowed (the open last windows excluded)")
        print(f"freshness window_end -> queryable: p50 {fresh[0]:.2f}s  p95 {fresh[1]:.2f}s  max {fresh[2]:.2f}s")
        print(f"machine: {os.cpu_count()} cores; loader batches {loader.stats.batches}")
    finally:
        job.stop()
        stop.set()
        thread.join(timeout=30)
        store.close()
        if broker_dir is not None:
            from ablab.streaming.kafka.broker import stop_broker

            stop_broker(directory=broker_dir)


if __name__ == "__main__":
    main()
