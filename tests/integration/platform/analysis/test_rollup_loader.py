"""The per-unit rollup fed by the real loader from a real Kafka broker into real chDB:
rollup == raw scan == offline analysis of the same events, after a loader killed in the
middle of its rollup step and replayed, with labels that arrive after their requests were
loaded, labels that arrive *before* their request, producer duplicates and a billing record.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from ablab.platform.analytics.results import aggregates_from_rollup, results_from_raw
from ablab.platform.events import Rejection, validate_event
from ablab.platform.stats.engine import analyze_results
from ablab.platform.stats.offline import analyze_events
from ablab.platform.stats.spec import parse_spec
from ablab.platform.stats.synthetic import spec_dict, synthetic_events
from ablab.streaming.loader.service import Loader
from ablab.streaming.store import rollup
from ablab.streaming.store.reads import StoreReads
from ablab_testing.loading import run_until_idle
from ablab_testing.pipeline import PipelineTopics, RawProducer
from ablab_testing.results import assert_same_results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SPEC = spec_dict(slos={"ttft_ms": 200, "tpot_ms": 25},
                 guardrails=[{"metric": "ttft_ms_p95", "max": 400}, {"metric": "accuracy", "margin": 0.03}])


def _events() -> pd.DataFrame:
    ev = synthetic_events(n_requests=3_000, n_units=300, seed=23)
    start = ev["ts"].min()
    # over a day and a half rather than an hour: units span many hours and late labels arrive
    # hours after their requests (a rollup keyed by time must place them in the request's hour)
    ev["ts"] = (start + (ev["ts"] - start) * 40).dt.floor("ms")
    ev = ev.reset_index(drop=True)
    ev["event_id"] = [f"ev{i}" for i in range(len(ev))]
    billed = ev[ev["type"] == "inference"].iloc[[3]].copy()
    billed["type"], billed["cost_usd"], billed["event_id"] = "cost", 0.25, "bill-1"
    return pd.concat([ev, billed], ignore_index=True)


def _json(row: pd.Series) -> dict:
    out = {"v": 1, "type": row["type"], "event_id": row["event_id"], "ts": row["ts"].isoformat().replace("+00:00", "Z")}
    for name, value in row.items():
        if name in out or name in ("v",) or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if name in ("prompt_tokens", "output_tokens", "correct"):
            value = int(value)
        out[name] = value
    if row["type"] == "feedback":
        for name in ("experiment", "variant", "unit_id"):
            out.pop(name, None)
    if row["type"] == "cost":
        out = {k: out[k] for k in ("v", "type", "event_id", "ts", "trace_id", "cost_usd") if k in out}
    if row["type"] == "inference":
        out.setdefault("strategy", "s")
    return out


@pytest.mark.parametrize(("interval_s", "kill_at"), [(0.0, 3), (60.0, 1)], ids=["checkpoint-per-batch", "deferred-recompute"])
def test_loader_fed_rollup_equals_raw_scan_and_offline_after_kill_replay_and_late_labels(kafka_broker, store, monkeypatch,
                                                                                         interval_s, kill_at):
    """Killed inside the rollup step, replayed, then late labels: the rollup equals the raw scan
    and the offline analysis, whether each batch is its own checkpoint or several batches share
    one recompute (a 60 s interval: only catching up or stopping checkpoints)."""
    events = _events()
    records = [_json(row) for _, row in events.iterrows()]
    bad = [r for r in records if isinstance(validate_event(json.dumps(r).encode()), Rejection)]
    assert not bad, validate_event(json.dumps(bad[0]).encode())
    inference = [r for r in records if r["type"] == "inference"]
    labels = [r for r in records if r["type"] == "feedback"]
    others = [r for r in records if r["type"] in ("exposure", "cost")]
    held_back = {r["trace_id"] for r in inference[-150:]}  # their labels arrive before them
    early_labels = [r for r in labels if r["trace_id"] in held_back]
    late_labels = [r for r in labels if r["trace_id"] not in held_back]
    assert early_labels and late_labels

    spec = parse_spec(SPEC)
    rollup.set_slos(store, spec.key, spec.slos)  # as the first results read does
    topics = PipelineTopics.unique("rlp")
    topics.create(bootstrap=kafka_broker)
    common = dict(group_id=f"{topics.prefix}-loader", topics=(topics.inference, topics.feedback),
                  windows_topic=topics.windows, deadletter_topic=topics.deadletter, batch_max_records=400,
                  rollup_interval_s=interval_s)
    producer = RawProducer(kafka_broker)
    # phase 1: most requests (with producer-retry duplicates), exposures, labels of requests not yet sent
    producer.send(topics.inference, inference[:-150] + inference[:200:7])
    producer.send(topics.feedback, others + early_labels)

    # killed inside the rollup step: raw and lookup rows inserted, unit rows not recomputed, offsets not committed
    real = rollup.recompute_units
    calls = {"n": 0}

    class Killed(BaseException):
        """A kill, not an error: nothing in the loader handles it (it would bisect an Exception)."""

    def dies_on_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == kill_at:
            raise Killed("simulated crash in the middle of the rollup step")
        return real(*args, **kwargs)

    monkeypatch.setattr(rollup, "recompute_units", dies_on_third)
    assert isinstance(run_until_idle(Loader(store, kafka_broker, **common)), Killed)
    monkeypatch.setattr(rollup, "recompute_units", real)
    replay = Loader(store, kafka_broker, **common)
    assert run_until_idle(replay) is None
    if interval_s:  # several batches did share a checkpoint
        assert replay.stats.checkpoints < replay.stats.batches, replay.stats.as_dict()

    # phase 2: the held-back requests (their labels are already loaded), then the late labels
    producer.send(topics.inference, inference[-150:])
    producer.send(topics.feedback, late_labels)
    producer.close()
    assert run_until_idle(Loader(store, kafka_broker, **common)) is None

    # the loader alone kept the rollup complete and current: nothing for the reader to repair
    assert rollup.ensure_fresh(store, spec.key, spec.slos) == {"slo": 0, "missing": 0}
    # no breakdown declared: the loader kept no segment rows (they cost it a second pass)
    assert store.query("SELECT count() FROM unit_segment_stats WHERE experiment = {e:String}",
                       parameters={"e": spec.key}).result_rows[0][0] == 0
    stats, exposures = _rollup_stats(store, spec)
    from_rollup = analyze_results(spec=spec, stats=stats, exposures=exposures).model_dump(mode="json")
    from_raw = results_from_raw(StoreReads(store), spec).model_dump(mode="json")
    offline, _ = analyze_events(events, spec)
    offline = offline.model_dump(mode="json")
    assert sum(s.ratios["error_rate"].sum_y for s in stats.values()) == len(inference)  # requests, once each
    assert sum(s.ratios["accuracy"].sum_y for s in stats.values()) == len({r["trace_id"] for r in labels})
    for result in (from_rollup, from_raw):
        assert_same_results(result, offline)

    # a second delivery of everything (a consumer group reset) changes nothing
    again = Loader(store, kafka_broker, **{**common, "group_id": f"{topics.prefix}-again"})
    assert run_until_idle(again) is None
    stats2, _ = _rollup_stats(store, spec)
    assert {k: v.ratios["accuracy"].sum_x for k, v in stats2.items()} == {k: v.ratios["accuracy"].sum_x for k, v in stats.items()}
    assert {k: v.ratios["e2e_ms"].sum_x for k, v in stats2.items()} == pytest.approx(
        {k: v.ratios["e2e_ms"].sum_x for k, v in stats.items()}, rel=1e-12)

    # changed SLOs: the maintenance step recomputes the stale units, goodput follows
    looser = parse_spec({**SPEC, "slos": {"ttft_ms": 400}})
    repaired = rollup.ensure_fresh(store, spec.key, looser.slos)
    assert repaired["slo"] == len({(r["variant"], r["unit_id"]) for r in inference})  # every unit row
    stats3, _ = _rollup_stats(store, looser)
    offline3, _ = analyze_events(events, looser)
    offline3 = offline3.model_dump(mode="json")
    good = {r["variant"]: r["estimate"] for r in offline3["metrics"] if r["metric"] == "goodput"}
    for variant, vs in stats3.items():
        assert vs.ratios["goodput"].sum_x / vs.ratios["goodput"].sum_y == pytest.approx(good[variant], rel=1e-9)


def _rollup_stats(store, spec):
    agg = aggregates_from_rollup(StoreReads(store), spec)
    return agg.stats, agg.exposures
