"""One per-unit plan, three renderings: the raw scan over ``raw_events`` (SQL), the rollup
recompute (SQL over the loader's lookup tables, read back from ``unit_stats``) and numpy
(``ablab analyze``) give the same per-unit numbers on the same events — with the one error
rule (an empty ``error`` is no error), the one ``good`` predicate (a missing TPOT meets its
SLO, a missing TTFT does not) and the one validity rule (a negative latency drops the
request). Real ClickHouse engine, in process (chDB in memory)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ablab.platform.analytics.results import aggregates_from_raw, aggregates_from_rollup, rollup_applies
from ablab.platform.stats import unit_agg as ua
from ablab.platform.stats.offline import aggregate_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab.streaming.store import apply_ddl, rollup
from ablab.streaming.store.reads import StoreReads
from ablab_testing import insert_synthetic_raw

SLOS = {"ttft_ms": 200.0, "tpot_ms": 25.0, "e2e_ms": 5_000.0}


def _spec():
    data = spec_dict(slos=SLOS)
    data["metrics"] = {**(data.get("metrics") or {}),
                       "custom": [{"name": "judge", "type": "mean", "column": "score"},
                                  {"name": "toks", "type": "mean", "column": "output_tokens", "aggregation": "unit_sum"}]}
    return parse_spec(data)


def _events() -> pd.DataFrame:
    ev = synthetic_events(n_requests=1_500, n_units=120, seed=11)
    ev["ts"] = ev["ts"].dt.floor("ms")
    fb = ev["type"] == "feedback"
    ev["score"] = np.where(fb, np.random.default_rng(2).uniform(0, 10, len(ev)).round(3), np.nan)
    base = ev[ev["type"] == "inference"].iloc[0].to_dict()
    crafted = [  # the edge cases of the shared predicates, on one unit of their own
        {"trace_id": "k-no-tpot", "tpot_ms": np.nan, "ttft_ms": 10.0, "e2e_ms": 50.0, "error": None},  # good
        {"trace_id": "k-no-ttft", "tpot_ms": 5.0, "ttft_ms": np.nan, "e2e_ms": 50.0, "error": None},  # not good
        {"trace_id": "k-empty-error", "tpot_ms": 5.0, "ttft_ms": 10.0, "e2e_ms": 50.0, "error": ""},  # no error: good
        {"trace_id": "k-error", "tpot_ms": 5.0, "ttft_ms": 10.0, "e2e_ms": 50.0, "error": "timeout"},  # an error
        {"trace_id": "k-negative", "tpot_ms": -1.0, "ttft_ms": 10.0, "e2e_ms": 50.0, "error": None},  # invalid: dropped
    ]
    rows = [{**base, **c, "unit_id": "k-unit", "variant": base["variant"]} for c in crafted]
    return pd.concat([ev, pd.DataFrame(rows)], ignore_index=True)


@pytest.fixture
def store(memory_db):
    apply_ddl(memory_db)
    return memory_db


def test_raw_scan_rollup_and_numpy_give_the_same_per_unit_numbers(store) -> None:
    spec, events = _spec(), _events()
    insert_synthetic_raw(store, events)
    repaired = rollup.sync(store, spec)  # the maintenance step: backfill, then the recompute
    assert repaired["missing"] > 0
    reads = StoreReads(store)
    assert rollup_applies(spec) and reads.rollup_current(spec)

    plan = ua.plan(spec)
    names = [c.name for c in plan.columns]
    hashes = dict(store.query("SELECT DISTINCT cityHash64(unit_id), unit_id FROM raw_events").result_rows)

    def frame(units: dict[str, np.ndarray], label) -> pd.DataFrame:
        out = pd.DataFrame({k: units[k] for k in ["variant", *names]})
        out["variant"] = out["variant"].astype(str)
        out["unit"] = [label(u) for u in units["unit_id"]]
        return out.set_index(["variant", "unit"]).sort_index()

    raw = frame(aggregates_from_raw(reads, spec).units, lambda u: hashes[int(u)])
    rolled = frame(aggregates_from_rollup(reads, spec).units, lambda u: hashes[int(u)])
    unit_labels = pd.unique(events["unit_id"].dropna())
    offline = aggregate_events(events, spec).units
    numpy = frame({**offline, "unit_id": offline["unit_id"]}, lambda u: unit_labels[int(u)])

    assert list(raw.index) == list(rolled.index) == list(numpy.index)
    for name in names:
        np.testing.assert_allclose(rolled[name], raw[name], rtol=1e-9, atol=1e-9, err_msg=f"rollup vs raw: {name}")
        np.testing.assert_allclose(numpy[name], raw[name], rtol=1e-9, atol=1e-9, err_msg=f"numpy vs raw: {name}")

    crafted = raw.xs("k-unit", level="unit").iloc[0]
    assert crafted["requests"] == 4  # the negative TPOT is not a request
    assert crafted["errors"] == 1  # "" is no error, "timeout" is
    assert crafted["good"] == 2  # no TPOT: good; no TTFT: not; the error: not
    assert raw["good"].sum() > 0 and raw["errors"].sum() > 1 and raw["c__judge__y"].sum() > 0


def test_every_rendering_takes_the_predicates_from_the_plan() -> None:
    params: dict = {}
    good = ua.good_sql(SLOS, params)
    assert "(r.tpot_ms IS NULL OR r.tpot_ms <= {slo_tpot_ms:Float64})" in good
    assert "(r.ttft_ms IS NOT NULL AND r.ttft_ms <= {slo_ttft_ms:Float64})" in good
    assert params == {f"slo_{k}": v for k, v in SLOS.items()}
    # the rollup recompute renders the same definitions over its own row aliases
    statements = rollup._recompute_sql(True, {**SLOS, "e2e_ms": None}, params := {})
    assert all(ua.valid_sql("e.") in s for s in statements)
    assert all(ua.good_sql({"ttft_ms": 200.0, "tpot_ms": 25.0}, {}, prefix="e.", error="(e.is_error = 1)") in s
               for s in statements)
    assert all(ua.column_sql(c, rollup._ALIAS, "valid") in statements[0] for c in ua.BUILTIN)
    assert "slo_e2e_ms" not in params  # no bound: no SLO
    assert ua.is_error("") is False and ua.is_error(None) is False and ua.is_error("x") is True


def test_the_built_in_columns_are_the_catalogues() -> None:
    from ablab.platform.stats.metrics import UNIT_COLUMNS

    assert tuple(c.name for c in ua.BUILTIN) == UNIT_COLUMNS
    assert rollup.ROLLUP_EVENT_COLUMNS[6:-3] == ua.SOURCE_FIELDS
