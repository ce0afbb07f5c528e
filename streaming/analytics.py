"""The API's handle on the analytics store, and (in embedded mode) the loader it runs.

chdb locks its data directory, so in embedded mode the API process owns the store and
runs the Kafka → ClickHouse loader in a thread; every other process goes through the
API. One client is shared by the loader and the request threads, behind a lock, since
the embedded engine's client is not documented as thread-safe.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ablab.platform.config import Settings

log = logging.getLogger(__name__)


class SerializedClient:
    """A clickhouse-connect client whose calls run one at a time."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked


class AnalyticsStore:
    def __init__(self, settings: Settings, *, run_loader: bool, known_experiments: Any = None) -> None:
        from ablab.streaming.store import apply_ddl, get_clickhouse_client

        self.settings = settings
        self.embedded = settings.resolved_clickhouse_url.startswith("chdb")
        self.client = SerializedClient(get_clickhouse_client(settings))
        apply_ddl(self.client)
        self.loader: Any = None
        self._loader_thread: threading.Thread | None = None
        self._loader_stop: threading.Event | None = None
        if run_loader:
            from ablab.streaming.loader.service import Loader

            self.loader = Loader(
                self.client, settings.kafka_bootstrap, known_experiments=known_experiments, known_experiments_refresh_s=0.0
            )
            self._loader_stop = threading.Event()
            self._loader_thread = threading.Thread(target=self._supervise, name="ablab-loader", daemon=True)
            self._loader_thread.start()
            log.info("loader running in-process (Kafka %s → %s)", settings.kafka_bootstrap, "chdb" if self.embedded else "ClickHouse")

    def _supervise(self) -> None:
        """Keep the loader running: the broker may start after the API, or restart."""
        assert self._loader_stop is not None
        delay = 1.0
        while not self._loader_stop.is_set():
            try:
                self.loader.run(self._loader_stop)
                delay = 1.0
            except Exception as exc:  # noqa: BLE001 - retried; the loader commits offsets only after inserts
                log.warning("loader stopped (%s: %s); retrying in %.0f s", type(exc).__name__, exc, delay)
                self._loader_stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def ping(self) -> str:
        self.client.query("SELECT 1")
        return "ok (embedded chdb)" if self.embedded else "ok"

    def close(self) -> None:
        if self._loader_stop is not None:
            self._loader_stop.set()
        if self._loader_thread is not None:
            self._loader_thread.join(timeout=30)
        close = getattr(self.client, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing is best effort at shutdown
                log.debug("closing the ClickHouse client failed", exc_info=True)
