"""Producer throughput: raw kafka-python vs the ablab Emitter vs confluent-kafka, 1 and N processes.

Every figure is events acknowledged by a real broker (acks=all, idempotent, lz4) per
second of wall time, measured side by side in one run so the ratios survive a noisy
machine. The broker is started here on a free port unless ``--bootstrap`` is given.

    .venv/bin/python benchmarks/bench_producer.py --events 20000 --processes 1,2,4
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

TOPIC = "ablab.inference"


def make_events(n: int, seed: int):
    from ablab.platform.events import InferenceEvent

    return [
        InferenceEvent(type="inference", ts="2026-03-01T12:00:00Z", trace_id=f"p{seed}-t{i}", experiment="exp",
                       variant="ab"[i % 2], unit_id=f"u{i % 997}", ttft_ms=12.0, e2e_ms=80.0 + i % 7, tpot_ms=4.0,
                       prompt_tokens=30, output_tokens=17, device_s=0.08, cost_usd=1e-4, price_version="p1",
                       strategy="3f2a9c1b")
        for i in range(n)
    ]


def run_raw(bootstrap: str, n: int, seed: int, barrier, results) -> None:
    from kafka import KafkaProducer

    values = [(e.trace_id.encode(), e.to_json_bytes()) for e in make_events(n, seed)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                             compression_type="lz4", linger_ms=20, batch_size=256 * 1024)
    barrier.wait()
    start = time.perf_counter()
    for key, value in values:
        producer.send(TOPIC, key=key, value=value)
    producer.flush()
    results.put((start, time.perf_counter(), n, 0))
    producer.close()


def run_confluent(bootstrap: str, n: int, seed: int, barrier, results) -> None:
    """The same load through confluent-kafka (librdkafka), same settings, for reference."""
    from confluent_kafka import Producer

    values = [(e.trace_id.encode(), e.to_json_bytes()) for e in make_events(n, seed)]
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "compression.type": "lz4", "linger.ms": 20, "batch.size": 256 * 1024})
    barrier.wait()
    start = time.perf_counter()
    for key, value in values:
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(300) != 0:
        raise SystemExit("confluent-kafka did not deliver every event")
    results.put((start, time.perf_counter(), n, 0))


def run_emitter(bootstrap: str, n: int, seed: int, barrier, results) -> None:
    from ablab.streaming.kafka.emitter import Emitter, EmitterConfig

    events = make_events(n, seed)
    with tempfile.TemporaryDirectory() as spool:
        emitter = Emitter(config=EmitterConfig(bootstrap=bootstrap, spool_dir=Path(spool)))
        while not emitter.counters()["broker_up"]:
            time.sleep(0.05)
        barrier.wait()
        start = time.perf_counter()
        for event in events:
            emitter.emit(event)
        emit_done = time.perf_counter()
        if not emitter.flush(600):
            raise SystemExit(f"emitter did not drain: {emitter.counters()}")
        end = time.perf_counter()
        counters = emitter.counters()
        emitter.close()
    assert counters["sent"] + counters["replayed"] == n, counters
    results.put((start, end, n, (emit_done - start) / n))


def measure(kind: str, bootstrap: str, processes: int, n: int) -> tuple[float, float]:
    target = {"raw": run_raw, "emitter": run_emitter, "confluent": run_confluent}[kind]
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=target, args=(bootstrap, n, seed, barrier, results)) for seed in range(processes)]
    for worker in workers:
        worker.start()
    rows = [results.get(timeout=900) for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit(f"{kind} worker failed with {worker.exitcode}")
    start, end = min(r[0] for r in rows), max(r[1] for r in rows)
    emit_us = max(r[3] for r in rows) * 1e6
    return sum(r[2] for r in rows) / (end - start), emit_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--events", type=int, default=20_000, help="events per process")
    parser.add_argument("--processes", default="1,2,4", help="process counts to compare")
    args = parser.parse_args()
    counts = [int(p) for p in args.processes.split(",")]

    from ablab.streaming.kafka.broker import BrokerConfig, free_port, start_broker, stop_broker

    tmp = tempfile.TemporaryDirectory()
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker = BrokerConfig(directory=Path(tmp.name) / "kafka", port=free_port(), heap_mb=512)
        bootstrap = start_broker(config=broker).bootstrap
    try:
        print(f"machine: {os.cpu_count()} cpus, python {sys.version.split()[0]}, broker {bootstrap}, "
              f"{args.events} events/process (~{len(make_events(1, 0)[0].to_json_bytes())} B each)")
        print(f"{'producer':<10}{'procs':>6}{'events/s':>12}{'per proc':>11}{'vs raw':>8}{'emit() us':>11}")
        for processes in counts:
            raw, _ = measure("raw", bootstrap, processes, args.events)
            ours, emit_us = measure("emitter", bootstrap, processes, args.events)
            rdkafka, _ = measure("confluent", bootstrap, processes, args.events)
            print(f"{'raw':<10}{processes:>6}{raw:>12,.0f}{raw / processes:>11,.0f}{'1.00':>8}{'':>11}")
            print(f"{'emitter':<10}{processes:>6}{ours:>12,.0f}{ours / processes:>11,.0f}{ours / raw:>8.2f}"
                  f"{emit_us:>11.1f}")
            print(f"{'confluent':<10}{processes:>6}{rdkafka:>12,.0f}{rdkafka / processes:>11,.0f}"
                  f"{rdkafka / raw:>8.2f}{'':>11}", flush=True)
        print(f"load average 1 min: {os.getloadavg()[0]:.2f}")
    finally:
        if broker is not None:
            stop_broker(directory=broker.directory)
        tmp.cleanup()


if __name__ == "__main__":
    main()
