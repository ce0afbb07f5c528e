"""Where the loader's CPU goes, step by step, without Kafka: what to cut first.

    .venv/bin/python benchmarks/bench_loader_steps.py
    .venv/bin/python benchmarks/bench_loader_steps.py --requests 40000 --units 20000,1000 --batch-records 5000,20000

Builds the same records as ``bench_loader.py`` (inference and RUM per request, a label for
``--label-rate`` of them), then loads them batch by batch exactly as the loader's flush does
(:func:`ablab.streaming.loader.rows.route` per record, the ``raw_events`` insert, then
:func:`ablab.streaming.store.rollup.feed`) into a fresh chDB store per case. Every store
statement goes through a timing wrapper that files it under a step by what it does:

- ``route``: parse, validate and build each row (Python);
- ``raw insert``: the ``raw_events`` insert;
- ``rollup copy``: the ``rollup_events``/``rollup_traces`` inserts;
- ``rollup pairs``: the label ↔ request look-ups and the ``rollup_labels`` insert;
- ``rollup recompute``: the ``unit_stats`` (and segment) rewrites, with the SLO read;
- ``rollup other``: what ``feed`` spends outside statements (splitting the batch).

Prints process CPU µs per event for each step and its share of the total, per case.
``time.process_time`` counts chDB's threads too, since the engine runs in this process.
Kafka's share (poll, decode) is ``bench_loader.py``'s ``poll-only`` variant.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_loader import _events, _int_list
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

STEPS = ("route", "raw insert", "rollup copy", "rollup pairs", "rollup recompute", "rollup other")


def _step_of(kind: str, text: str) -> str:
    """The step a store statement belongs to, by its target table or its first words."""
    text = " ".join(text.split())[:120]
    if kind == "insert":
        return "raw insert" if text == "raw_events" else "rollup copy"
    if "INSERT INTO unit_stats" in text or "INSERT INTO unit_segment_stats" in text or "rollup_slos" in text:
        return "rollup recompute"
    return "rollup pairs"


class _TimedClient:
    """A clickhouse-connect client whose statements add their CPU time to ``spent``."""

    def __init__(self, client: Any, spent: dict[str, float]) -> None:
        self._client, self.spent = client, spent

    def _timed(self, step: str, call: Callable[[], Any]) -> Any:
        began = time.process_time()
        try:
            return call()
        finally:
            self.spent[step] += time.process_time() - began

    def insert(self, table: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed(_step_of("insert", table), lambda: self._client.insert(table, *args, **kwargs))

    def query(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed(_step_of("query", sql), lambda: self._client.query(sql, *args, **kwargs))

    def command(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._timed(_step_of("command", sql), lambda: self._client.command(sql, *args, **kwargs))


def _run_case(records: list[tuple[str, bytes]], *, batch: int, home: Path, progress: Progress, label: str) -> dict[str, Any]:
    from ablab.streaming.loader.rows import Routed, route
    from ablab.streaming.loader.service import TABLE_COLUMNS
    from ablab.streaming.store import apply_ddl, make_client, rollup

    store = make_client(f"chdb://{home}")
    apply_ddl(store)
    spent: dict[str, float] = defaultdict(float)
    timed = _TimedClient(store, spent)
    task = progress.add_task(label, total=len(records))
    total_began = time.process_time()
    refused = 0
    for start in range(0, len(records), batch):
        chunk = records[start:start + batch]
        began = time.process_time()
        rows: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        for offset, (topic, value) in enumerate(chunk, start):
            routed = route(topic=topic, value=value, partition=0, offset=offset, windows_topic="bench.windows")
            if isinstance(routed, Routed):
                rows[routed.table].append(routed.row)
            else:
                refused += 1
        spent["route"] += time.process_time() - began
        for table, table_rows in rows.items():
            timed.insert(table, table_rows, column_names=list(TABLE_COLUMNS[table]))
            if table == "raw_events":
                statements_before = sum(spent.values())
                began = time.process_time()
                rollup.feed(timed, table_rows)
                spent["rollup other"] += (time.process_time() - began) - (sum(spent.values()) - statements_before)
        progress.update(task, advance=len(chunk))
    total = time.process_time() - total_began
    store.close()
    events = len(records) - refused
    return {"case": label, "events": events, "total_us": 1e6 * total / events,
            **{step: 1e6 * spent[step] / events for step in STEPS}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40_000, help="requests per case (~2.5 events each)")
    parser.add_argument("--units", default="20000", help="comma-separated user counts (fewer: longer histories)")
    parser.add_argument("--label-rate", type=float, default=0.5, help="fraction of requests that get a label")
    parser.add_argument("--batch-records", default="5000,20000", help="comma-separated batch sizes (records per flush)")
    args = parser.parse_args(argv)
    unit_counts = _int_list(parser, "--units", args.units)
    batches = _int_list(parser, "--batch-records", args.batch_records)
    if not unit_counts or min(unit_counts) < 1 or not batches or min(batches) < 1:
        parser.error("--units and --batch-records: each value must be at least 1")

    console = Console()
    work = Path(tempfile.mkdtemp(prefix="ablab-bench-loader-steps-"))
    results = []
    with Progress(console=console) as progress:
        for units in unit_counts:
            inference, rum, feedback = _events(args.requests, units=units, label_rate=args.label_rate, seed=11)
            # arrival order as a live loader sees it: a request, its RUM, labels minutes later
            records = [(topic, value) for pair in zip(inference, rum) for topic, value in
                       (("ablab.inference", pair[0]), ("ablab.rum", pair[1]))]
            records += [("ablab.feedback", value) for value in feedback]
            for batch in batches:
                label = f"{units:,} units, {batch:,}/batch"
                results.append(_run_case(records, batch=batch, home=work / f"{units}-{batch}", progress=progress,
                                         label=label))

    table = Table(title=f"loader CPU per event by step, µs (share); {args.requests:,} requests per case")
    table.add_column("step")
    for row in results:
        table.add_column(row["case"], justify="right")
    for step in STEPS:
        table.add_row(step, *(f"{row[step]:.1f} ({100 * row[step] / row['total_us']:.0f} %)" for row in results))
    table.add_row("total", *(f"{row['total_us']:.1f}" for row in results), style="bold")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
