"""Guardrail automation: a breached guardrail pauses its variant and says why in the audit log.

A shipped experiment (:func:`ablab.platform.registry.ship.ship_window`) is left alone: its
comparison ended at the ship, which its decision already weighed (a forced ship is audited
as forced), and after it every unit gets the shipped variant, so there is no control to hold
a guardrail against; pausing the shipped variant would take all of its traffic away. Watching
the shipped variant in production is the service's monitoring's job (the gateway's metrics).

The same loop runs the opt-in SLA-constrained Thompson allocator (:mod:`.allocation`)
every ``allocator_interval_s``, after the guardrail pass, so no extra process is needed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.analytics import service
from ablab.platform.analytics.allocation import reweight
from ablab.platform.config import Settings, get_settings
from ablab.platform.registry import service as registry
from ablab.platform.registry.db import transaction
from ablab.platform.registry.schemas import Status
from ablab.platform.stats.decisions import guardrail_breaches

if TYPE_CHECKING:
    from ablab.platform.analytics.store_port import AnalyticsReads

log = logging.getLogger(__name__)
ACTOR = "guardrail-monitor"


def enforce_guardrails(
    sessions: sessionmaker[Session], store: AnalyticsReads, settings: Settings | None = None, *, sync_rollup: service.RollupSync | None = None
) -> list[dict[str, str]]:
    """One pass over running experiments (rollup maintenance through ``sync_rollup``, then
    guardrails); returns the pauses made."""
    paused: list[dict[str, str]] = []
    with transaction(sessions) as session:
        running, _ = registry.list_experiments(session, status=Status.running, limit=500)
        reads = [registry.to_read(e) for e in running]
        shipped = {exp.key for exp in reads if exp.guardrails and service.ship_of(session, exp) is not None}
    for exp in reads:
        try:  # the maintenance step that keeps results reads free of writes
            if sync_rollup is not None:
                service.sync_rollup(sync_rollup, exp, settings=settings)
        except Exception:
            log.exception("rollup maintenance of %s failed", exp.key)
        if not exp.guardrails:
            continue
        if exp.key in shipped:
            _skip_shipped(exp.key, exp.phase)
            continue
        try:
            result = service.results(store, exp, settings=settings)
        except Exception:
            log.exception("guardrail check of %s failed", exp.key)
            continue
        live = {v.key for v in exp.variants if not v.paused}
        for breach in guardrail_breaches(result):
            if breach["variant"] not in live:
                continue
            with transaction(sessions) as session:
                registry.pause_variant(
                    session, key=exp.key, variant=breach["variant"], reason=f"guardrail {breach['metric']}: {breach['reason']}", actor=ACTOR
                )
            paused.append({"experiment": exp.key, **breach})
            log.warning("paused %s/%s: %s", exp.key, breach["variant"], breach["reason"])
    return paused


_told: set[tuple[str, int]] = set()


def _skip_shipped(key: str, phase: int) -> None:
    if (key, phase) not in _told:  # once per ship, not every pass
        _told.add((key, phase))
        log.info("guardrails of %s are not enforced: it was shipped (phase %d), its comparison is closed", key, phase)


class GuardrailMonitor:
    def __init__(
        self, sessions: sessionmaker[Session], store: AnalyticsReads, *, interval_s: float, settings: Settings | None = None,
        sync_rollup: service.RollupSync | None = None,
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._sync_rollup = sync_rollup
        self._interval_s = interval_s
        self._settings = settings or get_settings()
        self._allocated_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ablab-guardrails", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                enforce_guardrails(self._sessions, self._store, self._settings, sync_rollup=self._sync_rollup)
            except Exception:
                log.exception("guardrail pass failed")
            self.allocate_if_due()

    def allocate_if_due(self, now: float | None = None) -> list[dict[str, Any]]:
        """The allocator pass, when ``allocator_interval_s`` has passed since the last one."""
        now = time.monotonic() if now is None else now
        if not self._settings.allocator_experiments:
            return []
        if self._allocated_at is not None and now - self._allocated_at < self._settings.allocator_interval_s:
            return []
        self._allocated_at = now
        try:
            return reweight(self._sessions, self._store, self._settings)
        except Exception:
            log.exception("allocator pass failed")
            return []

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
