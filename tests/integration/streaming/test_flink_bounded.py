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
        # Kafka metadata from the file: partition 0; the record timestamp from an optional
        # `received_at` field (a Kafka record always has one: default it to the event time).
        head = (statement.split(") WITH (")[0].replace("INT METADATA FROM 'partition' VIRTUAL", "AS 0")
                .replace("received      TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL",
                         "received_at TIMESTAMP_LTZ(3),\n    received AS COALESCE(received_at, ts)"))
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



def test_a_clock_running_ahead_and_boundary_values_agree_with_the_edge(tmp_path):
    """issue 37: one event stamped 120 s ahead (inside max_future_s, so the edge takes it)
    makes no later on-time event late, and keeps its own window; every boundary value is
    kept or refused by the job exactly as the edge's validation (which the loader shares)
    keeps or refuses it, naming the same field (-0.0 included)."""
    import math
    from datetime import timedelta

    from ablab.platform.events import Rejection, validate_event

    now = datetime.now(UTC).replace(microsecond=0)
    stream = ref.canned_stream(start=now - timedelta(seconds=60), windows=5, per_window=20, experiment="skew",
                               jitter_ms=0, seed=5)
    inference = sorted(ref.dedup(stream.inference), key=lambda e: e["ts"])
    middle = len(inference) // 2
    # What the edge writes: the record timestamp is when it received the event, not its ts.
    ahead = {**inference[middle], "event_id": "ahead", "trace_id": "ahead",
             "ts": ref.iso(now + timedelta(seconds=120)), "received_at": inference[middle]["ts"]}
    boundary = []
    cases = [*ref.boundary_values(), ("ttft_ms", 120.0)]  # the last: a first token after the last
    for i, (name, value) in enumerate(cases):
        event = {**ref.coherent(inference[middle], name, value), "event_id": f"bound-{i}", "trace_id": f"bound-{i}"}
        if i == len(cases) - 1:
            event["e2e_ms"] = 110.0
        verdict = validate_event(json.dumps(event))
        boundary.append((event, verdict.field if isinstance(verdict, Rejection) else None))
    assert {field for _, field in boundary} >= {None, "e2e_ms", "ttft_ms", "tpot_ms", "cost_usd", "prompt_tokens"}
    assert any(e["e2e_ms"] == 0 and math.copysign(1, e["e2e_ms"]) < 0 for e, field in boundary if field is None)

    # a shadow request (issue 34) is compared with its primary in the store, never windowed
    shadow = {**inference[middle], "event_id": "shadow", "trace_id": "shadow", "shadow_of": inference[middle]["trace_id"]}
    path = tmp_path / "inference.json"
    with path.open("w") as handle:
        for event in [*inference[:middle], ahead, shadow, *(e for e, _ in boundary), *inference[middle:]]:
            handle.write(json.dumps(event) + "\n")
    config = job.JobConfig(out_of_orderness_s=2.0)
    conf = {key: value for key, value in job.flink_configuration(config, connector_jar=None).items()
            if not key.startswith(("execution.checkpointing", "restart-strategy"))}
    env = job.create_table_environment(conf)
    for statement in _file_sources(config, str(path)) + job.statements(config, parts=("transform",)):
        env.execute_sql(statement)

    rejected = {r["event_id"]: r["field"] for r in _collect(env, "rejected_rows", ["field", "event_id"])}
    assert rejected == {e["event_id"]: field for e, field in boundary if field is not None}
    assert _collect(env, "late_rows", ["event_id"]) == []  # the clock running ahead made nothing late
    windows = _collect(env, "inference_window_stats", ["window_start", "n", "e2e_ms_sum"])
    kept = [*inference, ahead, *(e for e, field in boundary if field is None)]
    assert sum(r["n"] for r in windows) == len(kept)
    assert sum(r["e2e_ms_sum"] for r in windows) == pytest.approx(sum(e["e2e_ms"] for e in kept), rel=1e-12)
    assert ref.window_start_ms(ref.parse_ms(ahead["ts"])) in {
        ref.parse_ms(r["window_start"].replace(" ", "T") + "Z") for r in windows}  # its own window, still open
