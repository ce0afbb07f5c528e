"""Readiness verdicts of the streaming components (ablab.streaming.kafka.health)."""

from __future__ import annotations

from ablab.streaming.kafka.health import emitter_verdict, loader_verdict
from ablab.streaming.loader.service import LoaderStats


def test_a_loader_that_cannot_store_its_batch_is_not_ready():
    stats = LoaderStats(last_flush_at=1000.0)
    assert loader_verdict(stats, now=1001.0).startswith("ok")
    stats.consecutive_failures, stats.last_error = 3, "StoreUnavailable: connection refused"
    verdict = loader_verdict(stats, now=1001.0)
    assert verdict.startswith("failed") and "connection refused" in verdict and "3 attempts" in verdict


def test_a_loader_with_records_waiting_and_nothing_committed_is_stalled():
    stats = LoaderStats(last_flush_at=1000.0, lag={("ablab.inference", 0): 40})
    assert loader_verdict(stats, now=1030.0, stall_s=60).startswith("ok")
    assert loader_verdict(stats, now=1100.0, stall_s=60).startswith("failed: the loader has 40 records waiting")
    stats.lag = {("ablab.inference", 0): 0}  # idle, not stalled
    assert loader_verdict(stats, now=5000.0, stall_s=60).startswith("ok")


def test_an_emitter_dropping_or_backlogged_beyond_the_bound_is_not_ready():
    assert emitter_verdict({"broker_up": True, "spool_pending": 0}).startswith("ok")
    assert emitter_verdict({"broker_up": False, "spool_pending": 10}, max_spool=100).startswith("ok")
    assert emitter_verdict({"broker_up": False, "spool_pending": 101}, max_spool=100).startswith("failed")
    assert emitter_verdict({"broker_up": True, "spool_pending": 0, "dropped": 2}).startswith("failed: the emitter dropped 2")
