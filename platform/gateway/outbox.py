"""The demo emitters' outbox: event files in, ``POST /v1/events`` out, each event counted once.

Why: the SDK's HTTP sink keeps events in memory for up to half a second before it posts them,
so a worker killed with SIGKILL loses the events of requests it has already answered; and a
batch re-posted after a lost response gets new event_ids from the API, which no
deduplication can recognise. Under ``ablab up --demo`` the workers, traffic generators and
labelers therefore write their events to ``ABLAB_HOME/outbox/<name>.jsonl``
(``--events-file``: one line per event, flushed to the OS before the request is answered,
so it survives the process), and this forwarder ships them:

- each event gets a deterministic ``event_id`` (a hash of the file name and the line's byte
  offset) unless it has one, so a re-post carries the same ids and the loader and the Flink
  job count it once;
- the read position per file is saved (atomically) only after the API answered 202, so a
  forwarder killed at any point re-posts at most one batch, with the same ids;
- a line torn by a kill mid-write (its writer's next line is glued to it) is split at the
  start of the glued event, which is kept; the torn fragment is counted in ``torn``.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger(__name__)
POSITIONS = ".positions.json"
_NAMESPACE = uuid.UUID("5d0e8a5e-7b1c-4c1e-9a59-0a1ab0b5e7e1")


def event_id_for(file_name: str, offset: int) -> str:
    return uuid.uuid5(_NAMESPACE, f"{file_name}:{offset}").hex


@dataclass
class OutboxStats:
    posted: int = 0
    batches: int = 0
    torn: int = 0
    retries: int = 0
    rejected: int = 0  # refused by the API's validation: dead-lettered there, not lost
    behind_bytes: dict[str, int] = field(default_factory=dict)


def _parse(line: bytes) -> tuple[dict[str, Any] | None, int]:
    """The event on a line and how many bytes of torn fragment preceded it."""
    try:
        return json.loads(line), 0
    except ValueError:
        pass
    start = line.rfind(b'{"v"')  # the writer's events all start with the schema version
    while start > 0:
        try:
            return json.loads(line[start:]), start
        except ValueError:
            start = line.rfind(b'{"v"', 0, start)
    return None, len(line)


class Forwarder:
    def __init__(self, directory: Path, *, post: Callable[[list[dict[str, Any]]], httpx.Response],
                 batch_max: int = 500, batch_max_bytes: int = 512 * 1024) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._post = post
        self.batch_max = batch_max
        self.batch_max_bytes = batch_max_bytes
        self.stats = OutboxStats()
        self.positions: dict[str, int] = self._load_positions()

    def _load_positions(self) -> dict[str, int]:
        path = self.directory / POSITIONS
        try:
            return {k: int(v) for k, v in json.loads(path.read_text()).items()}
        except (OSError, ValueError):
            return {}

    def _save_positions(self) -> None:
        tmp = self.directory / (POSITIONS + ".tmp")
        tmp.write_text(json.dumps(self.positions))
        os.replace(tmp, self.directory / POSITIONS)

    def files(self) -> list[Path]:
        return sorted(self.directory.glob("*.jsonl"))

    def behind(self) -> dict[str, int]:
        """Bytes written but not yet acknowledged, per file."""
        return {p.name: max(0, p.stat().st_size - self.positions.get(p.name, 0)) for p in self.files()}

    def step(self) -> int:
        """Ship one batch from every file that has complete lines; return the events posted."""
        shipped = 0
        for path in self.files():
            shipped += self._ship(path)
        return shipped

    def _ship(self, path: Path) -> int:
        start = self.positions.get(path.name, 0)
        with path.open("rb") as handle:
            handle.seek(start)
            data = handle.read(self.batch_max_bytes)
        events: list[dict[str, Any]] = []
        offset = start
        torn = 0
        for line in data.splitlines(keepends=True):
            if not line.endswith(b"\n") or len(events) >= self.batch_max:
                break  # a line still being written, or a full batch: next time
            event, skipped = _parse(line.rstrip(b"\n"))
            torn += 1 if skipped and event is not None else 0
            if event is not None:
                event.setdefault("event_id", event_id_for(path.name, offset + skipped))
                events.append(event)
            elif line.strip():
                torn += 1
            offset += len(line)
        if offset == start:
            return 0
        if events:
            response = self._post(events)
            if response.status_code != 202:
                self.stats.retries += 1
                raise RuntimeError(f"POST /v1/events answered {response.status_code}: {response.text[:300]}")
            self.stats.rejected += int(response.json().get("rejected", 0))
        self.positions[path.name] = offset
        self._save_positions()
        self.stats.posted += len(events)
        self.stats.batches += 1
        self.stats.torn += torn
        return len(events)

    def run(self, *, stop: Callable[[], bool] = lambda: False, poll_s: float = 0.2) -> None:
        delay = poll_s
        while not stop():
            try:
                shipped = self.step()
                delay = poll_s
            except (httpx.HTTPError, RuntimeError) as exc:  # the API is restarting: keep the position, retry
                log.warning("outbox: %s; retrying in %.1f s", exc, delay)
                shipped = 0
                delay = min(max(delay * 2, 0.5), 5.0)
            if not shipped:
                time.sleep(delay)


def http_poster(api_url: str, token: str, *, timeout_s: float = 10.0) -> Callable[[list[dict[str, Any]]], httpx.Response]:
    client = httpx.Client(base_url=api_url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def post(events: list[dict[str, Any]]) -> httpx.Response:
        return client.post("/v1/events", json={"events": events})

    return post
