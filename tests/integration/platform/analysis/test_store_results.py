"""Results from the real ClickHouse engine (chDB), by the raw scan and by the per-unit
rollup (its units computed by the maintenance step), equal the offline analysis of the same events.

chDB allows one data directory per process, so the store side runs in a child process.
"""

import json
import textwrap

import pandas as pd
import pytest

from ablab.platform.analytics.event_files import write_events
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab_testing import run_child_json
from ablab_testing.results import assert_same_results

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import json, sys
    import pandas as pd
    from ablab.streaming.store import apply_ddl, make_client
    from ablab.streaming.store.reads import StoreReads
    from ablab.platform.stats.spec import parse_spec
    from ablab.platform.analytics.results import aggregates, results, results_from_raw, results_from_rollup
    from ablab.streaming.store.rollup import sync as sync_rollup
    from ablab.streaming.store.rollup import backfill_from_raw

    store, events_path, spec_path = sys.argv[1:4]
    client = make_client(f"chdb:///{store}")
    apply_ddl(client)
    ev = pd.read_parquet(events_path)
    ev["event_id"] = [f"e{i}" for i in range(len(ev))]
    ev["ts"] = ev["ts"].dt.floor("ms")
    for col in ("trace_id", "experiment", "variant", "unit_id", "price_version", "source"):
        ev[col] = ev[col].fillna("")
    ev["strategy"] = "{}"
    ev["payload"] = ""
    ev["kafka_partition"] = 0
    ev["kafka_offset"] = range(len(ev))
    cols = ["event_id", "type", "ts", "trace_id", "experiment", "variant", "unit_id", "ttft_ms", "e2e_ms",
            "tpot_ms", "cost_usd", "price_version", "error", "strategy", "correct", "source", "payload",
            "kafka_partition", "kafka_offset"]
    ev["correct"] = ev["correct"].astype("UInt8")
    client.insert_df("raw_events", ev[cols])
    spec = parse_spec(json.load(open(spec_path)))
    backfill_from_raw(client)  # the lookup tables, as migration 0006 does for a store filled before it
    sync_rollup(client, spec)  # the maintenance step: unit_stats computed (results reads never write)
    out = {"raw": results_from_raw(StoreReads(client), spec).model_dump(mode="json"),
           "rollup": results_from_rollup(StoreReads(client), spec).model_dump(mode="json")}
    # a read never writes: under SLOs the rollup was not computed with, it scans raw_events
    def written():
        return [client.query(f"SELECT count() FROM {t}").result_rows[0][0] for t in ("unit_stats", "rollup_slos")]
    before = written()
    looser = parse_spec({**json.load(open(spec_path)), "slos": {"ttft_ms": 400}})
    out["looser_source"] = aggregates(StoreReads(client), looser).source
    out["looser"] = results(StoreReads(client), looser).model_dump(mode="json")
    out["current_source"] = aggregates(StoreReads(client), spec).source
    out["writes"] = [a - b for a, b in zip(written(), before)]
    print(json.dumps(out))
""")


def test_store_results_equal_offline_results(tmp_path):
    events = synthetic_events(n_requests=20_000, n_units=2_000, seed=11)
    events["ts"] = events["ts"].dt.floor("ms")  # the store keeps milliseconds
    # a billing record that replaces one request's cost, on both sides
    extra = events.iloc[[0]].copy()
    extra["type"], extra["cost_usd"] = "cost", 0.5
    events = pd.concat([events, extra], ignore_index=True)
    path = write_events(events, tmp_path / "ev.parquet")
    spec_data = spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25},
                          guardrails=[{"metric": "ttft_ms_p95", "max": 400}, {"metric": "accuracy", "margin": 0.03}])
    (tmp_path / "spec.json").write_text(json.dumps(spec_data))
    both = run_child_json(CHILD, str(tmp_path / "chdb"), str(path), str(tmp_path / "spec.json"), timeout=300)
    offline, _ = analyze_events(events, parse_spec(spec_data))
    offline = offline.model_dump(mode="json")
    for from_store in (both["raw"], both["rollup"]):
        assert_same_results(from_store, offline)
    assert both["writes"] == [0, 0] and both["looser_source"] == "raw" and both["current_source"] == "rollup"
    assert_same_results(both["looser"], analyze_events(events, parse_spec({**spec_data, "slos": {"ttft_ms": 400}}))[0].model_dump(mode="json"))
