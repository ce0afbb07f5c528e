"""Flink job draining a pre-filled topic: events/s of the pure-SQL window job, and where the time goes.

    .venv/bin/python benchmarks/bench_flink.py --events 5000000
    .venv/bin/python benchmarks/bench_flink.py --events 1000000 --variants job,no-dedup,no-late,no-percentile

Starts a local broker (or uses --bootstrap), pre-fills a fresh 3-partition inference topic
with ``--events`` valid inference events spread over event time (confluent-kafka, several
processes, pre-rendered JSON: the pre-fill is a tool here, not what is measured), then runs
each ``--variants`` entry in a mini-cluster child process, bounded (it stops at the offsets
that were the latest at start), exactly-once sinks, checkpoints on.

Each variant is run on an empty topic and on the full one. Throughput = events /
(full − empty) of the job's *net runtime* (Flink's own figure: from job submission to its
end, so JVM start-up and planning are not in it; the empty run's net runtime is the fixed
cost of scheduling and the last checkpoint). CPU seconds of the child's JVM are read from
/proc, so ``events per CPU-second`` is also printed: on a shared machine it is the figure
that survives other people's load. ``uptime`` load average is printed beside each row.

Variants (``job`` is exactly what production runs; the others each take one thing away or
change one setting, to see what it costs):

- job             the production SQL and configuration
- no-late         without the per-partition late rule (no OVER aggregate); watermark rule only
- no-percentile   MAX instead of PERCENTILE in the window aggregates
- no-dedup        without the event_id de-duplication (ROW_NUMBER replaced by 1)
- source-only     read + parse JSON + validity filter into a blackhole sink
- plain-tumble    one 10 s TUMBLE COUNT/SUM per (experiment, variant), nothing else
- rocksdb         the job on RocksDB state with incremental checkpoints
- changelog       the job with the changelog state backend (generic incremental checkpoints)
- no-object-reuse the job without pipeline.object-reuse (the job sets it)
- minibatch       the job with mini-batch on (the job turns it off)
- ckpt-30s        the job with 30 s checkpoints instead of 5 s
- ttl-60s         the job remembering event_ids for 60 s instead of 600 s (a semantic change)
- parallel-gc     the job's JVM with -XX:+UseParallelGC instead of G1
- p2              the job at parallelism 2

- with-rum-join   RUM joined to its request in Flink by an interval join (the SQL of commit
                  3d0379e, read from git): the baseline for attributing RUM in ClickHouse

Join names with ``+`` to combine variants (``no-dedup+no-late+p2``). Figures of the
variants that measured the RUM interval join itself (no-rum, bucket-join, before) are in
docs/benchmarks/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import _path  # noqa: F401 - tests/ on the import path: the benchmarks share ablab_testing

from ablab.streaming.kafka.consumer import FETCH_MIN_BYTES

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


# --- pre-fill ---------------------------------------------------------------------------

def _produce(args: tuple[str, str, int, int, int, int]) -> int:
    """Write ``count`` events (indices first, first + step, ...) with confluent-kafka."""
    bootstrap, topic, first, step, count, events_per_s = args
    from confluent_kafka import Producer

    rng = random.Random(first)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 500_000})
    stamp_cache: dict[int, str] = {}
    for k in range(count):
        i = first + k * step
        ts_ms = BASE_MS + (i * 1000) // events_per_s
        second = ts_ms // 1000
        stamp = stamp_cache.get(second)
        if stamp is None:
            stamp = stamp_cache[second] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        trace = uuid.UUID(int=rng.getrandbits(128)).hex
        ttft = rng.randint(20, 400) / 4
        value = ('{"v":1,"type":"inference","event_id":"%s","trace_id":"%s","ts":"%s.%03dZ","experiment":"bench",'  # noqa: UP031 -- %r keeps each float's repr
                 '"variant":"%s","unit_id":"u%d","ttft_ms":%r,"e2e_ms":%r,"tpot_ms":1.5,"prompt_tokens":100,'
                 '"output_tokens":20,"device_s":0.01,"cost_usd":0.0001,"price_version":"p1","strategy":"s"}') % (
            trace, trace, stamp, ts_ms % 1000, "ab"[i % 2], i % 1000, ttft, ttft + rng.randint(0, 4000) / 4)
        while True:
            try:
                producer.produce(topic, value=value.encode(), key=trace.encode())
                break
            except BufferError:
                producer.poll(0.05)
        if k % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("pre-fill producer did not deliver every event")
    return count


def prefill(bootstrap: str, topic: str, events: int, producers: int, rate: int) -> float:
    started = time.perf_counter()
    jobs = [(bootstrap, topic, p, producers, len(range(p, events, producers)), rate) for p in range(producers)]
    with multiprocessing.get_context("spawn").Pool(producers) as pool:
        produced = sum(pool.map(_produce, jobs))
    assert produced == events
    return time.perf_counter() - started


# --- variants -----------------------------------------------------------------------------

_PERCENTILE = re.compile(r"PERCENTILE\((\w+), ARRAY\[0\.5, 0\.95, 0\.99\]\)")
_OVER = re.compile(r"MAX\(ts\) OVER \(PARTITION BY kafka_partition ORDER BY arrival\s+ROWS BETWEEN UNBOUNDED "
                   r"PRECEDING AND CURRENT ROW\)")


BASELINE_COMMIT = "3d0379e"  # the last job with the RUM interval join


def _with_rum_join(statements: list[str], config) -> list[str]:
    """Every statement of the job at BASELINE_COMMIT, its SQL files read from git history."""
    from ablab.streaming.flink import job

    # The parameters that job had besides today's: its RUM topic (created, left empty, as the
    # benchmark sends no RUM) and its 10 s RUM horizon.
    parameters = config.sql_parameters() | {"rum_topic": config.inference_topic.removesuffix(".inference") + ".rum",
                                            "rum_horizon_s": "10.000"}
    out = []
    for name in ("10_sources_kafka", "20_sinks_kafka", "30_transform", "40_inserts"):
        shown = subprocess.run(["git", "show", f"{BASELINE_COMMIT}:streaming/flink/sql/{name}.sql"],
                               capture_output=True, text=True, cwd=Path(__file__).resolve().parent)
        if shown.returncode != 0:
            raise RuntimeError(f"with-rum-join needs the repository's git history: {shown.stderr.strip()}")
        out += job.split_statements(job.render(shown.stdout, parameters))
    return out


def _no_late(statements: list[str], config) -> list[str]:
    # seen_watermark = ts - bound: the per-partition rule never fires and the OVER aggregate
    # is gone; the watermark comparison stays.
    return [_OVER.sub("ts", s) for s in statements]


def _no_percentile(statements: list[str], config) -> list[str]:
    return [_PERCENTILE.sub(r"ARRAY[MAX(\1), MAX(\1), MAX(\1)]", s) for s in statements]


def _source_only(statements: list[str], config) -> list[str]:
    kept = [s for s in statements if not s.upper().startswith("INSERT")]
    kept.append("CREATE TEMPORARY TABLE bench_blackhole (event_id STRING, ts TIMESTAMP_LTZ(3), e2e_ms DOUBLE) "
                "WITH ('connector' = 'blackhole')")
    kept.append("INSERT INTO bench_blackhole SELECT event_id, ts, e2e_ms FROM inference_events "
                "WHERE event_id IS NOT NULL AND ts IS NOT NULL AND experiment IS NOT NULL")
    return kept


def _plain_tumble(statements: list[str], config) -> list[str]:
    kept = [s for s in statements if not s.upper().startswith("INSERT")]
    kept.append("CREATE TEMPORARY TABLE bench_blackhole (experiment STRING, `variant` STRING, "
                "window_start TIMESTAMP(3), n BIGINT, e2e_sum DOUBLE) WITH ('connector' = 'blackhole')")
    kept.append("INSERT INTO bench_blackhole SELECT experiment, `variant`, window_start, COUNT(*), SUM(e2e_ms) "
                "FROM TABLE(TUMBLE(TABLE inference_events, DESCRIPTOR(ts), INTERVAL '10' SECOND)) "
                "GROUP BY window_start, window_end, experiment, `variant`")
    return kept


_MINIBATCH = {"table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "500 ms",
              "table.exec.mini-batch.size": "5000"}
_ROCKSDB = {"state.backend.type": "rocksdb", "execution.checkpointing.incremental": "true"}
# Generic incremental checkpoints for the heap backend (FLIP-158): each state change is
# logged once; the full heap copy is only made at materialization (default every 10 min).
_CHANGELOG = {"state.changelog.enabled": "true", "state.changelog.storage": "filesystem",
              "state.changelog.dstl.dfs.base-path": "{checkpoint_dir}/changelog"}
_DEDUP_ROW_NUMBER = "ROW_NUMBER() OVER (PARTITION BY event_id ORDER BY arrival)"


def _no_dedup(statements: list[str], config) -> list[str]:
    return [s.replace(_DEDUP_ROW_NUMBER, "1") for s in statements]


VARIANTS: dict[str, tuple] = {
    # name: (statement transform or None, extra Flink configuration, parallelism, extra JVM flags)
    "job": (None, {}, 1, ""),
    "with-rum-join": (_with_rum_join, {}, 1, ""),
    "no-late": (_no_late, {}, 1, ""),
    "no-percentile": (_no_percentile, {}, 1, ""),
    "no-dedup": (_no_dedup, {}, 1, ""),
    "source-only": (_source_only, {}, 1, ""),
    "plain-tumble": (_plain_tumble, {}, 1, ""),
    "rocksdb": (None, _ROCKSDB, 1, ""),
    "changelog": (None, _CHANGELOG, 1, ""),
    "minibatch": (None, _MINIBATCH, 1, ""),
    "ckpt-30s": (None, {"execution.checkpointing.interval": "30 s"}, 1, ""),
    "ttl-60s": (None, {"table.exec.state.ttl": "60 s"}, 1, ""),
    "parallel-gc": (None, {}, 1, "-XX:+UseParallelGC"),
    "no-object-reuse": (None, {"pipeline.object-reuse": "false"}, 1, ""),
    "p2": (None, {}, 2, ""),
}


def variant_spec(name: str) -> tuple:
    """A variant, or several joined by ``+`` (``no-dedup+no-late+p2``): transforms applied in
    order, configurations merged, the largest parallelism, JVM flags joined."""
    parts = [VARIANTS[part] for part in name.split("+")]
    transforms = [part[0] for part in parts if part[0] is not None]

    def transform(statements: list[str], config) -> list[str]:
        for step in transforms:
            statements = step(statements, config)
        return statements

    extra: dict[str, str] = {}
    for part in parts:
        extra.update(part[1])
    return (transform if transforms else None, extra, max(part[2] for part in parts),
            " ".join(part[3] for part in parts if part[3]))


def _children() -> list[tuple[int, float]]:
    """(pid, user + system CPU seconds) of this process's children (the PyFlink JVM), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me:  # ppid
            found.append((int(stat.parent.name), (int(fields[11]) + int(fields[12])) / ticks))
    return found


def _jvm_cpu_seconds() -> float:
    return sum(cpu for _, cpu in _children())


def child(args: argparse.Namespace) -> None:
    """Run one variant on one topic and print one JSON line with its timings."""
    from ablab.streaming.flink import job
    from ablab_testing.pipeline import PipelineTopics, job_config

    transform, extra, parallelism, _ = variant_spec(args.child)
    topics = PipelineTopics(args.prefix)
    # --live: unbounded with the live job's 2 s checkpoints, for bench_pipeline.py --floor (which
    # stops it); otherwise a bounded drain of what the topic holds.
    config = job_config(topics, bootstrap=args.bootstrap, checkpoint_dir=Path(args.checkpoint_dir), bounded=not args.live,
                        checkpoint_interval_s=2.0 if args.live else 5.0, parallelism=parallelism, restore=False,
                        transactional_id_prefix=f"{args.prefix}-{args.child}", fetch_min_bytes=args.fetch_min_bytes)
    conf = job.flink_configuration(config, connector_jar=job._connector_jar())
    conf.update({key: value.format(checkpoint_dir=Path(args.checkpoint_dir).resolve().as_uri())
                 for key, value in extra.items()})
    statements = job.statements(config)
    if transform is not None:
        statements = transform(statements, config)
    jfr_file = os.environ.get("BENCH_JFR")  # read before PyFlink touches the environment
    t0 = time.perf_counter()
    env = job.create_table_environment(conf)
    statement_set = env.create_statement_set()
    for statement in statements:
        if statement.upper().startswith("INSERT"):
            statement_set.add_insert_sql(statement)
        else:
            env.execute_sql(statement)
    result = statement_set.execute()
    execution = result.get_job_client().get_job_execution_result().result()
    wall = time.perf_counter() - t0
    if jfr_file:  # the recording started by -XX:StartFlightRecording (see run_variant)
        for pid, _ in _children():
            dump = subprocess.run(["jcmd", str(pid), "JFR.dump", f"filename={jfr_file}"],
                                  capture_output=True, text=True, timeout=300)
            print(f"jcmd {pid}: exit {dump.returncode} {dump.stdout.strip()[-300:]} {dump.stderr.strip()[-300:]}")
    print("RESULT " + json.dumps({"net_s": execution.get_net_runtime() / 1000, "wall_s": wall,
                                  "cpu_s": _jvm_cpu_seconds()}), flush=True)


def run_variant(variant: str, prefix: str, bootstrap: str, workdir: Path, heap: str, *, jfr: bool = False,
                fetch_min_bytes: int = FETCH_MIN_BYTES) -> dict:
    log = workdir / f"{variant}-{prefix}.log"
    env = dict(os.environ, JVM_ARGS=f"{heap} {variant_spec(variant)[3]}".strip(), FLINK_LOG_DIR=str(log.with_suffix(".jvm")))
    if jfr:  # a JDK Flight Recorder profile of the job's JVM, for `jfr print`
        env["JVM_ARGS"] += " -XX:StartFlightRecording=settings=profile"
        env["BENCH_JFR"] = str(workdir / f"{variant}.jfr")
    cmd = [sys.executable, __file__, "--child", variant, "--prefix", prefix, "--bootstrap", bootstrap,
           "--checkpoint-dir", str(workdir / f"ckpt-{variant}-{prefix}"), "--fetch-min-bytes", str(fetch_min_bytes)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            rc = proc.wait(timeout=3600)
        finally:
            deadline = time.monotonic() + 20  # the JVM exits after its Python parent (and writes its JFR file)
            try:
                while time.monotonic() < deadline:
                    os.killpg(proc.pid, 0)
                    time.sleep(0.2)
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    if rc != 0 or not lines:
        raise RuntimeError(f"variant {variant} on {prefix} failed (exit {rc}):\n{text[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@contextmanager
def broker_for(bootstrap: str | None, workdir: Path) -> Iterator[str]:
    """``bootstrap`` as given, or a broker of this run's own (in ``workdir``), stopped after it."""
    if bootstrap is not None:
        yield bootstrap
        return
    from ablab.streaming.kafka.broker import BrokerConfig, start_broker, stop_broker
    from ablab.streaming.localhost import server_ports

    config = BrokerConfig(directory=workdir / "kafka", port=server_ports(2), heap_mb=512)
    try:
        yield start_broker(config=config, topics=()).bootstrap or config.bootstrap
    finally:
        stop_broker(directory=config.directory)


ROW_HEADER = f"{'empty s':>9}{'full s':>9}{'events/s':>11}{'JVM cpu s':>11}{'ev/cpu-s':>10}{'load 1m':>9}"


def measure_row(name: str, run: Callable[[str], dict], *, empty: str, full: str, events: int, width: int) -> float | None:
    """Run on the empty topics (start-up and shutdown cost) and on the pre-filled ones, print
    the row, return the processing rate (events/s net of the empty run), or None when it failed."""
    try:
        base = run(empty)
        loaded = os.getloadavg()[0]
        result = run(full)
    except RuntimeError as error:  # one broken variant does not end the comparison
        print(f"{name:<{width}}failed: {str(error)[-600:]}", flush=True)
        return None
    loaded = (loaded + os.getloadavg()[0]) / 2
    processing, cpu = result["net_s"] - base["net_s"], result["cpu_s"] - base["cpu_s"]
    print(f"{name:<{width}}{base['net_s']:>9.1f}{result['net_s']:>9.1f}{events / processing:>11,.0f}"
          f"{cpu:>11.1f}{events / cpu:>10,.0f}{loaded:>9.2f}", flush=True)
    return events / processing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=5_000_000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rate", type=int, default=20_000, help="event-time events per second in the data")
    parser.add_argument("--variants", default="job", help=f"comma-separated, of: {', '.join(VARIANTS)}; join with + to combine")
    parser.add_argument("--heap", default=os.environ.get("JVM_ARGS", "-Xmx1g"), help="JVM_ARGS of the job")
    parser.add_argument("--fetch-min-bytes", type=int, default=FETCH_MIN_BYTES,
                        help="the source's fetch.min.bytes (default: the job's own; 1: Kafka's default)")
    parser.add_argument("--jfr", action="store_true", help="record a JFR profile of each full run (in the work dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    parser.add_argument("--live", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    variants = args.variants.split(",")
    unknown = [part for v in variants for part in v.split("+") if part not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")

    from ablab_testing.pipeline import PipelineTopics

    workdir = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    print(f"work dir {workdir}", flush=True)
    with broker_for(args.bootstrap, workdir) as bootstrap:
        empty, full = PipelineTopics.unique("benche"), PipelineTopics.unique("benchf")
        empty.create(bootstrap=bootstrap)
        full.create(bootstrap=bootstrap)
        print(f"load before pre-fill: {os.getloadavg()[0]:.2f}", flush=True)
        fill_s = prefill(bootstrap, full.inference, args.events, args.producers, args.rate)
        print(f"pre-filled {args.events:,} events in {fill_s:.1f}s ({args.events / fill_s:,.0f}/s, "
              f"{args.producers} confluent-kafka processes); load {os.getloadavg()[0]:.2f}", flush=True)
        print(f"machine: {os.cpu_count()} cores; JVM_ARGS={args.heap}; event time {args.rate:,} events/s "
              f"({args.rate * 10:,} per 10 s window); checkpoints every 5 s", flush=True)
        print(f"{'variant':<30}{ROW_HEADER}", flush=True)
        for variant in variants:
            # Each variant gets its own consumer group / transactional ids (unique prefix per run).
            measure_row(variant, lambda prefix, v=variant: run_variant(v, prefix, bootstrap, workdir, args.heap,
                                                                       jfr=args.jfr and prefix == full.prefix,
                                                                       fetch_min_bytes=args.fetch_min_bytes),
                        empty=empty.prefix, full=full.prefix, events=args.events, width=30)

if __name__ == "__main__":
    main()
