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

import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from io import FileIO
from pathlib import Path
from typing import Any

import httpx

from ablab.platform.gateway.emit import Outbox

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


# --- the gateway's outbox: segments, a disk bound, retention; one forwarder for many workers ----

SEGMENT_BYTES_ENV = "ABLAB_GATEWAY_OUTBOX_SEGMENT_BYTES"
MAX_BYTES_ENV = "ABLAB_GATEWAY_OUTBOX_MAX_BYTES"
MIN_FREE_BYTES_ENV = "ABLAB_GATEWAY_OUTBOX_MIN_FREE_BYTES"
RETENTION_ENV = "ABLAB_GATEWAY_OUTBOX_RETENTION_S"


@dataclass(frozen=True)
class OutboxLimits:
    """How much disk a gateway's outbox may hold, and how long shipped segments stay.

    - ``segment_bytes`` (64 MiB): a writer starts a new file past this size;
    - ``max_bytes`` (1 GiB per writer directory): every ``*.jsonl`` there, shipped or not; at the
      cap the gateway answers 503 (counted, logged) instead of taking requests whose events it
      could not keep;
    - ``min_free_bytes`` (256 MiB): the same refusal when the file system has less free space;
    - ``retention_s`` (24 h): a segment the forwarder has shipped whole, and that no writer holds,
      is deleted this long after its last write (so a day of events can be re-read on disk).
    """

    segment_bytes: int = 64 * 1024 * 1024
    max_bytes: int = 1024 * 1024 * 1024
    min_free_bytes: int = 256 * 1024 * 1024
    retention_s: float = 24 * 3600.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OutboxLimits:
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        for name, key, kind in ((SEGMENT_BYTES_ENV, "segment_bytes", int), (MAX_BYTES_ENV, "max_bytes", int),
                                (MIN_FREE_BYTES_ENV, "min_free_bytes", int), (RETENTION_ENV, "retention_s", float)):
            if (raw := env.get(name)) is not None:
                try:
                    value = kind(raw)
                except ValueError:
                    value = -1
                if value < 0:
                    raise ValueError(f"{name}: a non-negative number, got {raw!r}")
                values[key] = value
        return cls(**values)


class OutboxFull(RuntimeError):
    """The outbox is at its cap or the disk is nearly full: requests are refused (503)."""


def _unlocked(path: Path) -> bool:
    """No writer holds this segment (a writer keeps a shared lock on its open segment)."""
    try:
        with path.open("rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
            return True
    except OSError:
        return False


class SegmentedOutbox(Outbox):
    """The gateway's outbox writer (:class:`~.emit.Outbox`, one per directory) with segments and
    a disk bound: :meth:`full` says when requests must be refused."""

    def __init__(self, directory: Path, limits: OutboxLimits | None = None) -> None:
        super().__init__(directory)
        self.limits = limits or OutboxLimits.from_env()
        self._seq = 0
        self._checked_at = 0.0
        self._full_reason: str | None = None
        self.full_refusals = 0
        self._segment: FileIO = self._file
        fcntl.flock(self._segment, fcntl.LOCK_SH)  # held while open: the forwarder never deletes it
        self._size = os.fstat(self._segment.fileno()).st_size

    def write(self, events: list[dict[str, Any]]) -> None:
        before = self.written
        try:
            super().write(events)
        except OSError as exc:  # ENOSPC, EDQUOT, EIO: the events are lost here, so say so loudly
            lost = len(events) - (self.written - before)
            self.refused += lost
            self._full_reason = f"writing failed ({exc.strerror or exc})"
            log.error("gateway outbox %s: %d event(s) could not be written: %s; refusing requests until it "
                      "has room", self.directory, lost, exc)
            return
        self._size = os.fstat(self._segment.fileno()).st_size
        if self._size >= self.limits.segment_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._seq += 1
        name = f"gateway-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{self._seq}.jsonl"
        new: FileIO = open(self.directory / name, "ab", buffering=0)
        fcntl.flock(new, fcntl.LOCK_SH)
        with self._lock:
            old, self._file = self._segment, new
            self._segment = new
        old.close()  # its lock goes with it: the forwarder may delete it once shipped and retained
        self._size = 0

    @property
    def segment_name(self) -> str:
        return Path(self._segment.name).name

    def full(self) -> str | None:
        """Why requests must be refused now (None: there is room); checked at most every 0.5 s."""
        now = time.monotonic()
        if now - self._checked_at < 0.5:
            return self._full_reason
        self._checked_at = now
        total = 0
        for p in self.directory.glob("*.jsonl"):
            try:
                total += p.stat().st_size
            except FileNotFoundError:  # pruned by the forwarder meanwhile
                pass
        stat = os.statvfs(self.directory)
        free = stat.f_bavail * stat.f_frsize
        reason = None
        if total >= self.limits.max_bytes:
            reason = f"the outbox holds {total} bytes, its cap is {self.limits.max_bytes} ({MAX_BYTES_ENV})"
        elif free < self.limits.min_free_bytes:
            reason = f"{free} bytes free on its disk, under {self.limits.min_free_bytes} ({MIN_FREE_BYTES_ENV})"
        if reason is not None and self._full_reason is None:
            log.error("gateway outbox %s is full: %s; answering 503 until the forwarder ships and retention "
                      "frees room", self.directory, reason)
        elif reason is None and self._full_reason is not None:
            log.warning("gateway outbox %s has room again", self.directory)
        self._full_reason = reason
        return reason


def segmented_outbox(directory: Path, limits: OutboxLimits | None = None) -> SegmentedOutbox:
    return SegmentedOutbox(Path(directory), limits)


def prune(forwarder: Forwarder, *, retention_s: float, now: float | None = None) -> list[str]:
    """Delete segments shipped whole, held by no writer, and last written ``retention_s`` ago."""
    now = time.time() if now is None else now
    removed = []
    for path in forwarder.files():
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if forwarder.positions.get(path.name, -1) < st.st_size or now - st.st_mtime < retention_s or not _unlocked(path):
            continue
        path.unlink(missing_ok=True)
        forwarder.positions.pop(path.name, None)
        removed.append(path.name)
    if removed:
        forwarder._save_positions()
    return removed


class ForwarderGroup:
    """One forwarder over a gateway's outbox directory and each worker's directory in it
    (``worker-<i>``: ``ablab gateway --workers N``), with retention of shipped segments."""

    def __init__(self, base: Path, *, post: Callable[[list[dict[str, Any]]], httpx.Response],
                 retention_s: float | None = None) -> None:
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        # One forwarder per outbox: two would both post every line (the same ids, but twice).
        self._lockfile = open(self.base / ".forwarder.lock", "w")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockfile.close()
            raise RuntimeError(f"outbox {self.base} is already forwarded by another running gateway; give this one "
                               "its own --outbox DIR") from None
        self._post = post
        self.retention_s = retention_s
        self.forwarders: dict[Path, Forwarder] = {}
        self._pruned_at = 0.0

    def _scan(self) -> list[Forwarder]:
        for d in [self.base, *sorted(p for p in self.base.glob("worker-*") if p.is_dir())]:
            if d not in self.forwarders:
                self.forwarders[d] = Forwarder(d, post=self._post)
        return list(self.forwarders.values())

    def step(self) -> int:
        shipped = sum(f.step() for f in self._scan())
        if self.retention_s is not None and time.monotonic() - self._pruned_at > 10.0:
            self._pruned_at = time.monotonic()
            for f in self.forwarders.values():
                prune(f, retention_s=self.retention_s)
        return shipped

    def behind(self) -> int:
        return sum(sum(f.behind().values()) for f in self._scan())

    def close(self) -> None:
        self._lockfile.close()

    def run(self, *, stop: Callable[[], bool] = lambda: False, poll_s: float = 0.2) -> None:
        delay = poll_s
        while not stop():
            try:
                shipped = self.step()
                delay = poll_s
            except (httpx.HTTPError, RuntimeError) as exc:
                log.warning("gateway outbox: %s; retrying in %.1f s", exc, delay)
                shipped = 0
                delay = min(max(delay * 2, 0.5), 5.0)
            if not shipped:
                time.sleep(delay)


class GroupShipper:
    """Runs a :class:`ForwarderGroup` in a thread until :meth:`close` (what ``emit.Shipper`` is
    for one directory)."""

    def __init__(self, directory: Path, *, api_url: str, token: str, retention_s: float | None = None) -> None:
        if retention_s is None:
            retention_s = OutboxLimits.from_env().retention_s
        self.group = ForwarderGroup(Path(directory), post=http_poster(api_url, token), retention_s=retention_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.group.run, kwargs={"stop": self._stop.is_set}, name="ablab-gateway-outbox",
                                        daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.group.behind():
            time.sleep(0.1)  # a clean stop ships what is written; a killed one ships next start
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        self.group.close()


def outbox_refusal(state: Any, *, operation: str, trace_id: str) -> Any:
    """The 503 a gateway answers while its outbox is full (None while it has room): a request
    is refused before it reaches a backend, never answered with its events dropped. Counted in
    ``ablab_gateway_requests_total{outcome="outbox_full"}`` and logged when the state changes."""
    full = getattr(state.outbox, "full", None)
    reason = full() if full is not None else None
    if reason is None:
        return None
    from starlette.responses import Response

    from ablab.platform.gateway import protocol

    state.metrics.requests.labels(operation, state.settings.default_backend, "outbox_full").inc()
    state.outbox.full_refusals += 1
    body = protocol.error_body(f"the gateway cannot record this request's events: {reason}", kind="server_error")
    return Response(body, status_code=503, media_type="application/json",
                    headers={"x-ablab-trace-id": trace_id, "retry-after": "5"})
