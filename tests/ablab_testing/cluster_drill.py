"""The cluster fault drill: a canned stream through a Kafka cluster, a Flink session
cluster and several loaders in one group while one broker, one TaskManager and one loader
are killed; every window must still equal the offline computation
(:mod:`ablab_testing.flink_reference`), and the per-unit rollup must count every event
once.

Real parts only: N KRaft brokers (:func:`ablab.streaming.kafka.broker.start_cluster`),
a JobManager and TaskManagers (:mod:`ablab.streaming.flink.cluster`) running the job
submitted as on any cluster (parallelism 2, checkpoints in a shared directory), and
``loaders`` loaders in one consumer group writing to chDB, each batching under its own lock
as separate processes would. The killed loader dies between its store writes and its offset
commit, the worst moment: the survivors replay what it had not committed. Each step waits on observable state: checkpoint ids and restores
from the JobManager's REST API, rows in the store. Used by
``tests/integration/cluster/test_cluster_faults.py`` (short) and
``benchmarks/cluster_drill.py`` (full, with timings).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ablab.streaming.flink import cluster as flink_cluster
from ablab.streaming.flink import rest
from ablab.streaming.kafka import broker
from ablab.streaming.localhost import server_ports
from ablab_testing import flink_reference as ref
from ablab_testing.pipeline import PipelineTopics, RawProducer, job_config, wait_for

EXPERIMENT = "drill"
OUT_OF_ORDERNESS_MS = 2000


def _dying_loader(base: type, armed: threading.Event) -> type:
    """``base`` whose next offset commit after ``armed`` is set raises: killed mid-batch."""
    class DyingLoader(base):  # type: ignore[misc, valid-type]
        dies = True

        def _commit(self) -> None:
            if armed.is_set():
                raise RuntimeError("loader killed between its store writes and its offset commit")
            super()._commit()

    return DyingLoader


@dataclass
class DrillResult:
    expected: dict[tuple[str, str, int], dict[str, Any]]
    windows: dict[tuple[str, str, int], dict[str, Any]]
    balance: dict[str, Any]
    raw_expected: int
    restored_checkpoint: int | None
    checkpoint_before_tm_kill: int | None
    killed_broker: int
    killed_taskmanager: int
    events: int
    timings: dict[str, float] = field(default_factory=dict)
    loaders: int = 1
    killed_loader: bool = False
    rollup_requests: int | None = None  # Σ requests over the unit_stats rows of the experiment
    loader_restarts: int = 0  # reconnects of the surviving loaders after a failed consume loop
    loader_errors: list[str] = field(default_factory=list)  # what ended a loader for good

    def mismatches(self) -> list[str]:
        """Every difference between the store and the offline computation (empty: exact)."""
        problems = [f"missing window {key}" for key in sorted(set(self.expected) - set(self.windows))]
        problems += [f"unexpected window {key}" for key in sorted(set(self.windows) - set(self.expected))]
        for key in sorted(set(self.expected) & set(self.windows)):
            problems += [f"{key} {name}: {self.windows[key][name]!r} != {value!r}"
                         for name, value in self.expected[key].items() if not _equal(name, self.windows[key][name], value)]
        if not self.balance.get("balanced") or self.balance.get("raw") != self.raw_expected:
            problems.append(f"reconciliation {self.balance} (raw expected {self.raw_expected})")
        if self.rollup_requests is not None and self.rollup_requests != self.raw_expected:
            problems.append(f"unit_stats counts {self.rollup_requests} requests, expected {self.raw_expected}")
        return problems


def _equal(name: str, actual: Any, expected: Any) -> bool:
    if name.endswith(("_p50", "_p95", "_p99")):
        import math

        return math.isclose(actual, expected, rel_tol=1e-12, abs_tol=1e-9)
    return actual == expected  # counts and sums: exactly


def _ms(moment: datetime) -> int:
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


def store_windows(store, experiment: str = EXPERIMENT) -> dict[tuple[str, str, int], dict[str, Any]]:
    result = store.query("SELECT * FROM window_stats FINAL WHERE experiment = {e:String}", parameters={"e": experiment})
    rows = [dict(zip(result.column_names, values)) for values in result.result_rows]
    return {(r["experiment"], r["variant"], _ms(r["window_start"])): r for r in rows}


def _rollup_requests(store, experiment: str = EXPERIMENT) -> int:
    return int(store.query("SELECT sum(requests) FROM unit_stats FINAL WHERE experiment = {e:String}",
                           parameters={"e": experiment}).result_rows[0][0] or 0)


def run_drill(*, workdir: Path, windows: int = 6, per_window: int = 40, brokers: int = 3, taskmanagers: int = 2,
              kill_broker: int = 2, kill_taskmanager: int = 1, loaders: int = 2, kill_loader: bool = True,
              timeout_s: float = 240.0, say: Callable[[str], None] = lambda _: None) -> DrillResult:
    """Run the whole drill in ``workdir``; every process it starts is stopped before it returns."""
    from ablab.streaming.loader.service import Loader
    from ablab.streaming.store import apply_ddl, make_client, queries

    timings: dict[str, float] = {}
    began = time.monotonic()

    def mark(name: str) -> None:
        timings[name] = round(time.monotonic() - began, 1)
        say(f"{timings[name]:7.1f}s  {name}")

    kafka = broker.ClusterConfig(directory=workdir / "kafka", brokers=brokers, port=server_ports(2 * brokers),
                                 heap_mb=320)
    ports = server_ports(2)
    flink = flink_cluster.FlinkClusterConfig(directory=workdir / "flink", taskmanagers=taskmanagers,
                                             rest_port=ports, rpc_port=ports + 1)
    store = make_client(f"chdb:///{workdir / 'chdb'}")
    apply_ddl(store)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    start -= timedelta(seconds=start.second % 10)
    first = ref.canned_stream(start=start, windows=windows, per_window=per_window, experiment=EXPERIMENT, seed=31)
    second = ref.canned_stream(start=start + timedelta(seconds=10 * windows), windows=windows, per_window=per_window,
                               experiment=EXPERIMENT, seed=32)
    closing = ref.closing_events(at=start + timedelta(seconds=20 * windows + 60), experiment="flush")
    half = len(second.inference) // 2
    third = half // 2
    stop_loader = threading.Event()
    loader_threads: list[threading.Thread] = []
    loader_failures: list[BaseException] = []
    armed = threading.Event()
    producer: RawProducer | None = None
    job_id: str | None = None
    try:
        # Both clusters start at once: the JVMs' start-up overlaps.
        flink_started: dict[str, Any] = {}
        flink_thread = threading.Thread(target=lambda: flink_started.update(
            status=_catch(lambda: flink_cluster.start_cluster(config=flink))), daemon=True)
        flink_thread.start()
        broker.start_cluster(config=kafka)
        mark(f"kafka cluster of {brokers} up")
        flink_thread.join()
        if isinstance(flink_started.get("status"), BaseException):
            raise flink_started["status"]
        mark(f"flink cluster with {taskmanagers} TaskManagers up")

        topics = PipelineTopics.unique("drill")
        topics.create(bootstrap=kafka.bootstrap)
        common = dict(group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.windows),
                      windows_topic=topics.windows, deadletter_topic=topics.deadletter, batch_max_records=200)

        def run_loader(loader: Loader) -> None:
            try:
                if getattr(loader, "dies", False):
                    loader.run(stop_loader)  # killed for good: no restart
                else:
                    loader.supervise(stop_loader)  # as `ablab loader` runs: reconnect after a failure
            except BaseException as exc:
                loader_failures.append(exc)

        members: list[Loader] = []
        for i in range(loaders):
            kind = _dying_loader(Loader, armed) if kill_loader and i == 0 and loaders > 1 else Loader
            loader = kind(store, kafka.bootstrap, batch_lock=threading.RLock(), **common)
            members.append(loader)
            loader_threads.append(threading.Thread(target=run_loader, args=(loader,), daemon=True))
            loader_threads[-1].start()
        mark(f"{loaders} loader(s) in one group")
        config = flink_cluster.cluster_job_config(job_config(
            topics, bootstrap=kafka.bootstrap, checkpoint_dir=workdir / "flink" / "checkpoints",
            parallelism=2, out_of_orderness_s=OUT_OF_ORDERNESS_MS / 1000))
        job_id = flink_cluster.submit(rest_url=flink.rest_url, config=config, conf_dir=flink.conf_dir,
                                      log_dir=workdir / "flink" / "logs" / "client")
        mark(f"job {job_id} submitted")
        rest.wait_for_checkpoint(flink.rest_url, job_id, timeout_s=timeout_s)
        mark("first checkpoint")

        producer = RawProducer(kafka.bootstrap)
        producer.send(topics.inference, first.inference)
        wait_for(lambda: len(store_windows(store)) >= 4, timeout_s=timeout_s, what="windows before the faults",
                 on_timeout=lambda: _diagnosis(flink, job_id))
        mark("first windows in the store")

        broker.kill_broker(directory=kafka.node(kill_broker).directory)
        mark(f"broker {kill_broker} killed")
        producer.send(topics.inference, second.inference[:half])  # acks=all: 2 of 3 in sync
        before = rest.job_status(flink.rest_url, job_id).latest_checkpoint
        checkpoint = rest.wait_for_checkpoint(flink.rest_url, job_id, after=before, timeout_s=timeout_s)
        mark(f"checkpoint {checkpoint} completed with a broker down")

        flink_cluster.kill_taskmanager(directory=flink.directory, index=kill_taskmanager)
        mark(f"TaskManager {kill_taskmanager} killed")
        killed_loader = False
        if kill_loader and loaders > 1:
            armed.set()
            producer.send(topics.inference, second.inference[half:half + third])
            wait_for(lambda: not loader_threads[0].is_alive(), timeout_s=timeout_s,
                     what="the armed loader's death at its next commit")
            killed_loader = True
            mark("loader 0 killed between its store writes and its commit")
            producer.send(topics.inference, second.inference[half + third:])
        else:
            producer.send(topics.inference, second.inference[half:])

        def restored() -> bool:
            status = rest.job_status(flink.rest_url, job_id)
            return (status.restored_checkpoint is not None and status.state == "RUNNING"
                    and status.running_tasks == status.total_tasks)

        wait_for(restored, timeout_s=timeout_s, what="the job restored from a checkpoint",
                 on_timeout=lambda: _diagnosis(flink, job_id))
        restored_from = rest.job_status(flink.rest_url, job_id).restored_checkpoint
        mark(f"job restored from checkpoint {restored_from} on the surviving TaskManager")
        producer.send(topics.inference, closing)

        events = first.inference + second.inference
        late = ref.late_ids(events + closing, out_of_orderness_ms=OUT_OF_ORDERNESS_MS, partitions=3)
        expected = ref.inference_windows(events, late_ids=late)
        raw_expected = len(ref.dedup(events))

        def exact() -> bool:
            balance = queries.reconciliation(store, experiment=EXPERIMENT)
            return balance.get("raw") == raw_expected and not DrillResult(
                expected, store_windows(store), balance, raw_expected, None, None, 0, 0, 0,
                rollup_requests=_rollup_requests(store)).mismatches()

        try:
            wait_for(exact, timeout_s=timeout_s, what="every window equal to the offline computation")
            mark("every window exact")
        except TimeoutError:
            mark("timed out waiting for exact windows")
            for i, member in enumerate(members):
                consumer = member._consumer
                say(f"loader {i}: consumed {member.stats.consumed} batches {member.stats.batches} "
                    f"failures {member.stats.failures} restarts {member.stats.restarts} "
                    f"last error {member.stats.last_error!r} "
                    f"committed {dict(member.stats.committed)} lag {dict(member.stats.lag)} "
                    f"assignment {sorted(map(tuple, consumer.assignment())) if consumer is not None else None}")
            say(_transaction_diagnosis(kafka.bootstrap, topics.windows, expected, store_windows(store)))
            say(_log_diagnosis(flink.directory / "logs"))
        return DrillResult(expected=expected, windows=store_windows(store),
                           balance=queries.reconciliation(store, experiment=EXPERIMENT), raw_expected=raw_expected,
                           restored_checkpoint=restored_from, checkpoint_before_tm_kill=checkpoint,
                           killed_broker=kill_broker, killed_taskmanager=kill_taskmanager,
                           events=len(events) + len(closing), timings=timings, loaders=loaders,
                           killed_loader=killed_loader, rollup_requests=_rollup_requests(store),
                           loader_restarts=sum(m.stats.restarts for m in members),
                           loader_errors=[f"{type(e).__name__}: {e}" for e in loader_failures])
    finally:
        if producer is not None:
            producer.close()
        if job_id is not None:
            try:
                rest.cancel(flink.rest_url, job_id)
            except rest.RestError:
                pass
        stop_loader.set()
        for thread in loader_threads:
            thread.join(timeout=30)
        flink_cluster.stop_cluster(directory=flink.directory, timeout_s=10)
        broker.stop_cluster(directory=kafka.directory, timeout_s=10)
        store.close()


def _catch(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:
        return exc


def _diagnosis(flink: flink_cluster.FlinkClusterConfig, job_id: str | None) -> str:
    lines = []
    try:
        lines.append(str(rest.get(flink.rest_url, "/overview")))
        if job_id:
            lines.append(str(rest.job_status(flink.rest_url, job_id)))
            exceptions = rest.get(flink.rest_url, f"/jobs/{job_id}/exceptions")
            lines.append(str(exceptions.get("root-exception", ""))[:2000])
    except rest.RestError as exc:
        lines.append(str(exc))
    return "\n".join(lines)


def _transaction_diagnosis(bootstrap: str, topic: str, expected: dict, stored: dict) -> str:
    """Tells a window Flink never emitted from one it emitted but the loader cannot see.

    Per partition of the windows topic: the high watermark (read_uncommitted end offset)
    against the last stable offset (read_committed end offset). An LSO held below the
    high watermark is an open transaction, which hides every later committed row of that
    partition from the loader. The missing windows are then looked for among every row
    ever written, committed or not."""
    import json

    from ablab_testing.pipeline import end_offsets, read_records_to_end

    lines = []
    try:
        high = end_offsets(bootstrap, topic, isolation_level="read_uncommitted")
        stable = end_offsets(bootstrap, topic, isolation_level="read_committed")
        for partition in sorted(high):
            hw, lso = high[partition], stable.get(partition)
            lines.append(f"windows partition {partition}: high watermark {hw}, last stable offset {lso}"
                         + ("  <- an open transaction hides the rows after it" if lso is not None and lso < hw else ""))
        written: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
        for record in read_records_to_end(bootstrap, topic, isolation_level="read_uncommitted"):
            row = json.loads(record.value)
            if row.get("kind") == "inference":
                key = (row["experiment"], row["variant"], _ms(datetime.fromisoformat(row["window_start"])))
                written.setdefault(key, []).append((record.partition, record.offset))
        for key in sorted(set(expected) - set(stored)):
            lines.append(f"missing window {key}: written at (partition, offset) {written.get(key) or 'nowhere'}")
    except Exception as exc:
        lines.append(f"transaction diagnosis failed: {type(exc).__name__}: {exc}")
    return "\n".join(lines)


def _log_diagnosis(log_dir: Path, limit: int = 30) -> str:
    """The Flink log lines on aborted, fenced or recovered transactions and every warning
    or error: the last ``limit`` of each log file, in order."""
    import re

    pattern = re.compile(r"\b(WARN|ERROR)\b|abort|fenc|lingering|recover", re.IGNORECASE)
    lines = []
    for path in sorted(log_dir.rglob("*.log")):
        try:
            found = [line.rstrip()[:400] for line in path.read_text(errors="replace").splitlines() if pattern.search(line)]
        except OSError:
            continue
        lines += [f"{path.name}: {line}" for line in found[-limit:]]
    return "\n".join(lines) or f"no such lines in the logs under {log_dir}"
