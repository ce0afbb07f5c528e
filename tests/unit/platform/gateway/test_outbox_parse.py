"""The outbox's line parsing and event ids: pure functions."""

from __future__ import annotations

import json

from ablab.platform.gateway.outbox import _parse, event_id_for


def test_a_whole_line_parses_with_nothing_skipped() -> None:
    event = {"v": 1, "type": "rum", "trace_id": "t1", "e2e_ms": 3.0}
    assert _parse(json.dumps(event).encode()) == (event, 0)


def test_a_torn_fragment_is_skipped_and_the_glued_event_kept() -> None:
    event = {"v": 1, "type": "exposure", "trace_id": "t2"}
    whole = json.dumps(event)
    fragment = json.dumps({"v": 1, "type": "inference", "trace_id": "t3", "e2e_ms": 12.5})[:30]
    assert _parse((fragment + whole).encode()) == (event, len(fragment))


def test_garbage_yields_no_event() -> None:
    assert _parse(b'{"v": 1, "type": "rum", "tra')[0] is None
    assert _parse(b"not json")[0] is None


def test_event_ids_are_stable_per_file_and_offset_and_distinct_otherwise() -> None:
    assert event_id_for("worker-0.jsonl", 120) == event_id_for("worker-0.jsonl", 120)
    ids = {event_id_for(name, off) for name in ("worker-0.jsonl", "worker-1.jsonl") for off in (0, 120, 121)}
    assert len(ids) == 6
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)  # the schema's identifier pattern: hex
