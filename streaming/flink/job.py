"""The PyFlink job: 10-second window rows of each (experiment, variant), pure Flink SQL.

The SQL lives next to this file (``sql/*.sql``, run in name order); this module only
renders ``${name}`` placeholders — config-derived values from a :class:`JobConfig` (quoted
for SQL string literals, checked token by token), and the column lists, bound checks and
window aggregates generated from the field catalogue (:func:`catalogue_sql`,
``ablab.platform.fields``: the Flink fields, their bounds, window statistics and late
fields) — and runs the statements: DDL and views one by one, the
``INSERT`` statements as one statement set, hence one job and one checkpoint. No Python
UDF is on the hot path.

Locally (``ablab stream submit --local``) the job runs in a PyFlink mini-cluster inside
this process; on a cluster the same module is submitted with
``flink run -py streaming/flink/job.py -- --bootstrap HOST:9092 ...`` (or ``-pym
ablab.streaming.flink.job``) and the cluster's configuration supplies checkpoint storage.

Hostile input: a record whose ``ts`` is more than ``max_future_s`` ahead of the processing
clock gives no watermark, and it and records outside physical bounds are rejected before
any state (``kind = "rejected"`` rows, dead-lettered by the loader): one bad clock cannot
make a partition's later events late, and a restore cannot bring it back. A record without
``event_id`` gets the edge's derived id (from its trace_id).

Late-data policy (tested in tests/unit/streaming/test_flink_job.py and
tests/integration/streaming/test_pipeline_canned.py):

- Watermark = min over Kafka partitions of (largest event time read − ``out_of_orderness_s``,
  default 5 s: the emitters batch for 1-2 s, docs/benchmarks/pipeline.md). Events out of
  order within that bound land in their own window. Each event time counts at most as its
  Kafka record timestamp (when the edge received the event; the emitter stamps it and keeps
  it through its spool) and the processing clock: a producer whose clock runs 120 s ahead
  (inside ``max_future_s``, so accepted) keeps its own window open until real time reaches
  it, and neither closes the other events' windows early nor makes them late.
- Duplicates (one ``event_id`` delivered twice: a producer retry, a spool replay) count
  once: the first arrival of each event_id is kept, before the late rule; the job remembers
  an event_id for ``dedup_ttl_s`` (state TTL, processing time).
- An event is *late* when its ``ts`` is at or more than the bound behind the largest ``ts``
  (counted as above) read before it from the same partition, or when it is at or behind the current
  watermark. Such an event is written as a ``kind = "late"`` row to the windows topic and
  stored in ClickHouse's ``late_events``, never silently dropped and never added to an
  already emitted window; ``/timeseries`` folds it into its window at query time
  (``queries.window_rows``), so windows are eventually exact. Every other event is ahead of the watermark, so its window is
  still open. With partitions that never go idle the first rule decides alone (the
  watermark never passes a partition's own largest ts minus the bound), and it depends
  only on each partition's order (producers key by ``trace_id``), so it is reproducible
  offline (``reference.late_ids``). Per experiment: raw inference events = Σ window ``n``
  + late inference events (``queries.reconciliation``).
- Partitions never go idle by default (``idle_timeout_s = 0``); bounded replays and tests
  use 0. ``ablab stream submit`` (live) defaults to 5 s so silent partitions do not
  stall every window. A partition that wakes up after the watermark moved on without it
  may deliver events behind the watermark: the second rule sends those to late rows.
- RUM (client-side latency, seconds late) and feedback (labels, minutes late) are *not*
  read by this job: both are attributed to their original request's window and variant in
  ClickHouse at query time, by ``trace_id`` (``ablab.streaming.store.queries``), however
  late they arrive, so nothing here holds per-request state for them. (An interval join
  here would buffer every request for the RUM horizon, lose RUM outside it, and cost the
  job a third of its CPU; docs/benchmarks/pipeline.md.)

Fault tolerance: checkpoints every ``checkpoint_interval_s`` (exactly-once mode), retained
on cancellation; the Kafka sinks are transactional (``exactly-once``), so rows become
visible to ``read_committed`` readers only when their checkpoint completes. On start the
runner resumes from the newest completed checkpoint in ``checkpoint_dir`` (if any), which
restores the Kafka offsets and window state, so a SIGKILLed job restarts without loss or
double counting.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ablab.platform.fields import (
    AT_MOST,
    COST_FIELD,
    FIELDS,
    FLINK_FIELDS,
    FLINK_TYPES,
    HEADLINE_LATENCY,
    LATE_FIELDS,
    WINDOW_QUANTILES,
    WINDOWED,
    Field,
    WindowStat,
    window_column,
    window_types,
    window_value_columns,
)
from ablab.streaming.kafka.consumer import FETCH_MAX_WAIT_MS, FETCH_MIN_BYTES

SQL_DIR = Path(__file__).parent / "sql"
_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,/\-=+ ]*$")


class JobConfigError(ValueError):
    """A job parameter that cannot be used; the message names it."""


@dataclass(frozen=True)
class JobConfig:
    bootstrap: str = "127.0.0.1:9092"
    inference_topic: str = "ablab.inference"
    windows_topic: str = "ablab.windows"
    group_id: str = "ablab-flink"
    out_of_orderness_s: float = 5.0
    idle_timeout_s: float = 0.0
    """0 (default): a partition without records holds the watermark back. > 0 lets the job
    move on without an idle partition; that partition's next events may then be behind the
    watermark, and become late rows (the late-data policy above). Live submission uses 5 s."""
    max_future_s: float = 300.0
    """How far ahead of the processing clock an event time may be. Further ahead, the
    record is rejected (the loader dead-letters it) and the watermark counts it as this far
    ahead at most, so one bad clock cannot make a partition's later events late."""
    max_latency_ms: float = FIELDS[HEADLINE_LATENCY].hi
    """Physical bounds, from the field catalogue the edge uses too (``ablab.platform.fields``:
    a latency within a day, cost and tokens below a ceiling): a record outside them is
    rejected, not windowed. The edge refuses the same; these catch producers that write to
    Kafka directly."""
    max_cost_usd: float = FIELDS[COST_FIELD].hi
    max_tokens: int = int(max(f.hi for f in FIELDS.values() if f.unit == "tokens"))
    dedup_ttl_s: float = 600.0
    """How long the job remembers an event_id (Flink state TTL, processing time): a
    duplicate arriving later than this after the first copy is not recognised. One flag of
    state per event_id; at 30,000 events/s and 600 s that is 18 M flags, which belongs in
    RocksDB state (``extra_config={"state.backend.type": "rocksdb"}``), not a small heap."""
    fetch_min_bytes: int = FETCH_MIN_BYTES
    fetch_max_wait_ms: int = FETCH_MAX_WAIT_MS
    """The source's Kafka fetches (``ablab.streaming.kafka.consumer.FETCH_MIN_BYTES``: fewer,
    fuller fetches than Kafka's default of answering at once; 1 restores that)."""
    bounded: bool = False
    """Stop at the offsets that are the latest when the job starts (tests, benchmarks)."""
    checkpoint_dir: Path | None = None
    checkpoint_interval_s: float = 2.0
    delivery_guarantee: str = "exactly-once"
    transactional_id_prefix: str = "ablab-flink"
    transaction_timeout_ms: int = 600_000
    parallelism: int = 1
    restore: bool = True
    """Resume from the newest completed checkpoint in ``checkpoint_dir``."""
    extra_config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.out_of_orderness_s < 0:
            raise JobConfigError(f"out_of_orderness_s must be >= 0, got {self.out_of_orderness_s}")
        if self.checkpoint_interval_s <= 0:
            raise JobConfigError(f"checkpoint_interval_s must be > 0, got {self.checkpoint_interval_s}")
        if self.delivery_guarantee not in ("exactly-once", "at-least-once", "none"):
            raise JobConfigError(
                f"delivery_guarantee must be exactly-once, at-least-once or none, got {self.delivery_guarantee!r}"
            )
        if self.idle_timeout_s < 0:
            raise JobConfigError(f"idle_timeout_s must be >= 0, got {self.idle_timeout_s}")
        if self.max_future_s < 0 or self.max_latency_ms <= 0 or self.max_cost_usd <= 0 or self.max_tokens <= 0:
            raise JobConfigError("max_future_s must be >= 0 and max_latency_ms, max_cost_usd, max_tokens > 0")
        if self.dedup_ttl_s <= 0:
            raise JobConfigError(f"dedup_ttl_s must be > 0, got {self.dedup_ttl_s}")
        if self.parallelism < 1:
            raise JobConfigError(f"parallelism must be >= 1, got {self.parallelism}")
        if self.fetch_min_bytes < 1 or not 0 <= self.fetch_max_wait_ms <= 10_000:
            raise JobConfigError(f"fetch_min_bytes must be >= 1 and fetch_max_wait_ms within 0..10000, got "
                                 f"{self.fetch_min_bytes} and {self.fetch_max_wait_ms}")

    def sql_parameters(self) -> dict[str, str]:
        return {
            "bootstrap": self.bootstrap,
            "inference_topic": self.inference_topic,
            "windows_topic": self.windows_topic,
            "group_id": self.group_id,
            "out_of_orderness_s": f"{self.out_of_orderness_s:.3f}",
            "max_future_s": f"{self.max_future_s:.0f}",
            # SECOND intervals hold at most 99 s in Flink SQL; minutes of skew need DAY TO SECOND
            "max_future_interval": _day_to_second(self.max_future_s),
            # DOUBLE literals, not DECIMAL ones: Flink compares a DOUBLE column with a DECIMAL
            # bound in decimal, where -0.0 falls below 0 and is rejected, while the edge and the
            # loader compare in IEEE doubles, where -0.0 == 0 is in range (one rule for all three).
            "max_latency_ms": _double_literal(self.max_latency_ms),
            "max_cost_usd": _double_literal(self.max_cost_usd),
            "max_tokens": str(self.max_tokens),
            "max_latency_text": f"{self.max_latency_ms:.0f}",
            "max_cost_text": f"{self.max_cost_usd:.0f}",
            "fetch_min_bytes": str(self.fetch_min_bytes),
            "fetch_max_wait_ms": str(self.fetch_max_wait_ms),
            "bounded_mode": "latest-offset" if self.bounded else "unbounded",
            "delivery_guarantee": self.delivery_guarantee,
            "transactional_id_prefix": self.transactional_id_prefix,
            "transaction_timeout_ms": str(self.transaction_timeout_ms),
        }


def _double_literal(value: float) -> str:
    """``value`` as a Flink SQL DOUBLE literal (approximate numeric: mantissa ``E`` exponent)."""
    text = repr(float(value))
    return text.upper() if "e" in text else f"{text}E0"


def _day_to_second(seconds: float) -> str:
    whole, millis = divmod(round(seconds * 1000), 1000)
    days, rest = divmod(whole, 86_400)
    return f"{days} {rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}.{millis:03d}"


def render(sql: str, parameters: dict[str, str], generated: dict[str, str] | None = None) -> str:
    """Substitute ``${name}`` placeholders. A configuration value must be a plain, quote-free
    token: it comes from configuration, not from events, but is still checked so that a stray
    quote cannot change a statement. ``generated`` SQL (:func:`catalogue_sql`) is code, not
    input, and is substituted as it is."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if generated and name in generated:
            return generated[name]
        if name not in parameters:
            raise JobConfigError(f"SQL placeholder ${{{name}}} has no value")
        text = parameters[name]
        if not _SAFE_VALUE.match(text):
            raise JobConfigError(f"job parameter {name}={text!r} has characters not allowed in SQL options")
        return text

    return _PLACEHOLDER.sub(value, sql)


def split_statements(sql: str) -> list[str]:
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [part.strip() for part in re.split(r";\s*(?:\n|$)", body) if part.strip()]


def sql_files(names: tuple[str, ...] | None = None) -> list[Path]:
    files = sorted(SQL_DIR.glob("*.sql"))
    if names is not None:
        files = [path for path in files if path.stem.split("_", 1)[1] in names]
    return files


def statements(config: JobConfig, *, parts: tuple[str, ...] | None = None) -> list[str]:
    """Every statement of the job (or of the named parts: sources_kafka, sinks_kafka, transform, inserts)."""
    parameters, generated = config.sql_parameters(), catalogue_sql(config)
    return [stmt for path in sql_files(parts) for stmt in split_statements(render(path.read_text(), parameters, generated))]


# --- the column lists, rendered from the field catalogue --------------------------------

ORDERED: tuple[tuple[str, str], ...] = tuple((name, bound) for name, bound, _ in AT_MOST if name in FLINK_FIELDS)
"""(field, bound): on one event the field never exceeds the bound (``fields.AT_MOST``: the first
token comes no later than the last); the edge refuses the same, with the field named."""


def _upper_bound(f: Field, config: JobConfig) -> str:
    """The field's physical ceiling as a literal of its Flink type: the job's configured
    ceiling for its unit (latencies, cost, tokens), else the catalogue's."""
    by_unit = {"ms": config.max_latency_ms, "USD": config.max_cost_usd, "tokens": float(config.max_tokens)}
    hi = by_unit.get(f.unit, f.hi)
    return str(int(hi)) if f.type == "int" else _double_literal(hi)


def _lower_bound(f: Field) -> str:
    # 0 as an integer literal, as written before the lists were generated: -0.0 compares equal
    return str(int(f.lo)) if f.lo == int(f.lo) else _double_literal(f.lo)


def _window_aggregate(f: Field, stat: WindowStat) -> str:
    name, col = window_column(f.name, stat), f.name
    if stat == "n":
        return f"COUNT({col}) AS {name}"
    value = col if stat == "sum" else f"{col} * {col}"
    if f.type == "int":  # BIGINT sums, carried as DOUBLE as every window sum is
        return f"CAST(SUM({value}) AS DOUBLE) AS {name}"
    if f.nullable:  # a window where no request has the field sums to 0, not NULL
        return f"COALESCE(SUM({value}), 0.0) AS {name}"
    return f"SUM({value}) AS {name}"


def _quantile_array(f: Field) -> str:
    return f"{f.name}_q"


def catalogue_sql(config: JobConfig) -> dict[str, str]:
    """The SQL fragments the templates take from :mod:`ablab.platform.fields`: a new Flink
    field, window statistic or late field is a catalogue entry, never an edit here."""
    flink = [FIELDS[name] for name in FLINK_FIELDS]
    checks = []
    for f in flink:
        bounds = f"NOT ({f.name} BETWEEN {_lower_bound(f)} AND {_upper_bound(f, config)})"
        present = f"{f.name} IS NOT NULL AND " if f.nullable else ""
        checks.append(f"WHEN {present}{bounds} THEN '{f.name}'")
    checks += [f"WHEN {early} > {late} THEN '{early}'" for early, late in ORDERED]
    messages = [
        f"WHEN rejected_field = '{early}' AND {early} BETWEEN {_lower_bound(FIELDS[early])} AND "
        f"{_upper_bound(FIELDS[early], config)} THEN '{early} exceeds {late}'"
        for early, late in ORDERED
    ]
    counts_and_sums: tuple[WindowStat, ...] = ("n", "sum", "sumsq")
    sums = [_window_aggregate(f, s) for f in WINDOWED for s in counts_and_sums if s in f.window]
    quantiles = []
    outer = []
    for f in WINDOWED:
        qs = [q for q in WINDOW_QUANTILES if q in f.window]
        if qs:
            levels = ", ".join(str(int(q[1:]) / 100) for q in qs)
            quantiles.append(f"PERCENTILE({f.name}, ARRAY[{levels}]) AS {_quantile_array(f)}")
    quantile_of = {
        window_column(f.name, q): f"{_quantile_array(f)}[{i + 1}]"
        for f in WINDOWED for i, q in enumerate(q for q in WINDOW_QUANTILES if q in f.window)
    }
    for column in window_value_columns():
        outer.append(f"{quantile_of[column]} AS {column}" if column in quantile_of else column)
    types = window_types()

    def declared(names: list[str] | tuple[str, ...]) -> str:
        return ", ".join(f"{name} {FLINK_TYPES[FIELDS[name].type]}" for name in names)

    return {
        "source_fields": ",\n    ".join(f"{f.name:<13} {FLINK_TYPES[f.type]}" for f in flink),
        "fields": ", ".join(FLINK_FIELDS),
        "required_fields": " AND ".join(f"{f.name} IS NOT NULL" for f in flink if not f.nullable),
        "bound_checks": "\n           ".join(checks),
        "order_messages": "\n           ".join(messages),
        "late_fields": ", ".join(LATE_FIELDS),
        "late_sink_columns": declared(LATE_FIELDS),
        "window_sink_columns": ", ".join(f"{c} {types[c][1]}" for c in window_value_columns()),
        "window_columns": ", ".join(outer),
        "window_aggregates": ",\n           ".join([*sums, *quantiles]),
    }


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest completed checkpoint (a ``chk-N`` folder with ``_metadata``) under any job id."""
    if not checkpoint_dir.is_dir():
        return None
    completed = [meta.parent for meta in checkpoint_dir.glob("*/chk-*/_metadata")]
    if not completed:
        return None
    return max(completed, key=lambda path: (path.stat().st_mtime, int(path.name.split("-")[1])))


def _connector_jar() -> Path:
    """The Flink Kafka connector jar, resolved by Maven from deploy/pom.xml."""
    from ablab.streaming.kafka import jars

    jars.ensure_jars()
    return jars.kafka_connector_jar()


def flink_configuration(config: JobConfig, *, connector_jar: Path | None) -> dict[str, str]:
    conf: dict[str, str] = {
        "parallelism.default": str(config.parallelism),
        "pipeline.name": "ablab-windows",
        "execution.checkpointing.interval": f"{int(config.checkpoint_interval_s * 1000)} ms",
        "execution.checkpointing.mode": "EXACTLY_ONCE",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        "execution.checkpointing.num-retained": "3",
        "table.exec.source.idle-timeout": f"{int(config.idle_timeout_s * 1000)} ms",  # 0 ms = never idle
        # Window aggregations are two-phase (local-global) without mini-batch; mini-batch
        # would make the proctime deduplication emit updates, hence retracting aggregates,
        # and split shared sub-plans (docs/benchmarks/pipeline.md).
        "table.exec.mini-batch.enabled": "false",
        # Deduplication memory (one flag per event_id) and the late rule's per-partition max.
        "table.exec.state.ttl": f"{int(config.dedup_ttl_s * 1000)} ms",
        # Chained operators hand rows on without a defensive copy (a copy of every row for
        # each of the late rule's three consumers was ~30 % of that operator's CPU). The SQL
        # operators do not keep references to their inputs across records; the bounded test
        # runs with this configuration.
        "pipeline.object-reuse": "true",
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "3",
        "restart-strategy.fixed-delay.delay": "2 s",
    }
    if connector_jar is not None:
        conf["pipeline.jars"] = connector_jar.resolve().as_uri()
    if config.checkpoint_dir is not None:
        conf["execution.checkpointing.dir"] = config.checkpoint_dir.resolve().as_uri()
        if not config.bounded:
            # A live job's de-dup state holds dedup_ttl_s of event_ids (millions at 5 k/s).
            # Full heap snapshots copy all of it every checkpoint, so their cost grows with the
            # state; the changelog backend writes only each interval's changes (and rewrites
            # the whole state every 10 minutes). Measured live at 5 k/s: 36-58 µs of JVM CPU
            # per event against 59-117 µs with full snapshots, growing apart over 5 minutes
            # (docs/benchmarks/pipeline.md). Bounded replays end before that pays off.
            conf["state.changelog.enabled"] = "true"
            conf["state.changelog.storage"] = "filesystem"
            conf["state.changelog.dstl.dfs.base-path"] = (config.checkpoint_dir / "changelog").resolve().as_uri()
        resume = latest_checkpoint(config.checkpoint_dir) if config.restore else None
        if resume is not None:
            conf["execution.state-recovery.path"] = resume.resolve().as_uri()
            # The checkpoint is this job's own, retained for this: the job takes it over
            # (CLAIM). NO_CLAIM would force a full first snapshot, which the changelog
            # backend cannot take.
            conf["execution.state-recovery.claim-mode"] = "CLAIM"
    conf.update(config.extra_config)
    return conf


def create_table_environment(conf: dict[str, str]) -> Any:
    """A streaming TableEnvironment (mini-cluster unless a cluster submitted us)."""
    os.environ.setdefault("JVM_ARGS", "-Xmx512m")
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    table_config = env.get_config()
    for key, value in conf.items():
        table_config.set(key, value)
    return env


def submit(config: JobConfig, *, wait: bool = True, connector_jar: Path | None = None) -> Any:
    """Build and start the job; with ``wait`` block until it ends (bounded input, or cancel)."""
    jar = connector_jar if connector_jar is not None else _connector_jar()
    env = create_table_environment(flink_configuration(config, connector_jar=jar))
    inserts = []
    for statement in statements(config):
        if statement.upper().startswith("INSERT"):
            inserts.append(statement)
        else:
            env.execute_sql(statement)
    statement_set = env.create_statement_set()
    for statement in inserts:
        statement_set.add_insert_sql(statement)
    result = statement_set.execute()
    if wait:
        result.wait()
    return result


def _parse_args(argv: list[str]) -> JobConfig:
    parser = argparse.ArgumentParser(prog="ablab-flink-job", description=__doc__.split("\n\n")[0])
    defaults = JobConfig()
    for item in fields(JobConfig):
        if item.name == "extra_config":
            continue
        flag = "--" + item.name.replace("_", "-")
        default = getattr(defaults, item.name)
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif item.name == "checkpoint_dir":
            parser.add_argument(flag, type=Path, default=None)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra Flink option")
    args = vars(parser.parse_args(argv))
    extra = {}
    for item in args.pop("set"):
        key, sep, value = item.partition("=")
        if not sep:
            raise JobConfigError(f"--set expects KEY=VALUE, got {item!r}")
        extra[key.strip()] = value.strip()
    return JobConfig(**args, extra_config=extra)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # --detached: return once the job is submitted (`flink run --detached` to a session
    # cluster, the operator's PythonDriver); the cluster runs it, not this process.
    detached = "--detached" in args
    config = _parse_args([a for a in args if a != "--detached"])
    submit(config, wait=not detached)


if __name__ == "__main__":
    main()
