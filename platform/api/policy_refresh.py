"""The policy model refresher (issue #33, docs/policies.md "Model refresh"): a component of the
API process that refits every running experiment's ``slo_router`` variants from their logged
events, in the background, and publishes new versions through the SDK config.

Per pass (``ABLAB_POLICY_REFIT_FIRST_S`` after start, default 10, then every
``ABLAB_POLICY_REFIT_S`` seconds, default 300; 0 turns it off): for each running
experiment with a router variant, one read of the analytics port (``logged_events``), then
:func:`ablab.platform.policy.refit.fit_variant` per router. The pass's new versions are
written to the config DB's ``policy_models`` (``registry.sdk_config.publish_model``) in one
transaction with the registry revision's bump, so the SDK config's ETag moves exactly when a
served model does, and every API process (a restarted one too) serves the same models.
``NotEnoughData`` or any failure keeps the previous model (or none: the policy explores
uniformly) and is counted in ``ablab_policy_refits_total{outcome}``. A request never waits on
any of this.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.api.ports import AnalyticsBackend, Probe
from ablab.platform.registry.db import transaction

if TYPE_CHECKING:
    from ablab.platform.policy.model import PolicyModel

log = logging.getLogger(__name__)
OUTCOMES = ("published", "unchanged", "not_enough_data", "failed")


def refit_interval_s() -> float:
    return float(os.environ.get("ABLAB_POLICY_REFIT_S", "300"))


def first_refit_s() -> float:
    """The first pass soon after start, so a router's first model does not wait a whole
    interval; the served models themselves are in the config DB and survive a restart."""
    return float(os.environ.get("ABLAB_POLICY_REFIT_FIRST_S", "10"))


class PolicyRefresher:
    """Background refits; :meth:`refit_once` is one pass (tests call it directly)."""

    def __init__(self, sessions: sessionmaker[Session], store: AnalyticsBackend, *, interval_s: float,
                 start: bool = True, on_publish: Callable[[], None] | None = None, first_s: float | None = None) -> None:
        self._sessions = sessions
        self._on_publish = on_publish
        self._store = store
        self._interval_s = interval_s
        self._first_s = interval_s if first_s is None else min(first_s, interval_s)
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.last_pass: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if start and interval_s > 0:
            self._thread = threading.Thread(target=self._run, name="ablab-policy-refit", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        wait = self._first_s
        while not self._stop.wait(wait):
            wait = self._interval_s
            try:
                self.refit_once()
            except Exception:
                log.exception("policy refit pass failed; every model stays as it was")
                self.outcomes["failed"] += 1

    def refit_once(self) -> dict[str, str]:
        """One pass: ``{"<experiment>/<variant>": outcome}``."""
        from ablab.platform.analytics import service as analytics
        from ablab.platform.policy.logs import experiment_policies
        from ablab.platform.policy.model import NotEnoughData
        from ablab.platform.policy.refit import fit_variant
        from ablab.platform.policy.spec import SloRouter
        from ablab.platform.registry import service as registry
        from ablab.platform.registry.schemas import Status

        with transaction(self._sessions) as session:
            running, _ = registry.list_experiments(session, status=Status.running, limit=500)
            reads = [(registry.to_read(e), e.id) for e in running]
        done: dict[str, str] = {}
        fitted: list[tuple[str, int, str, PolicyModel]] = []  # (where, experiment id, variant, model)
        for exp, exp_id in reads:
            if not any(isinstance((v.strategy or {}).get("policy"), Mapping) for v in exp.variants):
                continue
            try:
                spec = analytics.stats_spec(exp)
                routers = {k: p for k, p in experiment_policies(spec).items() if isinstance(p, SloRouter)}
                table = self._store.logged_events(exp.key) if routers else None
            except Exception:
                log.exception("policy refit: experiment %s cannot be read; its models stay", exp.key)
                for v in exp.variants:
                    done[f"{exp.key}/{v.key}"] = self._count("failed")
                continue
            custom = {m.name: m for m in spec.custom}
            for variant, policy in routers.items():
                where = f"{exp.key}/{variant}"
                try:
                    fitted.append((where, exp_id, variant, fit_variant(table, spec, variant, policy, custom=custom)))
                except NotEnoughData as exc:
                    log.info("policy refit %s: %s; keeping the current model", where, exc)
                    done[where] = self._count("not_enough_data")
                except Exception:
                    log.exception("policy refit %s failed; keeping the current model", where)
                    done[where] = self._count("failed")
        if fitted:
            done.update(self._publish(fitted))
        self.last_pass = time.time()
        return done

    def _publish(self, fitted: list[tuple[str, int, str, PolicyModel]]) -> dict[str, str]:
        """The pass's models and, when one is new, the revision bump: one transaction."""
        from ablab.platform.registry.audit import bump_revision
        from ablab.platform.registry.sdk_config import publish_model

        try:
            with transaction(self._sessions) as session:
                new = {where: publish_model(session, exp_id, variant, model.version, json.loads(model.to_json()))
                       for where, exp_id, variant, model in fitted}
                if any(new.values()):  # the SDK config carries the models: its revision (and ETag) moves
                    bump_revision(session)
        except Exception:
            log.exception("policy refit: the new models cannot be stored; every model stays as it was")
            return {where: self._count("failed") for where, *_ in fitted}
        for where, _, _, model in fitted:
            if new[where]:
                log.info("policy refit %s: model %s published (%d requests)", where, model.version, model.trained_on)
        if any(new.values()) and self._on_publish is not None:
            self._on_publish()  # this process's own config cache: at once, not after its TTL
        return {where: self._count("published" if is_new else "unchanged") for where, is_new in new.items()}

    def _count(self, outcome: str) -> str:
        self.outcomes[outcome] += 1
        return outcome

    # -- ports.Component

    def checks(self) -> Mapping[str, Probe]:
        return {}

    def collect(self) -> Iterator[Any]:
        refits = CounterMetricFamily("ablab_policy_refits", "Policy model refits by outcome (a failure or "
                                     "not_enough_data keeps the previous model)", labels=["outcome"])
        for outcome, n in self.outcomes.items():
            refits.add_metric([outcome], n)
        yield refits
        last = GaugeMetricFamily("ablab_policy_refit_last_pass_timestamp_seconds", "When the last refit pass ended")
        last.add_metric([], self.last_pass or 0.0)
        yield last

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def policy_refresher(state: Any) -> PolicyRefresher | None:
    """The app's refresher when it has an analytics store and refits are on (app.py)."""
    interval = refit_interval_s()
    if state.analytics is None or interval <= 0:
        return None
    return PolicyRefresher(state.sessions, state.analytics, interval_s=interval, on_publish=state.assignments.invalidate,
                           first_s=first_refit_s())
