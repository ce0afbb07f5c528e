"""Append-only disk spool for records the broker could not take (yet).

Layout: ``<dir>/seg-<12 digits>.jsonl``, one JSON object per line
``{"topic": …, "key": …, "value": …}`` (key and value as text; values are JSON already).
Segments are written in order and read back in order; a segment is deleted only after
every record in it was acknowledged by the broker (the emitter decides), so a crash at
any point loses nothing already appended.

Durability: every append is flushed to the OS before it returns (a killed process loses
nothing); ``fsync`` adds power-loss safety: ``always`` (each append), ``interval`` (at
most once per ``fsync_interval_s``) or ``never``. A line torn by a crash mid-write (the
only thing a kill can leave behind) is skipped and counted as ``corrupt_lines``.

One process owns a spool directory at a time (``flock`` on ``<dir>/.lock``).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal

FsyncPolicy = Literal["always", "interval", "never"]
_PREFIX, _SUFFIX = "seg-", ".jsonl"


class SpoolLockedError(RuntimeError):
    pass


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    topic: str
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = field(default_factory=_now_ms)
    """When the record was made (the edge received its event): its Kafka record timestamp,
    kept through the spool, so a replay after an outage still says when the event arrived.
    The stream job bounds an event time by it (a clock running ahead cannot make the events
    after it late). None (a line spooled before this field existed): the producer's clock."""

    def to_line(self) -> bytes:
        key = None if self.key is None else self.key.decode("utf-8", errors="surrogateescape")
        payload = {"topic": self.topic, "key": key, "value": self.value.decode("utf-8", errors="surrogateescape")}
        if self.timestamp_ms is not None:
            payload["ts"] = self.timestamp_ms
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", errors="surrogateescape") + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> SpoolRecord:
        data = json.loads(line.decode("utf-8", errors="surrogateescape"))
        key = data["key"]
        return cls(
            topic=data["topic"],
            key=None if key is None else key.encode("utf-8", errors="surrogateescape"),
            value=data["value"].encode("utf-8", errors="surrogateescape"),
            timestamp_ms=data.get("ts"),
        )


class Spool:
    """Thread-safe: the emitter's worker and the producer's callback thread both append."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: FsyncPolicy = "always",
        fsync_interval_s: float = 1.0,
        segment_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be always|interval|never, got {fsync!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fsync, self._fsync_interval_s, self._segment_bytes = fsync, fsync_interval_s, segment_bytes
        self._lock = threading.Lock()
        self._lockfile = open(self.directory / ".lock", "w")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockfile.close()
            raise SpoolLockedError(f"spool {self.directory} is in use by another process; "
                                   "give each emitter process its own spool name") from None
        self._active: IO[bytes] | None = None
        self._active_path: Path | None = None
        self._active_bytes = 0
        self._last_fsync = time.monotonic()
        existing = self._segment_paths()
        self._next_seq = (int(existing[-1].name[len(_PREFIX):-len(_SUFFIX)]) + 1) if existing else 1
        self.corrupt_lines = 0
        self._pending = sum(self._count_lines(path) for path in existing)

    # -- writing -------------------------------------------------------------------------

    def append_many(self, records: list[SpoolRecord]) -> None:
        if not records:
            return
        data = b"".join(record.to_line() for record in records)
        with self._lock:
            if self._active is None or self._active_bytes >= self._segment_bytes:
                self._open_new_segment()
            assert self._active is not None
            self._active.write(data)
            self._active.flush()  # in the OS now: a killed process loses nothing
            self._active_bytes += len(data)
            self._pending += len(records)
            self._maybe_fsync()

    def append(self, record: SpoolRecord) -> None:
        self.append_many([record])

    def seal(self) -> None:
        """Close the active segment so the next read sees it whole and appends go to a new one."""
        with self._lock:
            self._close_active()

    # -- reading -------------------------------------------------------------------------

    def sealed_segments(self) -> list[Path]:
        with self._lock:
            return [p for p in self._segment_paths() if p != self._active_path]

    def read_segment(self, path: Path) -> list[SpoolRecord]:
        records = []
        with open(path, "rb") as handle:
            for line in handle:
                try:
                    records.append(SpoolRecord.from_line(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    self.corrupt_lines += 1  # a line torn by a crash mid-write
        return records

    def delete_segment(self, path: Path, *, records: int) -> None:
        with self._lock:
            path.unlink(missing_ok=True)
            self._pending = max(0, self._pending - records)

    @property
    def pending(self) -> int:
        """Records on disk not yet acknowledged by the broker."""
        return self._pending

    def empty(self) -> bool:
        return self._pending == 0

    def close(self) -> None:
        with self._lock:
            self._close_active()
        fcntl.flock(self._lockfile, fcntl.LOCK_UN)
        self._lockfile.close()

    # -- internals -----------------------------------------------------------------------

    def _segment_paths(self) -> list[Path]:
        return sorted(self.directory.glob(f"{_PREFIX}*{_SUFFIX}"))

    def _open_new_segment(self) -> None:
        self._close_active()
        path = self.directory / f"{_PREFIX}{self._next_seq:012d}{_SUFFIX}"
        self._next_seq += 1
        self._active = open(path, "ab")
        self._active_path, self._active_bytes = path, 0
        _fsync_dir(self.directory)  # the new name survives a power loss too

    def _close_active(self) -> None:
        if self._active is not None:
            self._active.flush()
            if self._fsync != "never":
                os.fsync(self._active.fileno())
            self._active.close()
            if self._active_bytes == 0 and self._active_path is not None:
                self._active_path.unlink(missing_ok=True)
        self._active, self._active_path, self._active_bytes = None, None, 0

    def _maybe_fsync(self) -> None:
        if self._fsync == "never" or self._active is None:
            return
        now = time.monotonic()
        if self._fsync == "always" or now - self._last_fsync >= self._fsync_interval_s:
            os.fsync(self._active.fileno())
            self._last_fsync = now

    def _count_lines(self, path: Path) -> int:
        with open(path, "rb") as handle:
            return sum(1 for line in handle if line.endswith(b"\n"))


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
