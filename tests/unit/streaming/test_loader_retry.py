"""The loader while the store is away: the same batch (never a larger one) is retried with
backoff, the failure is visible to /readyz, and nothing is split or dead-lettered for it.
The store and the consumer are stand-ins here; tests/integration/streaming/test_loader_faults.py
covers the real broker and ClickHouse."""

from __future__ import annotations

import threading

from ablab.streaming.kafka.health import loader_verdict
from ablab.streaming.loader.service import Loader, _Origin


class _AwayThenBack:
    """Refuses everything until ``away`` of its SELECT 1 probes have failed."""

    def __init__(self, away: int) -> None:
        self.away = away
        self.inserted: list[list] = []

    def insert(self, table, rows, column_names):
        if self.away:
            raise ConnectionError("store unreachable")
        self.inserted.append(list(rows))

    def query(self, sql):
        if self.away:
            self.away -= 1
            raise ConnectionError("store unreachable")


class _Consumer:
    def __init__(self) -> None:
        self.commits = 0

    def commit(self) -> None:
        self.commits += 1

    def assignment(self) -> set:
        return set()


def test_a_store_outage_retries_the_same_batch_and_shows_as_failing():
    store = _AwayThenBack(away=2)
    loader = Loader(store, "unused:9092", rollup=False, retry_max_s=0.01)
    loader._consumer = _Consumer()
    rows = [("w", i) for i in range(5)]
    loader._pending["window_stats"] = list(rows)
    loader._origins["window_stats"] = [_Origin("ablab.windows", 0, i, b"{}") for i in range(5)]
    loader._pending_count = len(rows)
    seen: list[str] = []
    original = loader._flush

    def flush(*, checkpoint: bool) -> None:
        seen.append(loader_verdict(loader.stats))
        original(checkpoint=checkpoint)

    loader._flush = flush  # type: ignore[method-assign]
    loader._flush_until_stored(threading.Event())
    assert store.inserted == [rows]  # stored once, whole, after two failed attempts
    assert loader.stats.failures == 2 and loader.stats.consecutive_failures == 0 and loader.stats.bisections == 0
    assert seen[0].startswith("ok") and all(v.startswith("failed: the loader cannot store") for v in seen[1:])
    assert loader.stats.dead_lettered == {} and loader._consumer.commits == 1
    assert loader._pending_count == 0 and not loader._pending
