"""When the loader checkpoints (recomputes the rollup of the units stored since the last one,
then commits), and that one checkpoint covers the batches before it. Stand-ins for the store,
the consumer and the rollup's statements; the real ones are in
tests/integration/platform/analysis/test_rollup_loader.py and
tests/integration/streaming/test_loader_faults.py."""

from __future__ import annotations

import pytest

from ablab.streaming.loader.service import Loader, _Origin
from ablab.streaming.store import rollup
from ablab.streaming.store.columns import RAW_COLUMNS


class _Store:
    def __init__(self) -> None:
        self.inserted: list[str] = []

    def insert(self, table, rows, column_names):
        self.inserted.append(table)


class _Consumer:
    def __init__(self) -> None:
        self.commits = 0

    def commit(self) -> None:
        self.commits += 1

    def assignment(self) -> set:
        return set()


def _row(unit: str) -> tuple:
    values = dict.fromkeys(RAW_COLUMNS)
    values.update(type="inference", experiment="exp", unit_id=unit, event_id=f"e-{unit}")
    return tuple(values[c] for c in RAW_COLUMNS)


def _pend(loader: Loader, *units: str) -> None:
    loader._pending["raw_events"] = [_row(u) for u in units]
    loader._origins["raw_events"] = [_Origin("t", 0, i, b"{}") for i in range(len(units))]
    loader._pending_count = len(units)


@pytest.fixture
def recorded(monkeypatch):
    recomputes: list[dict[str, set[str]]] = []
    monkeypatch.setattr(rollup, "place", lambda client, rows: {"exp": {r[RAW_COLUMNS.index("unit_id")] for r in rows}})
    monkeypatch.setattr(rollup, "recompute_touched",
                        lambda client, units: recomputes.append({k: set(v) for k, v in units.items()}) or
                        {k: len(v) for k, v in units.items()})
    return recomputes


def test_batches_between_checkpoints_share_one_recompute_and_one_commit(recorded):
    loader = Loader(_Store(), "unused:9092", rollup_interval_s=60.0)
    loader._consumer = consumer = _Consumer()
    for units in (("a", "b"), ("b", "c")):
        _pend(loader, *units)
        loader._flush(checkpoint=False)
    assert recorded == [] and consumer.commits == 0 and loader.stats.batches == 2
    _pend(loader, "c", "d")
    loader._flush(checkpoint=True)
    assert recorded == [{"exp": {"a", "b", "c", "d"}}]  # each unit once, the last batch's too
    assert consumer.commits == 1 and loader.stats.checkpoints == 1 and loader.stats.rollup_units == 4
    assert not loader._dirty and not loader._uncommitted


def test_a_checkpoint_alone_recomputes_its_own_batch(recorded):
    loader = Loader(_Store(), "unused:9092", rollup_interval_s=60.0)
    loader._consumer = consumer = _Consumer()
    _pend(loader, "a")
    loader.flush()
    loader.flush()  # nothing pending, nothing uncommitted: no statement, no commit
    assert recorded == [{"exp": {"a"}}] and consumer.commits == 1


def test_when_a_checkpoint_is_due():
    loader = Loader(_Store(), "unused:9092", rollup_interval_s=5.0, rollup_max_units=3)
    loader._consumer = _Consumer()
    start = loader._checkpoint_at
    assert loader._checkpoint_due(start + 1, caught_up=True)  # nothing more to read
    assert not loader._checkpoint_due(start + 1, caught_up=False)  # behind, recently checkpointed
    assert loader._checkpoint_due(start + 5, caught_up=False)  # the interval is up
    loader._dirty["exp"] = {"a", "b", "c"}
    assert loader._checkpoint_due(start + 1, caught_up=False)  # too many units waiting
    assert Loader(_Store(), "unused:9092", rollup_interval_s=0)._checkpoint_due(start, caught_up=False)
    assert Loader(_Store(), "unused:9092", rollup=False)._checkpoint_due(start, caught_up=False)


def test_heartbeats_alone_are_committed_past(recorded):
    """issue 35: a quiet stream's only records are the edge's heartbeats; nothing is stored,
    but their offsets are committed, so the lag does not grow by them."""
    from datetime import UTC, datetime

    from ablab.platform.events import heartbeat_record

    class _Partition:
        topic, partition = "ablab.inference", 0

    class _Record:
        offset, value = 7, heartbeat_record(datetime.now(UTC))

    class _Polling(_Consumer):
        def poll(self, timeout_ms, max_records):
            return {_Partition(): [_Record()]}

    store = _Store()
    loader = Loader(store, "unused:9092", rollup_interval_s=60.0)
    loader._consumer = consumer = _Polling()
    assert loader.poll_once() == 1
    assert loader.stats.heartbeats == 1 and loader._pending_count == 0 and not loader._dead
    loader.flush()  # the caught-up checkpoint
    assert consumer.commits == 1 and recorded == [] and store.inserted == []
