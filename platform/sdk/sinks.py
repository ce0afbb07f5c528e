"""Where the SDK sends exposure events. Kafka comes from ``ablab.streaming``."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Protocol

import httpx

log = logging.getLogger(__name__)


class ExposureSink(Protocol):
    def emit(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullSink:
    def emit(self, event: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class ListSink:
    """Keeps events in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def close(self) -> None:
        pass


class HttpEventSink:
    """Batches events to ``POST /v1/events`` from a background thread.

    ``emit`` only enqueues, so it never blocks the caller; a failed batch is retried with
    backoff, and events stay queued (bounded) while the API is unreachable. Each event gets
    its ``event_id`` here, at emit time (unless it has one), by the same rule as the API
    (:func:`ablab.platform.events.derive_event_id`: an inference event's id comes from its
    trace_id, any other's from its content), so a batch re-posted after a lost response, or
    an event emitted twice, carries the same id and the pipeline counts it once.

    Events live in memory until the API accepts them: a SIGKILLed process loses what is
    queued (at most ``flush_interval_s`` of events while the API is up). Where that matters,
    write events to files and ship them with ``ablab outbox`` (what ``ablab up --demo`` does).
    """

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        batch_size: int = 500,
        flush_interval_s: float = 0.5,
        max_queue: int = 1_000_000,
        client: httpx.Client | None = None,
    ) -> None:
        self._url = api_url.rstrip("/") + "/v1/events"
        self._client = client or httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=max_queue)
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._stop = threading.Event()
        self.sent = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="ablab-http-sink", daemon=True)
        self._thread.start()

    def emit(self, event: dict[str, Any]) -> None:
        if event.get("event_id") is None:
            from ablab.platform.events import derive_event_id

            event = {**event, "event_id": derive_event_id(event)}
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1  # counted, never silent; a bounded queue protects the host process

    def _drain(self, limit: int) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        while len(batch) < limit:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _post(self, batch: list[dict[str, Any]]) -> None:
        delay = 0.2
        while True:
            try:
                response = self._client.post(self._url, json={"events": batch})
                if response.status_code < 500:
                    if response.status_code >= 400:
                        log.warning("events rejected by the API (%s): %s", response.status_code, response.text[:500])
                    self.sent += len(batch)
                    return
            except httpx.HTTPError as exc:
                log.warning("event batch failed (%s); retrying", type(exc).__name__)
            if self._stop.is_set() and delay > 5:
                return
            self._stop.wait(delay)
            delay = min(delay * 2, 10.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(self._flush_interval_s)
            while batch := self._drain(self._batch_size):
                self._post(batch)

    def flush(self) -> None:
        while batch := self._drain(self._batch_size):
            self._post(batch)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush()
        self._client.close()
