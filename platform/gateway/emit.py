"""Durable event delivery: the project's outbox (one JSON line per event, flushed to the OS
before the request is answered) and its forwarder (``ablab.platform.gateway.outbox``), which
posts batches to ``POST /v1/events`` with the gateway's sdk-scoped token and saves its read
position only after a 202. A gateway killed at any point after answering loses nothing: the
next start ships what the last one wrote, with the same event ids.

Events are validated against ``ablab.platform.events`` before they are written, so a bad
record is counted here (``refused``) rather than found later in a dead-letter topic (the
gateway's own events first through :func:`~.event_check.fast_accepts`, which only says yes
where the models would).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)
_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def event_unit_id(unit: str) -> str:
    """Events carry identifiers (no spaces, ≤128 chars); any other unit id is hashed, the same
    way every time, so one unit's events still group together."""
    return unit if _ID.match(unit) else "h:" + hashlib.sha256(unit.encode()).hexdigest()[:40]


def schema_has_measures() -> bool:
    from ablab.platform.events import InferenceEvent

    return "measures" in InferenceEvent.model_fields


class Outbox:
    """Append-only JSONL file of this gateway's events; one process owns a directory."""

    def __init__(self, directory: Path) -> None:
        from ablab.platform.events import Rejection, validate_event
        from ablab.platform.gateway.event_check import fast_accepts

        self._validate, self._rejection, self._fast = validate_event, Rejection, fast_accepts
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lockfile = open(self.directory / ".gateway.lock", "w")
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockfile.close()
            raise RuntimeError(
                f"outbox {self.directory} belongs to another running gateway; give this one its own --outbox DIR"
            ) from None
        name = f"gateway-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl"
        self._file = open(self.directory / name, "ab", buffering=0)
        self._lock = threading.Lock()
        self.written = 0
        self.refused = 0

    def write(self, events: list[dict[str, Any]]) -> None:
        lines = []
        for event in events:
            event.setdefault("event_id", uuid.uuid4().hex)
            if self._fast(event):  # the gateway's own events: the same verdict, cheaper (event_check.py)
                lines.append(orjson.dumps(event) + b"\n")
                continue
            checked = self._validate(event)
            if isinstance(checked, self._rejection):
                self.refused += 1
                log.warning("gateway event refused (%s: %s)", checked.field, checked.message)
                continue
            lines.append(orjson.dumps(event) + b"\n")
        if lines:
            data = b"".join(lines)
            with self._lock:
                os.write(self._file.fileno(), data)  # in the OS before the caller is answered
                self.written += len(lines)

    def close(self) -> None:
        self._file.close()
        self._lockfile.close()


class Shipper:
    """Runs the outbox forwarder in a thread until :meth:`close`."""

    def __init__(self, directory: Path, *, api_url: str, token: str) -> None:
        from ablab.platform.gateway.outbox import Forwarder, http_poster

        self.forwarder = Forwarder(Path(directory), post=http_poster(api_url, token))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ablab-gateway-outbox", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.forwarder.run(stop=self._stop.is_set, poll_s=0.2)

    def close(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(self.forwarder.behind().values()):
            time.sleep(0.1)  # a clean stop ships what is written; a killed one ships next start
        self._stop.set()
        self._thread.join(timeout=timeout_s)
