"""Soak: the whole `ablab up --demo` stack for N minutes with faults, then every event reconciled.

    .venv/bin/python benchmarks/soak.py --minutes 10            # the full soak (about 14 min wall)
    .venv/bin/python benchmarks/soak.py --minutes 2 --faults flink,worker

What it does, in order (loopback only; a fresh ABLAB_HOME and free ports every run):

1. ``ablab up --demo``: broker, API (embedded chDB + loader), Flink job, dashboard, two
   workers, two traffic generators (RUM) and two labelers (feedback).
2. Injects the faults, spaced evenly over the run: ``broker`` (clean stop, outage,
   start), ``flink`` (SIGKILL of the job's process group, restart: it restores from its
   newest checkpoint), ``api`` (SIGTERM, restart; the API owns chDB and runs the loader),
   ``worker`` (SIGKILL of worker-1, restart), ``poison`` (hostile records for the demo
   experiment: a 1.7e308 latency and a year-9999 timestamp through the API, the same plus
   garbage bytes written straight to Kafka on every partition). A service that dies on its
   own is recorded as an unplanned exit and restarted (``--no-heal`` leaves it dead).
3. Drains: waits for the traffic to end, for every sampled label to come due, for the
   API's emitter spool to empty and for the loader's consumer lag to reach zero; one
   out-of-experiment event per partition pushes the Flink watermark past the last window.
4. Reconciles, per event type, three views of every event:
   - *emitted*: what the emitters produced, from the traffic ledgers (one served request =
     one ``exposure``, one ``inference``, one ``rum`` event, keyed by ``trace_id``) and a
     replay of each labeler's seeded sampling over its ledger (the ``feedback`` events);
   - *Kafka*: every record of the typed topics (``read_committed``), by trace_id and event_id;
   - *ClickHouse*: ``raw_events`` (distinct event_ids per trace_id, ``FINAL``), and the
     window identity ``raw inference = Σ window n + late inference``.
   Poison records must be refused at the edge or dead-lettered, never stored, and the
   ordinary events around them must all reconcile as usual.
   Lost = emitted but not stored; duplicated = one emitted event stored under two or more
   event_ids (a double count no ReplacingMergeTree can undo). Redelivered copies of one
   event_id (Kafka or loader retries) are reported but harmless: the tables collapse them.
5. ``ablab down`` and a check that no process group it started is left.

Exit status: 0 when nothing was lost, nothing double-counted, the windows balance and
every fault ran; 1 otherwise; 2 when the stack could not start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ABLAB = str(Path(sys.executable).with_name("ablab"))
EXPERIMENT = "demo-serving"
FLUSH_EXPERIMENT = "soak-flush"  # the watermark push: unknown to the registry, so never stored as an event
FAULTS = ("broker", "flink", "api", "worker", "poison")
POISON_PREFIX = "soak-poison-"  # trace_ids of the poison fault's records (not in any ledger)
TYPES = ("exposure", "inference", "rum", "feedback")
console = Console(stderr=True)
out = Console()


@dataclass
class FaultRecord:
    name: str
    at_s: float
    took_s: float = 0.0
    ok: bool = False
    detail: str = ""


@dataclass
class Soak:
    home: Path
    env: dict[str, str]
    minutes: float
    started: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)
    poison_traces: set[str] = field(default_factory=set)
    pids_seen: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    load: list[tuple[float, float, float]] = field(default_factory=list)

    def t(self) -> float:
        return time.monotonic() - self.started


# --------------------------------------------------------------------------- set-up


def _free_ports() -> dict[str, int]:
    from ablab.streaming.kafka.broker import free_port  # a port whose successor (controller) is free too

    kafka = free_port()
    taken = {kafka, kafka + 1}
    ports: dict[str, int] = {"kafka": kafka}
    for name in ("api", "dashboard", "worker0", "worker1"):
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        ports[name] = port
    return ports


def _environment(home: Path, ports: dict[str, int], minutes: float) -> dict[str, str]:
    return {
        "ABLAB_HOME": str(home),
        "ABLAB_API_PORT": str(ports["api"]),
        "ABLAB_API_URL": f"http://127.0.0.1:{ports['api']}",
        "ABLAB_DASHBOARD_PORT": str(ports["dashboard"]),
        "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{ports['kafka']}",
        "ABLAB_DEMO_WORKER_PORTS": json.dumps([ports["worker0"], ports["worker1"]]),
        "ABLAB_DEMO_DURATION_S": str(int(minutes * 60)),
    }


def _stack(soak: Soak):
    """The same Service definitions `ablab up --demo` uses, to restart exactly one of them."""
    from ablab.cli.stack import _services
    from ablab.cli.supervisor.processes import Supervisor
    from ablab.platform.config import get_settings

    get_settings.cache_clear()
    tokens = json.loads((soak.home / "run" / "demo-tokens.json").read_text())
    services = {s.name: s for s in _services(get_settings(), True, tokens)}
    return Supervisor(soak.home), services


def _record_pids(soak: Soak) -> None:
    for pidfile in (soak.home / "run").glob("*.pid"):
        try:
            soak.pids_seen[pidfile.stem].add(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            pass
    broker = soak.home / "kafka" / "broker.pid"
    try:
        soak.pids_seen["kafka"].add(int(broker.read_text().split("\n")[0]))
    except (OSError, ValueError):
        pass


# --------------------------------------------------------------------------- faults


def _kill_group(pid: int, timeout_s: float = 10.0) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def fault_broker(soak: Soak, supervisor: Any, services: dict, *, outage_s: float) -> str:
    t0 = time.monotonic()
    supervisor.stop(services["kafka"])
    stopped_s = time.monotonic() - t0
    time.sleep(outage_s)
    supervisor.start(services["kafka"])
    return f"clean stop {stopped_s:.1f} s, down {outage_s:.0f} s, back in {time.monotonic() - t0 - stopped_s - outage_s:.1f} s"


def fault_flink(soak: Soak, supervisor: Any, services: dict) -> str:
    from ablab.streaming.flink.job import latest_checkpoint

    checkpoints = soak.home / "flink" / "checkpoints"
    # Kill a job that is checkpointing (one completed in the last 10 s), so the restart
    # restores state rather than starting over; wait for that at most 90 s, then kill anyway.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        before = latest_checkpoint(checkpoints)
        if before is not None and time.time() - before.stat().st_mtime < 10:
            break
        time.sleep(1)
    before = latest_checkpoint(checkpoints)
    pid = supervisor.pid("stream")
    if pid is None:
        raise RuntimeError("the Flink job was not running before the kill")
    _kill_group(pid)
    time.sleep(3)
    supervisor.start(services["stream"])
    _record_pids(soak)
    # Running again once a checkpoint completes under a new job id (the killed job's folder stays).
    old_jobs = {p.name for p in checkpoints.iterdir()} if checkpoints.is_dir() else set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        now = latest_checkpoint(checkpoints)
        if now is not None and now.parent.name not in old_jobs:
            source = f"restored from {before.parent.name[:8]}/{before.name}" if before else \
                "no checkpoint had completed before the kill: restarted from the earliest offsets"
            return f"SIGKILL; {source}; new job {now.parent.name[:8]} checkpointed {now.name}"
        time.sleep(1)
    raise RuntimeError(f"no checkpoint from the restarted job within 180 s (last before the kill: {before})")


def fault_api(soak: Soak, supervisor: Any, services: dict) -> str:
    pid = supervisor.pid("api")
    t0 = time.monotonic()
    how = supervisor.stop(services["api"], timeout_s=30)
    exit_s = time.monotonic() - t0
    time.sleep(2)
    t1 = time.monotonic()
    supervisor.start(services["api"])
    _record_pids(soak)
    killed = " (needed SIGKILL: in-memory events lost)" if how.startswith("killed") else ""
    return f"SIGTERM pid {pid}: exited in {exit_s:.1f} s{killed}; ready again in {time.monotonic() - t1:.1f} s"


def fault_worker(soak: Soak, supervisor: Any, services: dict) -> str:
    pid = supervisor.pid("worker-1")
    if pid is None:
        raise RuntimeError("worker-1 was not running before the kill")
    served = _worker_served(services["worker-1"])
    _kill_group(pid)
    time.sleep(3)
    t1 = time.monotonic()
    supervisor.start(services["worker-1"])
    _record_pids(soak)
    return f"SIGKILL pid {pid} after {served} requests; healthy again in {time.monotonic() - t1:.1f} s"


def fault_poison(soak: Soak, supervisor: Any, services: dict) -> str:
    """Hostile records between the demo's ordinary traffic (issue 19): through the API, and
    straight to Kafka (a producer that bypasses the edge), on every partition."""
    from kafka import KafkaProducer

    from ablab.streaming.kafka.topics import EVENT_TOPICS, RAW_PARTITIONS

    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def event(case: str, **changes: Any) -> dict[str, Any]:
        trace = f"{POISON_PREFIX}{case}-{int(time.time() * 1000)}"
        soak.poison_traces.add(trace)
        return {"v": 1, "type": "inference", "ts": now, "trace_id": trace, "experiment": EXPERIMENT, "variant": "control",
                "unit_id": "poison", "ttft_ms": 1.0, "e2e_ms": 2.0, "tpot_ms": 1.0, "prompt_tokens": 1, "output_tokens": 2,
                "device_s": 0.001, "cost_usd": 0.0, "price_version": "poison", "strategy": "poison", **changes}

    sdk = soak.env.get("ABLAB_SOAK_SDK_TOKEN") or _sdk_token(soak)
    api = httpx.post(f"{soak.env['ABLAB_API_URL']}/v1/events", headers={"Authorization": f"Bearer {sdk}"}, timeout=10,
                     json={"events": [event("api-huge", e2e_ms=1.7e308), event("api-9999", ts="9999-12-31T00:00:00.000Z")]})
    producer = KafkaProducer(bootstrap_servers=soak.env["ABLAB_KAFKA_BOOTSTRAP"], acks="all")
    for partition in range(RAW_PARTITIONS):
        for record in (event(f"direct-huge-{partition}", e2e_ms=1.7e308),
                       event(f"direct-9999-{partition}", ts="9999-12-31T00:00:00.000Z")):
            producer.send(EVENT_TOPICS["inference"], json.dumps(record).encode(), key=record["trace_id"].encode(),
                          partition=partition)
        producer.send(EVENT_TOPICS["inference"], b"\x00 garbage " + POISON_PREFIX.encode(), partition=partition)
    producer.flush(30)
    producer.close()
    return (f"API answered {api.status_code} ({api.text[:80]}); {3 * RAW_PARTITIONS} records straight to Kafka "
            f"on {RAW_PARTITIONS} partitions")


def _sdk_token(soak: Soak) -> str:
    created = subprocess.run([ABLAB, "keys", "create", "--name", "soak-poison", "--scope", "sdk"], env={**os.environ, **soak.env},
                             capture_output=True, text=True, timeout=60, check=True)
    return created.stdout.strip().splitlines()[-1]


def _worker_served(service: Any) -> str:
    port = service.argv[service.argv.index("--port") + 1]
    try:
        return str(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json().get("served"))
    except (httpx.HTTPError, ValueError):
        return "?"


# --------------------------------------------------------------------------- watching


def _metrics(api_url: str) -> dict[str, float]:
    try:
        text = httpx.get(f"{api_url}/metrics", timeout=3).text
    except httpx.HTTPError:
        return {}
    from prometheus_client.parser import text_string_to_metric_families

    values = {}  # family name + label values, e.g. ablab_loader_loaded_rows_raw_events
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(("ablab_emitter", "ablab_ingest", "ablab_loader", "ablab_stream")):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            values["_".join([family.name, *sample.labels.values()])] = float(sample.value)
    return values


WATCHED = ("api", "stream", "outbox", "worker-0", "worker-1", "labeler-0", "labeler-1")


def _check_alive(soak: Soak, supervisor: Any, services: dict, *, heal: bool, busy: set[str]) -> None:
    """A watched service that died outside a fault is an unplanned exit: record it (and restart it)."""
    for name in WATCHED:
        if name not in services or name in busy or supervisor.pid(name) is not None:
            continue
        tail = supervisor.tail(name, lines=6).replace("\n", " | ")[-400:]
        record = FaultRecord(f"unplanned exit: {name}", soak.t(), detail=tail)
        console.log(f"[red]{name} is not running[/] (t={soak.t():.0f} s): {tail}")
        if heal:
            t0 = time.monotonic()
            try:
                supervisor.start(services[name])
                record.detail += f" → restarted in {time.monotonic() - t0:.1f} s"
            except RuntimeError as exc:
                record.detail += f" → restart failed: {exc}"
            _record_pids(soak)
        soak.faults.append(record)
    if "kafka" not in busy and not services["kafka"].health():
        soak.faults.append(FaultRecord("unplanned: broker not answering", soak.t()))
        if heal:
            supervisor.start(services["kafka"])


def _outbox_behind(directory: Path) -> dict[str, int]:
    try:
        positions = json.loads((directory / ".positions.json").read_text())
    except (OSError, ValueError):
        positions = {}
    return {p.name: p.stat().st_size - int(positions.get(p.name, 0)) for p in directory.glob("*.jsonl")}


def _load() -> tuple[float, float, float]:
    return os.getloadavg()


# --------------------------------------------------------------------------- emitted (ground truth)


def _argv_option(argv: list[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def _ledger(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def emitted_events(services: dict) -> tuple[dict[str, set[str]], float, dict[str, int]]:
    """trace_ids per type the emitters produced, the time the last label comes due, ledger sizes.

    One ledger line = one request served with a 200: the worker emitted its exposure and
    inference events before answering, the traffic generator its rum event before writing
    the line. The labeler's choices are a seeded function of its ledger, replayed here with
    the same arguments `ablab up` gave it.
    """
    from ablab.inference.labeler import Labeler, LabelerConfig
    from ablab.inference.serving.events import ListSink

    expected: dict[str, set[str]] = {t: set() for t in TYPES}
    last_due = 0.0
    sizes = {}
    for name, service in sorted(services.items()):
        if not name.startswith("labeler-"):
            continue
        argv = service.argv
        records = _ledger(Path(_argv_option(argv, "--ledger", "traffic-ledger.jsonl")))
        sizes[name.replace("labeler", "ledger")] = len(records)
        clock = [0.0]
        labeler = Labeler(LabelerConfig(fraction=float(_argv_option(argv, "--fraction", "0.2")),
                                        delay_median_s=float(_argv_option(argv, "--delay-median-min", "3.0")) * 60,
                                        delay_sigma=float(_argv_option(argv, "--delay-sigma", "0.6")),
                                        seed=int(_argv_option(argv, "--seed", "11"))), ListSink(), clock=lambda: clock[0])
        for record in records:
            for kind in ("exposure", "inference", "rum"):
                expected[kind].add(record["trace_id"])
            clock[0] = record["served_at"]
            labeler.offer(record)
        for pending in labeler.pending:
            expected["feedback"].add(pending.trace_id)
            last_due = max(last_due, pending.due)
    return expected, last_due, sizes


# --------------------------------------------------------------------------- Kafka and ClickHouse views


def _end_offsets(bootstrap: str, topics: list[str]) -> dict[Any, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", client_id="ablab-soak")
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in (consumer.partitions_for_topic(t) or ())]
        return dict(consumer.end_offsets(partitions))
    finally:
        consumer.close()


def loader_lag(bootstrap: str) -> int | None:
    """Records of the typed event topics the loader has not committed yet. (The windows topic
    is transactional: its commit markers keep a committed offset one short of the end, so it
    is judged by standing still instead.)"""
    from kafka import KafkaConsumer

    from ablab.streaming.kafka.topics import EVENT_TOPICS

    try:
        ends = _end_offsets(bootstrap, list(EVENT_TOPICS.values()))
        # An offset fetch only: this consumer never subscribes, so it never joins the group.
        probe = KafkaConsumer(bootstrap_servers=bootstrap, group_id="ablab-loader", enable_auto_commit=False,
                              client_id="ablab-soak-lag")
        try:
            committed = {tp: probe.committed(tp) or 0 for tp in ends}
        finally:
            probe.close()
    except Exception:
        return None
    return sum(max(0, end - committed[tp]) for tp, end in ends.items())


def kafka_view(bootstrap: str) -> dict[str, dict[str, Any]]:
    """Per type: records per trace_id and per event_id, as a read_committed reader sees them."""
    from kafka import KafkaConsumer

    from ablab.streaming.kafka.topics import EVENT_TOPICS

    view: dict[str, dict[str, Any]] = {t: {"trace": Counter(), "event": Counter(), "unassigned": set()} for t in TYPES}
    # Event-time disorder as the Flink job sees it: how far each inference event is behind the
    # largest ts read before it from its partition (what the out-of-orderness bound must cover).
    newest: dict[int, float] = {}
    behind: list[float] = []
    topics = [EVENT_TOPICS[t] for t in TYPES]
    ends = _end_offsets(bootstrap, topics)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                             client_id="ablab-soak-reader", consumer_timeout_ms=5000)
    consumer.assign(list(ends))
    consumer.seek_to_beginning()
    remaining = {tp for tp, end in ends.items() if end > 0}
    deadline = time.monotonic() + 300
    while remaining and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=1000, max_records=10_000).items():
            kind = tp.topic.removeprefix("ablab.")
            for record in records:
                try:
                    event = json.loads(record.value)
                except ValueError:  # the poison fault's garbage bytes: dead-lettered by the loader
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("experiment") == FLUSH_EXPERIMENT or str(event.get("trace_id", "")).startswith(POISON_PREFIX):
                    continue
                view[kind]["trace"][event.get("trace_id")] += 1
                view[kind]["event"][event.get("event_id")] += 1
                if kind == "inference" and isinstance(event.get("ts"), str):
                    ts = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
                    behind.append(max(0.0, newest.get(tp.partition, ts) - ts))
                    newest[tp.partition] = max(newest.get(tp.partition, ts), ts)
                if kind == "rum" and not event.get("experiment"):
                    view[kind]["unassigned"].add(event.get("trace_id"))
        remaining = {tp for tp in remaining if consumer.position(tp) < ends[tp]}
    consumer.close()
    if remaining:
        raise RuntimeError(f"could not read the topics to their end: {sorted(map(str, remaining))}")
    view["inference"]["disorder"] = disorder_summary(behind)
    return view


def disorder_summary(behind_s: list[float]) -> dict[str, Any]:
    """Quantiles of how far events are behind their partition's newest ts, and the share of
    events each candidate out-of-orderness bound would call late."""
    if not behind_s:
        return {"events": 0}
    ordered = sorted(behind_s)

    def q(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)

    return {"events": len(ordered), "p50_s": q(0.5), "p99_s": q(0.99), "p999_s": q(0.999), "max_s": round(ordered[-1], 3),
            "late_share_by_bound_s": {b: round(sum(1 for x in ordered if x >= b) / len(ordered), 5)
                                      for b in (1, 2, 3, 5, 8)}}


def clickhouse_view(home: Path) -> dict[str, Any]:
    """Read after `ablab down`: chDB allows one process per data directory, the API's while it runs."""
    from ablab.platform.config import get_settings
    from ablab.streaming.store import get_clickhouse_client

    get_settings.cache_clear()
    client = get_clickhouse_client(get_settings())
    try:
        per_trace: dict[str, dict[str, tuple[int, int]]] = {t: {} for t in TYPES}
        rows = client.query("SELECT type, trace_id, count(), uniqExact(event_id) FROM raw_events GROUP BY type, trace_id").result_rows
        for kind, trace, n_rows, n_ids in rows:
            if kind in per_trace:
                per_trace[kind][trace] = (int(n_rows), int(n_ids))
        final = dict(client.query("SELECT type, count() FROM raw_events FINAL GROUP BY type").result_rows)
        balance = client.query(
            """SELECT
                 (SELECT count() FROM raw_events FINAL WHERE type = 'inference' AND experiment = {e:String}),
                 (SELECT sum(n) FROM window_stats FINAL WHERE experiment = {e:String}),
                 (SELECT count() FROM late_events FINAL WHERE type = 'inference' AND experiment = {e:String}),
                 (SELECT count() FROM window_stats FINAL WHERE experiment = {e:String}),
                 (SELECT count() FROM raw_events FINAL WHERE type = 'rum' AND trace_id IN
                    (SELECT trace_id FROM raw_events FINAL WHERE type = 'inference' AND experiment = {e:String})),
                 (SELECT count() FROM raw_events FINAL WHERE type = 'rum')""",
            parameters={"e": EXPERIMENT}).result_rows[0]
        dead = client.query("SELECT field, count() FROM dead_letters FINAL GROUP BY field").result_rows
        # Where the window identity breaks: per 10 s window, raw events vs Σ n + late.
        gaps = client.query(
            """SELECT r.ws, sum(r.n), sum(w.n), sum(l.n) FROM
                 (SELECT variant, toStartOfInterval(ts, INTERVAL 10 SECOND) AS ws, count() AS n FROM raw_events FINAL
                  WHERE type = 'inference' AND experiment = {e:String} GROUP BY variant, ws) AS r
               LEFT JOIN (SELECT variant, toDateTime(window_start) AS ws, n FROM window_stats FINAL
                          WHERE experiment = {e:String}) AS w ON r.variant = w.variant AND r.ws = w.ws
               LEFT JOIN (SELECT variant, toStartOfInterval(ts, INTERVAL 10 SECOND) AS ws, count() AS n FROM late_events FINAL
                          WHERE type = 'inference' AND experiment = {e:String} GROUP BY variant, ws) AS l
                 ON r.variant = l.variant AND r.ws = l.ws
               GROUP BY r.ws HAVING sum(r.n) != sum(w.n) + sum(l.n) ORDER BY r.ws""",
            parameters={"e": EXPERIMENT}).result_rows
    finally:
        close = getattr(client, "close", None)
        if close:
            close()
    raw, windowed, late, windows, rum_attributed, rum_raw = (int(v or 0) for v in balance)
    return {"per_trace": per_trace, "final": {k: int(v) for k, v in final.items()},
            "windows": {"raw_inference": raw, "windowed": windowed, "late": late, "window_rows": windows,
                        "balanced": raw == windowed + late, "rum_attributed": rum_attributed, "rum_raw": rum_raw,
                        "gaps": [{"window_start": str(ws), "raw": int(r), "windowed": int(w), "late": int(lt)}
                                 for ws, r, w, lt in gaps]},
            "dead_letters": {k: int(v) for k, v in dead}}


def _unassigned(expected: dict[str, set[str]], kafka: dict[str, dict[str, Any]]) -> set[str]:
    """Requests a worker served before it had the SDK config (right after a restart): no
    assignment, so no exposure or inference event; their rum event says so (experiment null)."""
    return kafka["rum"]["unassigned"] & expected["rum"]


def reconcile(expected: dict[str, set[str]], kafka: dict[str, dict[str, Any]], ch: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for kind in TYPES:
        want = expected[kind]
        in_kafka = set(kafka[kind]["trace"])
        stored = ch["per_trace"][kind]
        doubled = {t: ids for t, (_, ids) in stored.items() if ids > 1}
        lost = sorted(want - set(stored))
        report[kind] = {
            "emitted": len(want),
            "in_kafka": len(want & in_kafka),
            "stored": len(want & set(stored)),
            "lost": len(lost),
            "lost_before_kafka": len(want - in_kafka),
            "lost_after_kafka": len((want & in_kafka) - set(stored)),
            "duplicated": len(doubled),
            "extra_rows_from_duplicates": sum(ids - 1 for ids in doubled.values()),
            "kafka_records": sum(kafka[kind]["event"].values()),
            "kafka_redelivered": sum(n - 1 for n in kafka[kind]["event"].values() if n > 1),
            "rows_before_merge": sum(n for n, _ in stored.values()),
            "stored_final": ch["final"].get(kind, 0),
            "unexpected": len(set(stored) - want),
            "lost_ids": lost[:20],
            "duplicated_ids": sorted(doubled)[:20],
        }
    return report


# --------------------------------------------------------------------------- the run


DRAIN_STEPS: list[dict[str, Any]] = []


def _wait(what: str, check: Any, *, timeout_s: float, progress: Progress, task: Any, poll_s: float = 2.0) -> bool:
    started = time.monotonic()
    deadline = started + timeout_s
    note = ""
    while time.monotonic() < deadline:
        done, note = check()
        progress.update(task, description=f"drain: {what} — {note}")
        if done:
            DRAIN_STEPS.append({"step": what, "reached": True, "s": round(time.monotonic() - started, 1)})
            return True
        time.sleep(poll_s)
    console.log(f"[yellow]drain: {what} not reached in {timeout_s:.0f} s ({note})[/]")
    DRAIN_STEPS.append({"step": what, "reached": False, "s": round(timeout_s), "last": note})
    return False


def _push_watermark(bootstrap: str) -> None:
    """One future-stamped inference event per partition, in an experiment the registry does not know:
    the Flink watermark passes every demo window (so they close) and the loader dead-letters these."""
    from kafka import KafkaProducer

    from ablab.streaming.kafka.topics import EVENT_TOPICS, RAW_PARTITIONS

    # The job's JSON format wants ISO-8601 with milliseconds and a Z (the API normalizes events
    # to it; these bypass the API), else ts parses as NULL and the event is ignored.
    ts = (datetime.now(UTC) + timedelta(seconds=40)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for partition in range(RAW_PARTITIONS):
        trace = f"soak-flush-{partition}-{int(time.time())}"
        common = {"v": 1, "ts": ts, "trace_id": trace, "event_id": trace + "-x", "experiment": FLUSH_EXPERIMENT,
                  "variant": "flush", "unit_id": "flush"}
        inference = {**common, "type": "inference", "ttft_ms": 1.0, "e2e_ms": 2.0, "tpot_ms": 1.0, "prompt_tokens": 1,
                     "output_tokens": 2, "device_s": 0.001, "cost_usd": 0.0, "price_version": "flush", "strategy": "flush"}
        producer.send(EVENT_TOPICS["inference"], json.dumps(inference).encode(), key=trace.encode(), partition=partition)
    producer.flush(30)
    producer.close()


def run(args: argparse.Namespace) -> int:
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="ablab-soak-")) / "home"
    if home.exists() and any(home.iterdir()):
        console.print(f"[red]{home} is not empty; the soak needs a fresh ABLAB_HOME[/]")
        return 2
    ports = _free_ports()
    env = _environment(home, ports, args.minutes)
    os.environ.update(env)  # this process reads the same settings (services, chDB path)
    child_env = {**os.environ}
    soak = Soak(home=home, env=env, minutes=args.minutes)
    api_url = env["ABLAB_API_URL"]
    bootstrap = env["ABLAB_KAFKA_BOOTSTRAP"]
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        console.print(f"[red]--faults: unknown {sorted(unknown)}; choose from {','.join(FAULTS)}[/]")
        return 2
    duration = args.minutes * 60
    schedule = [(duration * (i + 1) / (len(faults) + 1), name) for i, name in enumerate(faults)]
    console.print(f"soak: {args.minutes:g} min, faults {faults or 'none'} at "
                  f"{', '.join(f'{at:.0f} s' for at, _ in schedule)}; ABLAB_HOME={home}; ports {ports}")
    result: dict[str, Any] = {"command": " ".join(sys.argv), "minutes": args.minutes, "ports": ports, "home": str(home),
                              "started_utc": datetime.now(UTC).isoformat(timespec="seconds")}
    wall0 = time.monotonic()
    supervisor = None
    try:
        with console.status("ablab up --demo (broker, API, Flink job, dashboard, workers, traffic, labelers)…"):
            up = subprocess.run([ABLAB, "up", "--demo"], env=child_env, capture_output=True, text=True,
                                timeout=args.up_timeout_s, check=False)
        result["up_s"] = round(time.monotonic() - wall0, 1)
        if up.returncode != 0:
            console.print(f"[red]ablab up --demo failed[/]\n{up.stdout[-3000:]}{up.stderr[-3000:]}")
            return 2
        console.log(f"stack up in {result['up_s']:.0f} s")
        soak.started = time.monotonic()
        supervisor, services = _stack(soak)
        _record_pids(soak)
        heal = not args.no_heal
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total} s"),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            task = progress.add_task("soak", total=duration)
            pending = list(schedule)
            while soak.t() < duration:
                if pending and soak.t() >= pending[0][0]:
                    _, name = pending.pop(0)
                    record = FaultRecord(name, round(soak.t(), 1))
                    progress.update(task, description=f"[yellow]fault: {name}[/]")
                    t0 = time.monotonic()
                    try:
                        if name == "broker":
                            record.detail = fault_broker(soak, supervisor, services, outage_s=args.broker_outage_s)
                        elif name == "flink":
                            record.detail = fault_flink(soak, supervisor, services)
                        elif name == "api":
                            record.detail = fault_api(soak, supervisor, services)
                        elif name == "poison":
                            record.detail = fault_poison(soak, supervisor, services)
                        else:
                            record.detail = fault_worker(soak, supervisor, services)
                        record.ok = True
                    except Exception as exc:
                        record.detail = f"{type(exc).__name__}: {exc}"
                    record.took_s = round(time.monotonic() - t0, 1)
                    soak.faults.append(record)
                    console.log(f"{'[green]' if record.ok else '[red]'}fault {name}[/] at {record.at_s:.0f} s: {record.detail}")
                _check_alive(soak, supervisor, services, heal=heal, busy=set())
                soak.load.append(_load())
                m = _metrics(api_url)
                progress.update(task, completed=min(soak.t(), duration), description=(
                    f"soak  accepted {m.get('ablab_ingest_events_events_accepted', 0):.0f}  "
                    f"loaded {m.get('ablab_loader_loaded_rows_raw_events', 0):.0f}  "
                    f"spool {m.get('ablab_emitter_state_spool_pending', 0):.0f}  load {soak.load[-1][0]:.1f}"))
                time.sleep(2)
            progress.update(task, completed=duration)
            for at, name in pending:  # the run ended before these came up: the soak did not test them
                soak.faults.append(FaultRecord(name, round(at, 1), detail="not injected: the run ended first (use more --minutes)"))

            # ---- drain: let in-flight work finish before counting (each step bounded)
            drain0 = time.monotonic()
            dtask = progress.add_task("drain", total=None)
            _wait("traffic finished", lambda: (all(supervisor.pid(n) is None for n in services if n.startswith("traffic-")),
                                               "waiting for the traffic generators to exit"),
                  timeout_s=180, progress=progress, task=dtask)
            expected, last_due, sizes = emitted_events(services)
            _wait("labels due", lambda: (time.time() > last_due + 3, f"last label due in {last_due + 3 - time.time():.0f} s"),
                  timeout_s=max(0.0, last_due + 10 - time.time()) + 30, progress=progress, task=dtask, poll_s=1)

            def _api_drained() -> tuple[bool, str]:
                m = _metrics(api_url)
                pending_n = sum(m.get(f"ablab_emitter_state_{k}", 1) for k in ("queued", "inflight", "spool_pending"))
                return bool(m) and pending_n == 0, f"API emitter queued+inflight+spool {pending_n:.0f}"

            time.sleep(3)  # labelers' and workers' HTTP sinks flush every 0.5 s
            outbox = home / "outbox"
            if outbox.is_dir():  # the demo's emitters write event files that a forwarder ships
                _wait("outbox shipped", lambda: (not any(_outbox_behind(outbox).values()),
                                                 f"bytes not yet acknowledged {sum(_outbox_behind(outbox).values())}"),
                      timeout_s=args.drain_timeout_s, progress=progress, task=dtask)
            _wait("API emitter drained", _api_drained, timeout_s=args.drain_timeout_s, progress=progress, task=dtask)
            _push_watermark(bootstrap)
            stable: list[Any] = [None, 0]

            def _loaded() -> tuple[bool, str]:
                lag = loader_lag(bootstrap)
                try:
                    ends = _end_offsets(bootstrap, ["ablab.windows"])
                except Exception:
                    ends = None
                m = _metrics(api_url)
                key = (lag, tuple(sorted((str(k), v) for k, v in (ends or {}).items())),
                       tuple(sorted((k, v) for k, v in m.items() if k.startswith("ablab_loader_loaded_rows"))))
                stable[1] = stable[1] + 1 if key == stable[0] else 0
                stable[0] = key
                return lag == 0 and ends is not None and stable[1] >= 5, \
                    f"loader lag {lag}, windows topic and loader counts unchanged for {stable[1]} polls"

            _wait("loader caught up, windows closed", _loaded, timeout_s=args.drain_timeout_s, progress=progress, task=dtask)
            result["drain_s"] = round(time.monotonic() - drain0, 1)
            result["drain_steps"] = DRAIN_STEPS
            progress.update(dtask, description="reading every record of the event topics")
            kafka = kafka_view(bootstrap)
        result["ledgers"] = sizes
        result["load_avg"] = {"max_1m": round(max(x[0] for x in soak.load), 2),
                              "mean_1m": round(sum(x[0] for x in soak.load) / len(soak.load), 2), "end": _load()}
    finally:
        _record_pids(soak)
        with console.status("ablab down"):
            t0 = time.monotonic()
            down = _run_reaping([ABLAB, "down"], env=child_env, supervisor=supervisor, timeout_s=300)
            result["down_s"] = round(time.monotonic() - t0, 1)
        time.sleep(1)
        leaked = _leaked(soak)
        result["leaked_process_groups"] = leaked
        if leaked:
            console.print(f"[red]process groups left after `ablab down`: {leaked}; killing them[/]")
            for pids in leaked.values():
                for pid in pids:
                    _kill_group(pid)
        if down.returncode != 0:
            console.print(f"[red]ablab down failed[/]: {down.stdout[-2000:]}{down.stderr[-2000:]}")
    if "load_avg" not in result:
        return 2
    ch = clickhouse_view(home)
    unassigned = _unassigned(expected, kafka)
    for kind in ("exposure", "inference"):
        expected[kind] -= unassigned
    result.update(faults=[asdict(f) for f in soak.faults], types=reconcile(expected, kafka, ch), windows=ch["windows"],
                  dead_letters=ch["dead_letters"], served_without_assignment=len(unassigned),
                  disorder=kafka["inference"].get("disorder"),
                  poison={"sent": len(soak.poison_traces),
                          "stored": sorted(t for t in soak.poison_traces if t in ch["per_trace"]["inference"])},
                  wall_s=round(time.monotonic() - wall0, 1))
    ok = _print_report(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=1, default=str))
    if not args.keep:
        shutil.rmtree(home.parent if home.parent.name.startswith("ablab-soak-") else home, ignore_errors=True)
    return 0 if ok else 1


def _run_reaping(argv: list[str], *, env: dict[str, str], supervisor: Any, timeout_s: float) -> subprocess.CompletedProcess:
    """Run `ablab down` while reaping the services this process restarted: their exited
    leaders would otherwise stay zombies of ours and look alive to `down`."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        if supervisor is not None:
            for name in list(supervisor._children):
                supervisor.pid(name)
        time.sleep(0.2)
    if process.poll() is None:
        process.kill()
    output = process.communicate()[0]
    if supervisor is not None:
        for name in list(supervisor._children):
            supervisor.pid(name)
    return subprocess.CompletedProcess(argv, process.returncode, output, "")


def _leaked(soak: Soak) -> dict[str, list[int]]:
    leaked: dict[str, list[int]] = {}
    for name, pids in soak.pids_seen.items():
        for pid in pids:
            try:
                os.killpg(pid, 0) if name != "kafka" else os.kill(pid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            leaked.setdefault(name, []).append(pid)
    return leaked


def _print_report(result: dict[str, Any]) -> bool:
    table = Table(title=f"soak {result['minutes']:g} min: emitted vs ClickHouse (by trace_id; duplicates by event_id)")
    for column in ("type", "emitted", "in Kafka", "stored", "lost", "duplicated", "Kafka redelivered",
                   "rows before merge", "unexpected"):
        table.add_column(column, justify="right" if column != "type" else "left")
    ok = True
    for kind, r in result["types"].items():
        bad = r["lost"] or r["duplicated"]
        ok &= not bad
        style = "red" if bad else "green"
        table.add_row(kind, str(r["emitted"]), str(r["in_kafka"]), str(r["stored"]), f"[{style}]{r['lost']}[/]",
                      f"[{style}]{r['duplicated']}[/]", str(r["kafka_redelivered"]), str(r["rows_before_merge"]),
                      str(r["unexpected"]))
    out.print(table)
    w = result["windows"]
    ok &= w["balanced"]
    out.print(f"windows: raw inference {w['raw_inference']} = Σ window n {w['windowed']} + late {w['late']} "
              f"→ {'[green]balanced[/]' if w['balanced'] else '[red]NOT balanced (Δ ' + str(w['raw_inference'] - w['windowed'] - w['late']) + ')[/]'}"
              f" over {w['window_rows']} window rows; RUM attributed to a request {w['rum_attributed']} of {w['rum_raw']}")
    if w.get("gaps"):
        out.print("windows that do not balance (start: raw vs Σ n + late): " + "; ".join(
            f"{g['window_start'][11:19]}: {g['raw']} vs {g['windowed']}+{g['late']}" for g in w["gaps"][:12]))
    if result.get("disorder"):
        out.print(f"event-time disorder of inference events per partition: {result['disorder']}")
    poison = result.get("poison") or {}
    if poison.get("sent"):
        ok &= not poison["stored"]
        out.print(f"poison: {poison['sent']} hostile records; stored {len(poison['stored'])} "
                  f"{'[green](none: refused or dead-lettered)[/]' if not poison['stored'] else '[red]' + str(poison['stored'][:5]) + '[/]'}; "
                  f"dead letters by field {result.get('dead_letters')}")
    faults = Table(title="fault timeline")
    for column in ("t (s)", "fault", "took (s)", "ok", "detail"):
        faults.add_column(column)
    for f in result["faults"]:
        ok &= f["ok"] or f["name"].startswith("unplanned")
        faults.add_row(f"{f['at_s']:.0f}", f["name"], f"{f['took_s']:.1f}", "yes" if f["ok"] else "[red]no[/]", f["detail"][:160])
    out.print(faults)
    for kind, r in result["types"].items():
        if r["lost_ids"] or r["duplicated_ids"]:
            out.print(f"{kind}: lost before Kafka {r['lost_before_kafka']}, after Kafka {r['lost_after_kafka']}; "
                      f"lost ids {r['lost_ids'][:5]}; duplicated ids {r['duplicated_ids'][:5]}")
    for step in result.get("drain_steps", []):
        if not step["reached"]:
            out.print(f"[yellow]drain step not reached in {step['s']} s: {step['step']} ({step.get('last', '')}); "
                      "what is still in flight counts as lost[/]")
    leaked = result.get("leaked_process_groups")
    ok &= not leaked
    la = result["load_avg"]
    out.print(f"up {result['up_s']} s, drain {result.get('drain_s')} s, down {result['down_s']} s, wall {result['wall_s']} s; "
              f"load average 1-min mean {la['mean_1m']}, max {la['max_1m']}; dead letters {result['dead_letters']}; "
              f"leaked process groups: {leaked or 'none'}")
    out.print("[green]PASS: nothing lost, nothing counted twice[/]" if ok else "[red]FAIL[/]")
    return ok


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="soak.py", description=__doc__,
        epilog="Prints the reconciliation table and fault timeline; exit 0 = nothing lost or double-counted. "
               "Needs Java 17 and Maven (as `ablab up`). Loopback only; stops everything it started.",
        formatter_class=_HelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="How long traffic runs and faults are spread over.")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"Comma-separated, injected in this order, evenly spaced: {','.join(FAULTS)} (empty: none).")
    parser.add_argument("--broker-outage-s", type=float, default=15.0, help="How long the broker stays down.")
    parser.add_argument("--drain-timeout-s", type=float, default=240.0, help="Bound on each drain step after the traffic.")
    parser.add_argument("--up-timeout-s", type=float, default=600.0, help="Bound on `ablab up --demo`.")
    parser.add_argument("--home", help="ABLAB_HOME to use (must be empty; default: a new temp dir).")
    parser.add_argument("--no-heal", action="store_true", help="Leave a service that dies on its own dead (default: restart it, recorded).")
    parser.add_argument("--json-out", help="Also write every figure as JSON here.")
    parser.add_argument("--keep", action="store_true", help="Keep ABLAB_HOME (logs, chDB, ledgers) after the run.")
    args = parser.parse_args()
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
