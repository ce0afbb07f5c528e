"""Migration 0014 (the rollup in two levels, units and their hours) on a store that already
holds events: the lookup tables are rebuilt by hour from what is loaded, results read the raw
events until the maintenance step has computed the experiment's hours and its units from
them, and then the rollup gives the offline analysis's results. Running the file again, as
after a crash before it was recorded, changes nothing.

chDB allows one data directory per process, so the store side runs in a child process.
"""

import json
import textwrap

import pytest

from ablab.platform.analytics.event_files import write_events
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events

from ablab_testing import run_child_json
from ablab_testing.results import assert_same_results

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import pandas as pd
    from ablab.streaming.store import apply_ddl, make_client, migration_files
    from ablab.platform.stats.spec import parse_spec
    from ablab.platform.analytics.results import aggregates, results_from_rollup
    from ablab.streaming.store.rollup import sync

    store, events_path, spec_path = sys.argv[1:4]
    client = make_client(f"chdb:///{store}")
    before = Path(tempfile.mkdtemp())
    for m in migration_files():
        if m.version < 14:
            (before / f"{m.name}.sql").write_text(m.sql)
    apply_ddl(client, directory=before)

    ev = pd.read_parquet(events_path)
    ev["event_id"] = [f"e{i}" for i in range(len(ev))]
    for col in ("trace_id", "experiment", "variant", "unit_id", "price_version", "source"):
        ev[col] = ev[col].fillna("")
    ev["strategy"], ev["payload"], ev["kafka_partition"], ev["kafka_offset"] = "{}", "", 0, range(len(ev))
    ev["correct"] = ev["correct"].astype("UInt8")
    cols = ["event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id", "ttft_ms", "e2e_ms",
            "tpot_ms", "cost_usd", "price_version", "error", "strategy", "correct", "source", "payload",
            "kafka_partition", "kafka_offset"]
    client.insert_df("raw_events", ev[cols])
    # what the loader had written under 0013: trace pointers and labels, whole-unit rows
    client.command(
        "INSERT INTO rollup_traces (trace_id, type, event_id, ts, experiment, unit_id, correct, cost_usd) "
        "SELECT trace_id, type, event_id, ts, if(type = 'inference', experiment, ''), if(type = 'inference', unit_id, ''), "
        "if(type = 'feedback', correct, NULL), if(type = 'cost', cost_usd, NULL) FROM raw_events "
        "WHERE type IN ('inference', 'feedback', 'cost') AND trace_id != ''")
    client.command("INSERT INTO rollup_events (experiment, unit_id, event_id, trace_id, variant, ts, is_error) "
                   "SELECT experiment, unit_id, event_id, trace_id, variant, ts, 0 FROM raw_events WHERE type = 'inference'")
    client.command("INSERT INTO unit_stats (experiment, variant, unit_id, events, requests, slo_key, rollup_version, computed_at) "
                   "SELECT experiment, variant, unit_id, count(), count(), 'old', 1, now64(6) FROM raw_events "
                   "WHERE type = 'inference' GROUP BY experiment, variant, unit_id")

    def count(sql):
        return int(client.query(sql).result_rows[0][0])

    def state():
        return {
            "events": count("SELECT count() FROM rollup_events FINAL"),
            "labels": count("SELECT count() FROM rollup_labels FINAL"),
            "stats": count("SELECT count() FROM unit_stats FINAL"),
            "hour_rows": count("SELECT count() FROM unit_hour_stats FINAL"),
            "markers": count("SELECT count() FROM unit_stats FINAL WHERE variant = '' AND unit_id = ''"),
            "wrong_hours": count("SELECT count() FROM rollup_events FINAL WHERE hour != intDiv(toUnixTimestamp(ts), 3600)"),
            "label_hours": count("SELECT count() FROM rollup_labels AS l FINAL INNER JOIN "
                                 "(SELECT trace_id, intDiv(toUnixTimestamp(ts), 3600) AS h FROM raw_events WHERE type = 'inference') AS r "
                                 "ON r.trace_id = l.trace_id WHERE l.hour = r.h"),
        }

    out = {"applied": apply_ddl(client), "after": state()}
    ( m14,) = [m for m in migration_files() if m.version == 14]
    for statement in m14.statements():  # a crash before the file was recorded: it runs again
        client.command(statement)
    out["again"] = state()
    spec = parse_spec(json.load(open(spec_path)))
    out["source_before_sync"] = aggregates(client, spec).source
    out["repaired"] = sync(client, spec)
    out["synced"] = state()
    out["unit_hours"] = count("SELECT count() FROM (SELECT DISTINCT unit_id, intDiv(toUnixTimestamp(ts), 3600) "
                              "FROM raw_events WHERE type = 'inference')")
    out["source_after_sync"] = aggregates(client, spec).source
    out["rollup"] = results_from_rollup(client, spec)
    print(json.dumps(out))
""")


def test_migration_0014_rebuilds_the_rollup_by_hour_and_reads_raw_until_it_is_recomputed(tmp_path):
    events = synthetic_events(n_requests=4_000, n_units=300, seed=13)
    start = events["ts"].min()
    events["ts"] = (start + (events["ts"] - start) * 40).dt.floor("ms")  # a day, not half an hour
    path = write_events(events, tmp_path / "ev.parquet")
    spec_data = spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25})
    (tmp_path / "spec.json").write_text(json.dumps(spec_data))
    out = run_child_json(CHILD, str(tmp_path / "chdb"), str(path), str(tmp_path / "spec.json"), timeout=300)

    inference = events[events["type"] == "inference"]
    labelled = events[events["type"].isin(["feedback", "cost"]) & events["trace_id"].isin(inference["trace_id"])]
    assert out["applied"] == ["0014_rollup_hours"]
    after = out["after"]
    assert after["events"] == len(inference) and after["wrong_hours"] == 0
    assert after["labels"] == after["label_hours"] == len(labelled) > 0  # each at its request's hour
    units = inference["unit_id"].nunique()
    assert after["markers"] == 1 and after["stats"] == units + 1 and after["hour_rows"] == 0
    assert out["again"] == after
    assert out["source_before_sync"] == "raw"
    assert out["repaired"]["missing"] == units
    synced = out["synced"]
    assert synced["markers"] == 0 and synced["stats"] == units and synced["hour_rows"] == out["unit_hours"] > units
    assert out["source_after_sync"] == "rollup"
    assert_same_results(out["rollup"], analyze_events(events, parse_spec(spec_data))[0])
