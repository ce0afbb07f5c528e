"""Run the real loader in a thread of the test process, as the API does in embedded mode."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablab.streaming.loader.service import Loader


class LoaderThread:
    """``loader.run`` in a daemon thread until :meth:`stop` (or, with ``idle_exit_s``, until
    it has seen no record for that long); what it raised is kept in :attr:`failure`.
    ``supervised`` runs ``loader.supervise`` instead, as ``ablab loader`` does: a failed
    consume loop (a commit refused by a rebalance, a broker away) reconnects."""

    def __init__(self, loader: Loader, *, idle_exit_s: float | None = None, supervised: bool = False) -> None:
        if supervised and idle_exit_s is not None:
            raise ValueError("a supervised loader runs until stopped; idle_exit_s does not apply")
        self.loader = loader
        self._supervised = supervised
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._idle_exit_s = idle_exit_s
        self._thread = threading.Thread(target=self._target, name="test-loader", daemon=True)

    def _target(self) -> None:
        try:
            if self._supervised:
                self.loader.supervise(self._stop)
            else:
                self.loader.run(self._stop, idle_exit_s=self._idle_exit_s)
        except BaseException as exc:
            self.failure = exc

    def start(self) -> LoaderThread:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> BaseException | None:
        """Wait for the loader to end by itself (``idle_exit_s``) and return what it raised."""
        self._thread.join(timeout=timeout)
        assert not self._thread.is_alive(), f"the loader was still running after {timeout:.0f}s"
        return self.failure

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout)

    def __enter__(self) -> LoaderThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stop_all(threads: list[LoaderThread], *, timeout: float = 60.0) -> None:
    """Stop loaders of one group together: one leaving alone would hand its partitions to the
    others in a rebalance nobody waits for."""
    for thread in threads:
        thread.request_stop()
    for thread in threads:
        thread.stop(timeout)


def run_until_idle(loader: Loader, *, idle_exit_s: float = 8.0, timeout_s: float = 150.0) -> BaseException | None:
    """Run ``loader`` until it has seen no record for ``idle_exit_s``; returns what it raised
    (a simulated crash) or None."""
    return LoaderThread(loader, idle_exit_s=idle_exit_s).start().join(timeout_s)
