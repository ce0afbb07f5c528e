import random

import pytest

from ablab.inference.labeler import Labeler, LabelerConfig
from ablab.inference.serving.events import ListSink
from ablab.inference.traffic import TrafficConfig, arrival_times, plan_requests
from ablab.platform.events import FeedbackEvent, validate_event


@pytest.mark.parametrize("pattern", ["poisson", "bursty"])
def test_arrivals_keep_the_mean_rate(pattern):
    cfg = TrafficConfig(rate=50, duration_s=200, pattern=pattern)
    n = len(list(arrival_times(cfg, random.Random(1))))
    assert 0.9 * 10_000 < n < 1.1 * 10_000


def test_bursty_arrivals_are_burstier_than_poisson():
    def busiest_second(pattern):
        cfg = TrafficConfig(rate=20, duration_s=100, pattern=pattern, burst_factor=8, burst_fraction=0.1)
        counts = [0] * 100
        for t in arrival_times(cfg, random.Random(2)):
            counts[int(t)] += 1
        return max(counts)

    assert busiest_second("bursty") > 2 * busiest_second("poisson")


def test_planned_requests_are_sticky_and_follow_the_mix():
    reqs = plan_requests(TrafficConfig(rate=100, duration_s=10, users=20, mix={"arith": 1.0, "lookup": 1.0}))
    assert {r.domain for r in reqs} == {"arith", "lookup"}
    users = [r.unit_id for r in reqs]
    assert len(set(users)) <= 20 and users.count("user-0") > len(users) / 20  # popular users recur
    with pytest.raises(ValueError, match="mix"):
        TrafficConfig(mix={"poetry": 1.0})


def test_labeler_samples_a_fraction_and_emits_after_the_delay():
    now = [0.0]
    sink = ListSink()
    lab = Labeler(LabelerConfig(fraction=0.5, delay_median_s=120, delay_sigma=0.5), sink, clock=lambda: now[0])
    for i in range(400):
        lab.offer({"trace_id": f"t{i}", "output": "5" if i % 2 else "4", "answer": "5"})
    assert 150 < lab.sampled < 250
    assert lab.emit_due() == 0  # nothing is due at once
    now[0] = 120.0
    half = lab.emit_due()
    assert 0.3 * lab.sampled < half < 0.7 * lab.sampled  # the median delay splits them
    now[0] = 10_000.0
    lab.emit_due()
    assert lab.emitted == lab.sampled == len(sink.events)
    for e in sink.events:
        assert isinstance(validate_event(e), FeedbackEvent)
        assert e["correct"] == int(int(e["trace_id"][1:]) % 2 == 1)
    with pytest.raises(ValueError, match="answer"):
        lab.offer({"trace_id": "x", "output": "1"})


def test_a_restarted_labeler_emits_the_same_event_ids():
    """A labeler that dies and re-reads its ledger from the start re-sends its labels under
    the same event_ids, so the pipeline (which keys on event_id) keeps one copy each."""
    records = [{"trace_id": f"t{i}", "output": "5", "answer": "5"} for i in range(200)]

    def run_once() -> list[dict]:
        sink = ListSink()
        lab = Labeler(LabelerConfig(fraction=0.3, delay_median_s=0), sink, clock=lambda: 0.0)
        for record in records:
            lab.offer(record)
        lab.emit_due()
        return sink.events

    first, second = run_once(), run_once()
    assert first and [e["event_id"] for e in first] == [e["event_id"] for e in second]
    assert len({e["event_id"] for e in first}) == len(first)  # one id per labeled trace
    other_source = Labeler(LabelerConfig(fraction=1.0, delay_median_s=0, source="judge"), ListSink())
    other_source.offer(records[0])
    other_source.emit_due()
    assert other_source.sink.events[0]["event_id"] not in {e["event_id"] for e in first}
