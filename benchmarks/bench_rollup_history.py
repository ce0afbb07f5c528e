"""How the loader's rollup step grows with each unit's history (no Kafka).

    .venv/bin/python benchmarks/bench_rollup_history.py
    .venv/bin/python benchmarks/bench_rollup_history.py --requests 200000 --units 500 --batch-records 20000
    .venv/bin/python benchmarks/bench_rollup_history.py --requests 200000 --units 500 --request-interval-ms 90

The per-unit rollup rewrites a touched unit from its whole history, so with a fixed set of
users a long-running experiment makes every recompute read more. ``--request-interval-ms``
sets how far apart the requests are (5 ms: 200,000 requests in 17 minutes; 500 ms: in 28
hours), for layouts that key the rollup by time (a row per unit and hour was measured; see
docs/benchmarks/loader.md). This loads the records of
``bench_loader.py`` in arrival order (each request's inference and RUM event, a label for
every other request) batch by batch, exactly as the loader's flush does (``route``, the
``raw_events`` insert, :func:`ablab.streaming.store.rollup.place`, then
:func:`~ablab.streaming.store.rollup.recompute_touched`) into a fresh chDB store, and prints,
every few batches, the requests per unit so far, the recompute's CPU for the batch and the
batch's CPU per event. ``--checkpoint-every N`` recomputes once per N batches, as a loader
behind its topics does between checkpoints.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench_loader import _events
from rich.console import Console
from rich.progress import Progress
from rich.table import Table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000, help="requests in all (~2.5 events each)")
    parser.add_argument("--units", type=int, default=500, help="users the requests come from")
    parser.add_argument("--batch-records", type=int, default=20_000, help="records per flush")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="batches per recompute")
    parser.add_argument("--request-interval-ms", type=float, default=5.0, help="time between requests")
    parser.add_argument("--report-every", type=int, default=4, help="print a row every this many checkpoints")
    args = parser.parse_args(argv)
    if min(args.requests, args.units, args.batch_records, args.checkpoint_every, args.report_every) < 1:
        parser.error("every count must be at least 1")
    if args.request_interval_ms <= 0:
        parser.error("--request-interval-ms must be positive")

    from ablab.streaming.loader.rows import TABLE_COLUMNS, Routed, route
    from ablab.streaming.store import apply_ddl, make_client, rollup

    store = make_client(f"chdb://{Path(tempfile.mkdtemp(prefix='ablab-bench-history-'))}")
    apply_ddl(store)
    inference, rum, feedback = _events(args.requests, units=args.units, label_rate=0.5, seed=7,
                                       interval_ms=args.request_interval_ms)
    labels = iter(feedback)
    records: list[tuple[str, bytes]] = []
    for i, (request, timing) in enumerate(zip(inference, rum)):
        records += [("bench.inference", request), ("bench.rum", timing)]
        label = next(labels, None) if i % 2 == 0 else None
        if label is not None:
            records.append(("bench.feedback", label))

    console = Console()
    table = Table(title=f"rollup step as histories grow: {args.units:,} units, {args.batch_records:,}-record batches, "
                        f"a recompute every {args.checkpoint_every} batch(es)")
    for col in ("batches", "requests per unit", "requests per unit and hour", "recompute CPU ms per checkpoint",
                "insert + place + recompute µs/event"):
        table.add_column(col, justify="right")
    dirty: dict[str, set[str]] = defaultdict(set)
    spent, recompute_s, events, checkpoints = 0.0, 0.0, 0, 0
    with Progress(console=console) as progress:
        task = progress.add_task("loading", total=len(records))
        for n, start in enumerate(range(0, len(records), args.batch_records), 1):
            rows: list[tuple[Any, ...]] = []
            for offset, (topic, value) in enumerate(records[start:start + args.batch_records], start):
                routed = route(topic=topic, value=value, partition=0, offset=offset, windows_topic="bench.windows")
                if isinstance(routed, Routed):
                    rows.append(routed.row)
            began = time.process_time()
            store.insert("raw_events", rows, column_names=list(TABLE_COLUMNS["raw_events"]))
            for exp, units in rollup.place(store, rows).items():
                dirty[exp] |= units
            if n % args.checkpoint_every == 0 or start + args.batch_records >= len(records):
                recompute_began = time.process_time()
                rollup.recompute_touched(store, dirty)
                recompute_s += time.process_time() - recompute_began
                dirty.clear()
                checkpoints += 1
                spent += time.process_time() - began
                events += len(rows)
                if checkpoints % args.report_every == 0:
                    loaded, unit_hours = store.query(
                        "SELECT count(), uniqExact(unit_id, toStartOfHour(ts)) FROM rollup_events").result_rows[0]
                    table.add_row(str(n), f"{loaded / args.units:,.0f}", f"{loaded / unit_hours:,.0f}",
                                  f"{1000 * recompute_s / args.report_every:,.0f}",
                                  f"{1e6 * spent / events:.1f}")
                    spent, recompute_s, events = 0.0, 0.0, 0
            else:
                spent += time.process_time() - began
                events += len(rows)
            progress.update(task, completed=min(len(records), start + args.batch_records))
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.2f}; rows report the checkpoints since the previous row")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
