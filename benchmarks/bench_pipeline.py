"""The live pipeline under load: producers → Kafka → Flink → Kafka → loader → ClickHouse.

    .venv/bin/python benchmarks/bench_pipeline.py --producers 3 --rate 10000 --duration 60

Several producer processes send inference events stamped with the current time at
``--rate`` events/s each; the job runs live (exactly-once, 2 s checkpoints) and the loader
(in this process) writes raw events and window rows to chDB. Prints the sustained rates
(sent, loaded) and the freshness of window rows: loaded_at − window_end, i.e. from the end
of a 10 s window to the row being queryable in ClickHouse (p50/p95/max), and the CPU each
part of the pipeline spent per event (producers, broker, Flink, loader with chDB), which
says how many cores a rate needs whatever else the machine was doing.

``--floor`` sends the same traffic through the same broker, but the Flink job only reads,
parses and filters it into a blackhole (``bench_flink.py``'s ``source-only`` variant) and the
loader only consumes and validates it, storing nothing: what moving the events costs on this
machine before any windowing, de-duplication or storage. Run it next to a normal run with the
same flags to split each part's CPU into transport and work.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import _path  # noqa: F401 - tests/ on the import path: the benchmarks share ablab_testing

from ablab.streaming.flink.job import JobConfig
from ablab.streaming.flink.local import FlinkProcess
from ablab.streaming.kafka.consumer import FETCH_MIN_BYTES


def _jvm_cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) of the broker's and the Flink job's JVMs, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {"broker": 0.0, "flink": 0.0}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not argv[0].endswith(b"java"):
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        role = "broker" if b"kafka.Kafka" in argv else "flink"
        seconds[role] += (int(fields[11]) + int(fields[12])) / ticks
    return seconds


def _produce(args: tuple[str, str, int, float, int, str, str]) -> tuple[int, float]:
    """Send inference events stamped with the current time at ``rate``/s for ``duration_s``."""
    bootstrap, topic, rate, duration_s, seed, client, experiment = args
    cpu_at_start = time.process_time()  # pool workers are reused: count this call's CPU only
    rng = random.Random(seed)
    if client == "confluent":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 20, "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})

        def send(key: bytes, value: bytes) -> None:
            while True:
                try:
                    producer.produce(topic, key=key, value=value)
                    return
                except BufferError:
                    producer.poll(0.01)

        def flush() -> None:
            producer.flush(120)
    else:
        from kafka import KafkaProducer

        kp = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024,
                           compression_type="lz4")

        def send(key: bytes, value: bytes) -> None:
            kp.send(topic, key=key, value=value)

        def flush() -> None:
            kp.flush()
            kp.close()

    sent, started = 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < duration_s:
        target = int(elapsed * rate)
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        while sent < target:
            trace = uuid.UUID(int=rng.getrandbits(128)).hex
            ttft = rng.randint(20, 400) / 4
            send(trace.encode(), json.dumps({
                "v": 1, "type": "inference", "event_id": trace, "trace_id": trace, "ts": now,
                "experiment": experiment, "variant": "ab"[sent % 2], "unit_id": f"u{sent % 500}", "ttft_ms": ttft,
                "e2e_ms": ttft + rng.randint(0, 4000) / 4, "tpot_ms": 1.5, "prompt_tokens": 100,
                "output_tokens": 20, "device_s": 0.01, "cost_usd": 0.0001, "price_version": "p1", "strategy": "s",
            }, separators=(",", ":")).encode())
            sent += 1
            if sent % 1000 == 0:
                now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if client == "confluent":
            producer.poll(0)
        time.sleep(0.002)
    flush()
    return sent, time.process_time() - cpu_at_start


def _print_cpu(cpu: dict[str, float], sent: int) -> None:
    per_event = {part: seconds / sent * 1e6 for part, seconds in cpu.items()}
    print("CPU per event: " + ", ".join(f"{part} {us:.1f} µs" for part, us in per_event.items())
          + f"; total {sum(per_event.values()):.1f} µs, i.e. {sum(per_event.values()) * 30_000 / 1e6:.2f} cores "
          f"for 30,000 events/s")


class SourceOnlyJob(FlinkProcess):
    """``--floor``'s job: bench_flink.py's ``source-only`` variant, run live on ``prefix``'s topics."""

    def __init__(self, config: JobConfig, *, prefix: str, log_path: Path, heap: str) -> None:
        super().__init__(config, log_path=log_path, heap=heap)
        self.prefix = prefix

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).with_name("bench_flink.py")), "--child", "source-only", "--live",
                "--prefix", self.prefix, "--bootstrap", self.config.bootstrap,
                "--checkpoint-dir", str(self.config.checkpoint_dir), "--fetch-min-bytes", str(self.config.fetch_min_bytes)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--rate", type=int, default=10_000, help="events/s per producer")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--client", choices=("confluent", "kafka-python"), default="confluent",
                        help="producer library of the load generators (kafka-python tops out near 30 k/s per "
                             "process idle, far less on a loaded box)")
    parser.add_argument("--heap", default="-Xmx1g", help="JVM_ARGS of the Flink job")
    parser.add_argument("--loader-batch-s", type=float, default=None,
                        help="the loader's batch_max_s (default: the loader's own): longer batches, fewer statements")
    parser.add_argument("--loader-rollup-interval-s", type=float, default=None,
                        help="the loader's rollup_interval_s (default: the loader's own; 0: recompute and commit "
                             "after every batch)")
    parser.add_argument("--fetch-min-bytes", type=int, default=FETCH_MIN_BYTES,
                        help="fetch.min.bytes of the job's source and the loader (default: theirs; 1: Kafka's default, "
                             "an answer per fetch at once)")
    parser.add_argument("--floor", action="store_true",
                        help="transport only: a source-only Flink job and a loader that validates and stores nothing")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of the same traffic (another experiment) before the clock starts")
    args = parser.parse_args()

    from ablab.streaming.loader.service import Loader
    from ablab.streaming.store import apply_ddl, make_client
    from ablab_testing.pipeline import PipelineTopics, group_caught_up, job_config, wait_for

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
    config = job_config(topics, bootstrap=bootstrap, checkpoint_dir=workdir / "ckpt", idle_timeout_s=5.0,
                        fetch_min_bytes=args.fetch_min_bytes)
    if args.floor:
        job = SourceOnlyJob(config, prefix=topics.prefix, log_path=workdir / "flink.log", heap=args.heap).start()
    else:
        job = FlinkProcess(config, log_path=workdir / "flink.log", heap=args.heap).start()
    batching = {} if args.loader_batch_s is None else {"batch_max_s": args.loader_batch_s}
    if args.loader_rollup_interval_s is not None:
        batching["rollup_interval_s"] = args.loader_rollup_interval_s
    loader = Loader(store, bootstrap, group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.windows),
                    windows_topic=topics.windows, deadletter_topic=topics.deadletter,
                    fetch_min_bytes=args.fetch_min_bytes, **batching)
    if args.floor:
        from bench_loader import discard_batches

        discard_batches(loader)
    stop = threading.Event()
    thread = threading.Thread(target=loader.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: bool(list((workdir / "ckpt").glob("*/chk-*"))), timeout_s=300,
                 what="the job's first checkpoint")  # the mini-cluster runs before the clock does
        with multiprocessing.Pool(args.producers) as pool:
            if args.warmup > 0:
                # The same traffic in another experiment first, so that the JVMs' JIT compilation and
                # class loading (about a core for the first minute) are not in the figures below.
                warm = sum(n for n, _ in pool.map(_produce, [
                    (bootstrap, topics.inference, args.rate, args.warmup, 100 + seed, args.client, "warmup")
                    for seed in range(args.producers)]))
                if args.floor:
                    wait_for(lambda: loader.stats.consumed >= warm, timeout_s=600, what="the warm-up traffic consumed")
                else:
                    wait_for(lambda: store.query("SELECT count() FROM raw_events WHERE experiment = 'warmup'")
                             .result_rows[0][0] >= warm, timeout_s=600, what="the warm-up traffic loaded")
            else:
                warm = 0
            started = time.monotonic()
            jvm_before, own_before = _jvm_cpu_seconds(), time.process_time()
            produced = pool.map(_produce, [(bootstrap, topics.inference, args.rate, args.duration, seed, args.client,
                                            "live") for seed in range(args.producers)])
        sent, producer_cpu = sum(n for n, _ in produced), sum(cpu for _, cpu in produced)
        load_sending = os.getloadavg()[0]
        send_s = time.monotonic() - started
        if args.floor:
            wait_for(lambda: loader.stats.consumed >= warm + sent, timeout_s=900, what="the loader to consume everything")
            wait_for(lambda: group_caught_up(bootstrap, config.group_id, [topics.inference]), timeout_s=900,
                     what="the source-only job to commit every offset")
            done_s = time.monotonic() - started
            jvm_after, own_after = _jvm_cpu_seconds(), time.process_time()
            cpu = {"producers": producer_cpu, "broker": jvm_after["broker"] - jvm_before["broker"],
                   "flink (source only)": jvm_after["flink"] - jvm_before["flink"],
                   "loader (validate only)": own_after - own_before}
            print(f"floor: sent {sent:,} events in {send_s:.1f}s: {sent / send_s:,.0f} events/s ({args.producers} producers); "
                  f"consumed by the loader and committed by the job {done_s:.1f}s after the start")
            _print_cpu(cpu, sent)
            print(f"machine: {os.cpu_count()} cores; fetch.min.bytes {args.fetch_min_bytes}; load average 1 min {load_sending:.2f} at the end of sending, "
                  f"{os.getloadavg()[0]:.2f} now; producers: {args.client}")
            return

        def raw_count() -> int:
            return store.query("SELECT count() FROM raw_events WHERE experiment = 'live'").result_rows[0][0]

        def windowed() -> int:
            return store.query("SELECT sum(n) FROM window_stats FINAL WHERE experiment = 'live'").result_rows[0][0] or 0

        def late() -> int:
            return store.query("SELECT count() FROM late_events FINAL WHERE experiment = 'live'").result_rows[0][0]

        # One event per partition a minute ahead closes every window of the run (otherwise the
        # last window waits for traffic that never comes); further ahead than the job's and the
        # loader's max_future_s (300 s) it would be dead-lettered and close nothing.
        from confluent_kafka import Producer

        closer = Producer({"bootstrap.servers": bootstrap})
        ahead = datetime.fromtimestamp(time.time() + 60, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        for partition in range(3):
            trace = uuid.uuid4().hex
            closer.produce(topics.inference, partition=partition, key=trace.encode(), value=json.dumps({
                "v": 1, "type": "inference", "event_id": trace, "trace_id": trace, "ts": ahead, "experiment": "flush",
                "variant": "a", "unit_id": "u", "ttft_ms": 1.0, "e2e_ms": 2.0, "prompt_tokens": 1, "output_tokens": 1,
                "device_s": 0.0, "cost_usd": 0.0, "price_version": "p1", "strategy": "s"}).encode())
        closer.flush(30)
        wait_for(lambda: raw_count() >= sent, timeout_s=900, what="the loader to catch up")
        raw_s = time.monotonic() - started
        # Late rows count too: on a job start over a backlog a partition can be idle-timed-out
        # before its first fetch and its events fall behind the watermark (pipeline.md).
        wait_for(lambda: windowed() + late() >= sent, timeout_s=900,
                 what="every event in a window row (or a late row) in ClickHouse")
        windows_s = time.monotonic() - started
        jvm_after, own_after = _jvm_cpu_seconds(), time.process_time()
        # This process is the loader thread, chDB's threads and a main thread that mostly waits.
        cpu = {"producers": producer_cpu, "broker": jvm_after["broker"] - jvm_before["broker"],
               "flink": jvm_after["flink"] - jvm_before["flink"], "loader + chDB": own_after - own_before}
        send_end_ms = int((time.time() - (windows_s - send_s)) * 1000)
        fresh = store.query(
            "SELECT quantile(0.5)(f), quantile(0.95)(f), max(f), count() FROM "
            "(SELECT dateDiff('millisecond', window_end, loaded_at) / 1000 AS f FROM window_stats FINAL "
            " WHERE experiment = 'live' AND toUnixTimestamp64Milli(window_end) <= {end:Int64})",
            parameters={"end": send_end_ms},
        ).result_rows[0]
        total = windowed()
        print(f"sent {sent:,} events in {send_s:.1f}s: {sent / send_s:,.0f} events/s ({args.producers} producers)")
        print(f"raw events in ClickHouse {raw_s:.1f}s after the start: {sent / raw_s:,.0f} events/s (loader path)")
        print(f"every event in a window row in ClickHouse {windows_s:.1f}s after the start: {sent / windows_s:,.0f} "
              f"events/s through Flink (windowed {total:,} + late {late():,} = sent {sent:,}: "
              f"{total + late() == sent})")
        print(f"freshness window_end -> queryable over {fresh[3]} windows that closed while sending: "
              f"p50 {fresh[0]:.2f}s  p95 {fresh[1]:.2f}s  max {fresh[2]:.2f}s")
        _print_cpu(cpu, sent)
        print(f"machine: {os.cpu_count()} cores; fetch.min.bytes {args.fetch_min_bytes}; loader batches {loader.stats.batches} (batch_max_s {loader.batch_max_s}), checkpoints {loader.stats.checkpoints} (rollup_interval_s {loader.rollup_interval_s}); load average 1 min "
              f"{load_sending:.2f} at the end of sending, {os.getloadavg()[0]:.2f} now; producers: {args.client}")
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
