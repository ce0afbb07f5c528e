"""The demo's outbox forwarder against the real API: deterministic event_ids, position saved only
after a 202, a torn line recovered, nothing posted while the API is unreachable.

The API runs with its broker absent, so its emitter spools every accepted event to disk: the
spool shows exactly what the API accepted, event_ids included.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from ablab.platform.gateway.outbox import Forwarder, event_id_for, http_poster
from ablab_testing import closed_port, start_api, stop_api

pytestmark = pytest.mark.timeout(180)


def _label(trace: str) -> dict:
    return {"v": 1, "type": "feedback", "ts": datetime.now(UTC).isoformat(), "trace_id": trace, "correct": 1, "source": "human"}


def _spooled_event_ids(home: Path, *, expect: int) -> list[str]:
    """The event_ids the API's emitter spooled, once ``expect`` of them are on disk (it spools asynchronously)."""
    import time

    deadline = time.monotonic() + 30
    while True:
        ids = _read_spool(home)
        if len(ids) >= expect or time.monotonic() > deadline:
            return ids
        time.sleep(0.3)


def _read_spool(home: Path) -> list[str]:
    ids = []
    for segment in sorted((home / "spool").glob("api-*/seg-*.jsonl")):
        for line in segment.read_bytes().splitlines():
            ids.append(json.loads(json.loads(line)["value"])["event_id"])
    return ids


def _drain(forwarder: Forwarder) -> None:
    for _ in range(100):
        if not forwarder.step() and not any(forwarder.behind().values()):
            return
    raise AssertionError(f"outbox not drained: {forwarder.behind()}")


def test_forwarder_ships_each_line_once_with_stable_ids(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    server = start_api(f"sqlite:///{home / 'registry.db'}", home,
                       extra_env={"ABLAB_ANALYTICS": "false", "ABLAB_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed_port()}"})
    outbox = home / "outbox"
    outbox.mkdir()
    try:
        traces = [uuid.uuid4().hex for _ in range(21)]
        lines = [json.dumps(_label(t)) for t in traces]
        # A writer killed mid-line: its restarted successor's first event is glued to the fragment.
        torn = lines[10][:25] + lines[10]
        body = "\n".join(lines[:10] + [torn] + lines[11:]) + "\n"
        (outbox / "worker-0.jsonl").write_text(body)
        offsets, at = [], 0
        for line in body.encode().splitlines(keepends=True):
            offsets.append(at)
            at += len(line)
        expected_ids = {event_id_for("worker-0.jsonl", off + (25 if i == 10 else 0)) for i, off in enumerate(offsets)}

        unreachable = Forwarder(outbox, post=http_poster(f"http://127.0.0.1:{closed_port()}", server.tokens["sdk"], timeout_s=2))
        with pytest.raises(httpx.HTTPError):
            unreachable.step()
        assert unreachable.positions == {} and not (outbox / ".positions.json").exists()  # nothing acknowledged

        forwarder = Forwarder(outbox, post=http_poster(server.base_url, server.tokens["sdk"]), batch_max=8)
        _drain(forwarder)
        assert forwarder.stats.posted == 21 and forwarder.stats.torn == 1 and forwarder.stats.rejected == 0
        first = _spooled_event_ids(home, expect=21)
        assert sorted(first) == sorted(expected_ids)

        # Appended later: only the new line is shipped.
        with (outbox / "worker-0.jsonl").open("a") as handle:
            handle.write(json.dumps(_label("late-one")) + "\n")
        _drain(Forwarder(outbox, post=http_poster(server.base_url, server.tokens["sdk"])))
        assert len(_spooled_event_ids(home, expect=22)) == 22

        # A forwarder that died before saving its position re-posts the same events with the same ids.
        (outbox / ".positions.json").unlink()
        _drain(Forwarder(outbox, post=http_poster(server.base_url, server.tokens["sdk"])))
        again = _spooled_event_ids(home, expect=44)
        assert len(again) == 44 and set(again) == set(first) | {event_id_for("worker-0.jsonl", at)}
    finally:
        stop_api(server)
