"""The analysis end in the store (issue 33 item 5): the raw scan, its exposures and the shadow
query render ``ts < end`` (bound parameters), so after a ship the store's results are the
comparison before it and equal ``ablab analyze``'s over the same events; the per-unit rollup
holds all-time sums, so a spec with an end reads the raw scan even where the rollup is current.
Real ClickHouse engine, in process (chDB in memory)."""

from __future__ import annotations

import pandas as pd
import pytest

from ablab.platform.analytics.results import aggregates, results_from_raw, rollup_applies
from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.offline import analyze_events
from ablab.streaming.store import apply_ddl, rollup
from ablab.streaming.store.reads import StoreReads
from ablab_testing import insert_synthetic_raw
from ablab_testing.analysis_window import (  # the offline test's scenario: one scenario, two renderings
    PAIR,
    SHIP_AT,
    after_ship_events,
    comparison_events,
    numbers,
    shipped_spec,
    spec_of,
)


@pytest.fixture
def store(memory_db):
    apply_ddl(memory_db)
    return memory_db


def test_the_sql_renders_the_end_as_a_bound_parameter() -> None:
    spec = shipped_spec()
    sql = ua.store_sql(ua.plan(spec), spec, top={})
    assert sql.params["end_ms"] == int(SHIP_AT.timestamp() * 1000)
    assert "toUnixTimestamp64Milli(r.ts) < {end_ms:Int64}" in sql.main
    assert SHIP_AT.isoformat() not in sql.main  # bound, never spliced
    shadows = ua.shadow_sql(spec, ())
    assert shadows.params["end_ms"] == sql.params["end_ms"] and "{end_ms:Int64}" in shadows.requests
    assert "end_ms" not in ua.store_sql(ua.plan(spec_of()), spec_of()).params
    assert ua.rollup_unsupported(ua.plan(spec), spec) is not None and "analysis end" in ua.rollup_unsupported(ua.plan(spec), spec)


def test_after_a_ship_the_store_reads_the_comparison_and_equals_analyze(store) -> None:
    before, after = comparison_events(), after_ship_events()
    everything = pd.concat([before, after], ignore_index=True)
    insert_synthetic_raw(store, everything)
    reads, spec = StoreReads(store), shipped_spec()
    rollup.sync(store, spec_of())  # the rollup is current for the experiment ...
    assert rollup_applies(spec_of()) and aggregates(reads, spec_of()).source == "rollup"
    assert not rollup_applies(spec) and aggregates(reads, spec).source == "raw"  # ... and not read with an end

    live = results_from_raw(reads, spec)
    offline, _ = analyze_events(everything, spec)
    assert not live.srm.flagged and {d.variant: d.decision for d in live.decisions} == {"int8": "ship"}
    assert live.window == offline.window and live.window is not None and live.window.shipped is not None
    got, want = numbers(live), numbers(offline)
    assert got["srm"] == want["srm"] and got["decisions"] == want["decisions"]
    for a, b in zip(got["metrics"], want["metrics"], strict=True):
        assert (a["metric"], a["variant"], a["units"], a["n"]) == (b["metric"], b["variant"], b["units"], b["n"])
        assert a["estimate"] == b["estimate"] or a["estimate"] == pytest.approx(b["estimate"], rel=1e-9), (a, b)

    # exposures: the units exposed before the ship, not the winner's later ones
    pre = before[before["type"] == "exposure"].groupby("variant")["unit_id"].nunique().to_dict()
    assert reads.exposures(spec.key, end_ms=ua.end_ms(spec.end)) == pre
    assert reads.exposures(spec.key)["int8"] > pre["int8"]  # the later ones are in the store
    assert set(pre) == set(PAIR)
