"""Drain at parallelism 2: the Flink session cluster against the mini-cluster, in one run.

    .venv/bin/python benchmarks/bench_cluster.py --events 500000

Starts a local broker (or uses --bootstrap), pre-fills a fresh 3-partition inference topic
with bench_flink.py's pre-fill (confluent-kafka, pre-rendered JSON), starts a session
cluster (``ablab.streaming.flink.cluster``: one JobManager, ``--taskmanagers`` TaskManagers
with 2 slots and a 512 MB heap each) and drains the topic, bounded, with the production
job at parallelism 2:

- mini-cluster   bench_flink.py's ``p2`` variant: the job in one local JVM (``--heap``)
- session        the same job submitted with ``flink run --detached -pym`` to the cluster

Each is run on an empty topic and on the full one; throughput = events / (full − empty)
of the job's net runtime (Flink's figure, submission to end: JVM start-up, planning and
the upload are not in it; the empty run is the fixed cost of scheduling and the last
checkpoint). For the session cluster it is the REST API's job duration. CPU seconds are
read from /proc: the mini-cluster's child JVM, the session cluster's JobManager and
TaskManagers. The 1-minute load average is printed beside each row.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import _path  # noqa: F401 - tests/ on the import path: the benchmarks share ablab_testing
import bench_flink  # the pre-fill and the mini-cluster runner


def _cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def run_on_cluster(prefix: str, bootstrap: str, workdir: Path, flink) -> dict:
    from ablab.streaming.flink import cluster as flink_cluster
    from ablab.streaming.flink import rest
    from ablab_testing.pipeline import PipelineTopics, job_config

    status = flink_cluster.cluster_status(directory=flink.directory)
    pids = [status.jobmanager, *status.taskmanagers.values()]
    config = flink_cluster.cluster_job_config(job_config(
        PipelineTopics(prefix), bootstrap=bootstrap, checkpoint_dir=workdir / f"ckpt-session-{prefix}", bounded=True,
        checkpoint_interval_s=5.0, parallelism=2, restore=False, transactional_id_prefix=f"{prefix}-session"))
    cpu_before = _cpu_seconds([p for p in pids if p])
    job_id = flink_cluster.submit(rest_url=flink.rest_url, config=config, conf_dir=flink.conf_dir,
                                  log_dir=workdir / "client")
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        job = rest.get(flink.rest_url, f"/jobs/{job_id}")
        if job["state"] in ("FINISHED", "FAILED", "CANCELED"):
            break
        time.sleep(0.5)
    if job["state"] != "FINISHED":
        raise RuntimeError(f"session job {job_id} ended {job['state']}: {rest.get(flink.rest_url, f'/jobs/{job_id}/exceptions')}")
    return {"net_s": job["duration"] / 1000, "cpu_s": _cpu_seconds([p for p in pids if p]) - cpu_before}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--rate", type=int, default=20_000, help="event-time events per second in the data")
    parser.add_argument("--heap", default="-Xmx1g", help="JVM_ARGS of the mini-cluster job")
    parser.add_argument("--taskmanagers", type=int, default=2)
    args = parser.parse_args()

    from ablab.streaming.flink import cluster as flink_cluster
    from ablab.streaming.localhost import server_ports
    from ablab_testing.pipeline import PipelineTopics

    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    print(f"work dir {workdir}", flush=True)
    port = server_ports(2)
    flink = flink_cluster.FlinkClusterConfig(directory=workdir / "flink", taskmanagers=args.taskmanagers,
                                             rest_port=port, rpc_port=port + 1)
    with bench_flink.broker_for(args.bootstrap, workdir) as bootstrap:
        try:
            started = time.perf_counter()
            flink_cluster.start_cluster(config=flink)
            print(f"session cluster up in {time.perf_counter() - started:.1f}s ({args.taskmanagers} TaskManagers x 2 "
                  "slots, 512 MB heap each; JobManager 512 MB)", flush=True)
            empty, full = PipelineTopics.unique("bcle"), PipelineTopics.unique("bclf")
            empty.create(bootstrap=bootstrap)
            full.create(bootstrap=bootstrap)
            fill_s = bench_flink.prefill(bootstrap, full.inference, args.events, args.producers, args.rate)
            print(f"pre-filled {args.events:,} events in {fill_s:.1f}s; load {os.getloadavg()[0]:.2f}", flush=True)
            print(f"machine: {os.cpu_count()} cores; parallelism 2; checkpoints every 5 s; exactly-once sinks", flush=True)
            print(f"{'mode':<16}{bench_flink.ROW_HEADER}", flush=True)
            runs = {
                "mini-cluster": lambda prefix: bench_flink.run_variant("p2", prefix, bootstrap, workdir, args.heap),
                "session": lambda prefix: run_on_cluster(prefix, bootstrap, workdir, flink),
            }
            results = {mode: bench_flink.measure_row(mode, run, empty=empty.prefix, full=full.prefix,
                                                     events=args.events, width=16) for mode, run in runs.items()}
            if all(results.values()):
                print(f"session / mini-cluster events/s: {results['session'] / results['mini-cluster']:.2f}x", flush=True)
        finally:
            flink_cluster.stop_cluster(directory=flink.directory)

if __name__ == "__main__":
    main()
