"""The job's transformation SQL on bounded input in a real PyFlink mini-cluster.

Sources are the job's own source DDL with the Kafka options swapped for a local JSON file
(the transformation is kept apart from sources and sinks for exactly this). Checks the
window arithmetic, deduplication and bad-record filtering against the offline reference,
without a broker.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from ablab.streaming.flink import job

from ablab_testing import flink_reference as ref

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

START = datetime(2026, 1, 1, tzinfo=UTC)
TIMESTAMP_COLUMNS = {"window_start", "window_end", "emitted_at", "ts", "watermark"}


def _file_sources(config: job.JobConfig, path: str) -> list[str]:
    statements = []
    for statement in job.statements(config, parts=("sources_kafka",)):
        head = statement.split(") WITH (")[0].replace("INT METADATA FROM 'partition' VIRTUAL", "AS 0")
        statements.append(
            f"{head}) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json', "
            "'json.ignore-parse-errors' = 'true', 'json.timestamp-format.standard' = 'ISO-8601')"
        )
    return statements


def _collect(env, view: str, columns: list[str]) -> list[dict]:
    # PyFlink cannot pickle some TIMESTAMP_LTZ values (CURRENT_TIMESTAMP): read them as text.
    select = ", ".join(f"CAST(`{c}` AS STRING) AS `{c}`" if c in TIMESTAMP_COLUMNS else f"`{c}`" for c in columns)
    with env.execute_sql(f"SELECT {select} FROM {view}").collect() as rows:
        return [dict(zip(columns, row)) for row in rows]


def _key(row) -> tuple[str, str, int]:
    moment = datetime.fromisoformat(row["window_start"]).replace(tzinfo=UTC)
    return row["experiment"], row["variant"], int(moment.timestamp() * 1000)


def test_windows_on_bounded_input_match_the_offline_computation(tmp_path):
    stream = ref.canned_stream(start=START, windows=4, per_window=30, experiment="b", jitter_ms=0, seed=3)
    # Sorted by time: on a bounded file nothing is late, so every valid event is windowed.
    inference = sorted(stream.inference, key=lambda e: e["ts"])
    bad = [b"{broken", json.dumps({**inference[0], "event_id": "bad-type", "e2e_ms": "fast"}).encode(),
           json.dumps({**inference[0], "event_id": "no-variant", "variant": None}).encode()]
    # What a producer writing to Kafka directly can still send (issue 19): an event time in
    # year 9999 and a latency of 1.7e308 mid-stream (rejected, and the events after them are
    # not late), and an event without event_id delivered twice (identified by its trace_id).
    poison = [{**inference[0], "event_id": "future", "trace_id": "future", "ts": "9999-12-31T00:00:00Z"},
              {**inference[1], "event_id": "huge", "trace_id": "huge", "e2e_ms": 1.7e308}]
    middle = len(inference) // 2
    anonymous = {k: v for k, v in {**inference[middle], "trace_id": "anon-trace"}.items() if k != "event_id"}
    path = str(tmp_path / "inference.json")
    with open(path, "wb") as handle:
        for event in [*inference[:middle], *poison, anonymous, *inference[middle:], anonymous]:
            handle.write(json.dumps(event).encode() + b"\n")
        handle.write(b"\n".join(bad) + b"\n")
    inference = [*inference, {**anonymous, "event_id": ref.identity(anonymous)}]

    config = job.JobConfig(out_of_orderness_s=2.0)
    # The job's own execution options (object reuse, state TTL, no mini-batch),
    # without checkpointing: the file input is bounded and nothing here restarts.
    conf = {key: value for key, value in job.flink_configuration(config, connector_jar=None).items()
            if not key.startswith(("execution.checkpointing", "restart-strategy"))}
    assert conf["parallelism.default"] == "1" and conf["table.exec.source.idle-timeout"] == "0 ms"
    env = job.create_table_environment(conf)
    for statement in _file_sources(config, path) + job.statements(config, parts=("transform",)):
        env.execute_sql(statement)

    from ablab.streaming.loader.rows import WINDOW_COLUMNS

    windows = {_key(r): r for r in _collect(env, "inference_window_stats", list(WINDOW_COLUMNS))}
    late = _collect(env, "late_rows", ["event_type", "event_id", "ts", "watermark"])
    late_ids = {r["event_id"] for r in late}
    assert late_ids == set()  # in ts order, and the year-9999 event did not move the per-partition maximum
    # the id the job derives is the edge's (derive_event_id), and its two deliveries are one
    anon_ids = [r["event_id"] for r in _collect(env, "inference_checked", ["event_id", "trace_id"])
                if r["trace_id"] == "anon-trace"]
    assert anon_ids == [ref.identity(anonymous)]
    rejected = _collect(env, "rejected_rows", ["field", "event_id"])
    assert sorted((r["field"], r["event_id"]) for r in rejected) == [("e2e_ms", "huge"), ("ts", "future")]
    expected = ref.inference_windows(inference, late_ids=late_ids)
    assert len(expected) == 8  # 4 windows x 2 variants
    ref.assert_window_rows(windows, expected)
    assert sum(r["n"] for r in windows.values()) + len(late_ids) == len(ref.dedup(inference))  # dedup + bad rows out
    assert not ({"bad-type", "no-variant"} & late_ids)

