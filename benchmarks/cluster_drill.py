"""The full cluster fault drill, with timings: 3 KRaft brokers, a Flink session cluster
with 2 TaskManagers (job at parallelism 2), the loader into chDB; one broker and one
TaskManager SIGKILLed mid-stream; every window must equal the offline computation.

    .venv/bin/python benchmarks/cluster_drill.py                       # 2 x 12 windows x 100 events
    .venv/bin/python benchmarks/cluster_drill.py --windows 30 --per-window 400

The CI test (tests/integration/cluster/test_cluster_faults.py) runs the same drill
(``ablab_testing.cluster_drill``) with a shorter stream. Exit code 1 when any
window differs; the work dir (logs of every JVM) is kept then.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import _path  # noqa: F401 - tests/ on the import path: the benchmarks share ablab_testing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=12, help="10 s windows per phase (two phases)")
    parser.add_argument("--per-window", type=int, default=100, help="inference events per window")
    parser.add_argument("--loaders", type=int, default=2, help="loaders in one consumer group (one is killed when ≥ 2)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for any one step")
    args = parser.parse_args()

    from ablab_testing.cluster_drill import run_drill

    workdir = Path(tempfile.mkdtemp(prefix="cluster-drill-"))
    print(f"work dir {workdir}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}", flush=True)
    result = run_drill(workdir=workdir, windows=args.windows, per_window=args.per_window, timeout_s=args.timeout_s,
                       loaders=args.loaders, say=lambda line: print(line, flush=True))
    problems = result.mismatches()
    print(f"{result.events:,} events; {len(result.expected)} windows expected, {len(result.windows)} in the store; "
          f"reconciliation {result.balance}; broker {result.killed_broker} and TaskManager "
          f"{result.killed_taskmanager} killed; {result.loaders} loaders"
          f"{', one killed between its writes and its commit' if result.killed_loader else ''}; "
          f"unit_stats requests {result.rollup_requests} of {result.raw_expected}; "
          f"surviving loaders reconnected {result.loader_restarts} times; loader errors {result.loader_errors}; "
          f"restored from checkpoint {result.restored_checkpoint}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    if problems:
        print(f"NOT EXACT: {len(problems)} differences, first ones:\n  " + "\n  ".join(problems[:20]))
        print(f"logs kept in {workdir}")
        return 1
    print("exact: every window equals the offline computation; nothing lost, nothing counted twice")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
