"""The gateway's outbox on disk: segments, a cap that refuses requests loudly (503, counted,
logged) instead of dropping events, and retention of shipped segments only."""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_gateway_contract import MSGS
from test_gateway_shadow import metric

from ablab.platform.gateway.outbox import Forwarder, ForwarderGroup, OutboxLimits, prune, segmented_outbox
from ablab.platform.gateway.scripted import ScriptedBackend
from ablab_testing.gateway_harness import gateway_for


def exposure(i: int) -> dict[str, Any]:
    return {"v": 1, "type": "exposure", "ts": "2026-12-06T00:00:00Z", "trace_id": f"t{i:06d}", "experiment": "exp",
            "variant": "a", "unit_id": f"u{i}"}


def lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(directory.glob("*.jsonl")) for line in p.read_text().splitlines()]


class Api:
    """What the forwarder posts to, recording every event (a 202 per batch)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, events: list[dict[str, Any]]) -> httpx.Response:
        self.events.extend(events)
        return httpx.Response(202, json={"accepted": len(events), "rejected": 0})


def test_segments_rotate_and_every_event_is_in_exactly_one(tmp_path: Path) -> None:
    box = segmented_outbox(tmp_path, OutboxLimits(segment_bytes=2000))
    for i in range(60):
        box.write([exposure(i)])
    box.close()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) >= 5 and all(p.stat().st_size < 2000 + 400 for p in files)
    assert sorted(e["trace_id"] for e in lines(tmp_path)) == [f"t{i:06d}" for i in range(60)]


def test_retention_deletes_only_shipped_closed_old_segments(tmp_path: Path) -> None:
    box = segmented_outbox(tmp_path, OutboxLimits(segment_bytes=2000))
    for i in range(40):
        box.write([exposure(i)])
    api = Api()
    fwd = Forwarder(tmp_path, post=api)
    fwd.step()
    open_segment = box.segment_name
    assert prune(fwd, retention_s=3600) == []  # shipped, but younger than the retention
    removed = prune(fwd, retention_s=0, now=time.time() + 1)
    assert removed and open_segment not in removed  # the writer's open segment stays, shipped or not
    assert {p.name for p in tmp_path.glob("*.jsonl")} == {open_segment}
    box.write([exposure(99)])  # not shipped yet: never deleted
    assert prune(fwd, retention_s=0, now=time.time() + 1) == []
    fwd.step()
    assert sorted(e["trace_id"] for e in api.events) == sorted([f"t{i:06d}" for i in range(40)] + ["t000099"])
    assert len({e["event_id"] for e in api.events}) == 41
    box.close()
    assert prune(fwd, retention_s=0, now=time.time() + 1) == [open_segment]  # closed now: its lock is gone


def test_a_group_ships_every_worker_directory_once(tmp_path: Path) -> None:
    boxes = [segmented_outbox(tmp_path / f"worker-{i}", OutboxLimits()) for i in range(2)]
    for i in range(10):
        boxes[i % 2].write([exposure(i)])
    api = Api()
    group = ForwarderGroup(tmp_path, post=api)
    group.step()
    group.step()
    assert sorted(e["trace_id"] for e in api.events) == [f"t{i:06d}" for i in range(10)] and group.behind() == 0
    with pytest.raises(RuntimeError, match="already forwarded"):
        ForwarderGroup(tmp_path, post=api)  # a second forwarder would post every line twice
    group.close()
    ForwarderGroup(tmp_path, post=api).close()  # once the first is gone, another may take over
    for b in boxes:
        b.close()


def test_a_failed_write_is_counted_and_refuses_requests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = segmented_outbox(tmp_path, OutboxLimits())
    import ablab.platform.gateway.emit as emit

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(emit.os, "write", no_space)
    box.write([exposure(1), exposure(2)])
    assert box.refused == 2 and box.written == 0
    assert "No space left" in (box._full_reason or "")
    box.close()


def test_a_full_outbox_answers_503_before_the_backend_and_counts_it(backend: ScriptedBackend, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("ABLAB_GATEWAY_OUTBOX_MAX_BYTES", "1")  # the first request's events fill it
    with gateway_for(backend.url, tmp_path) as gw:
        body = {"model": "ok", "messages": MSGS, "user": "u1"}
        first = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=10)
        assert first.status_code == 200
        deadline = time.monotonic() + 10
        while True:  # the cap is checked at most every 0.5 s
            marker = uuid.uuid4().hex
            r = httpx.post(gw.url + "/v1/chat/completions", json={**body, "user": marker}, timeout=10)
            if r.status_code != 200 or time.monotonic() > deadline:
                break
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert "cap" in r.json()["error"]["message"] and r.headers["retry-after"]
        assert all(b.get("user") != marker for _, b in backend.requests)  # refused before the backend
        assert marker not in json.dumps(gw.events())
        assert metric(gw, "ablab_gateway_requests_total", outcome="outbox_full") >= 1
        assert any("is full" in rec.message for rec in caplog.records)
