"""The SLA-constrained Thompson-sampling allocator, wired to live experiments.

Opt-in per experiment through ``Settings.allocator_experiments``; it runs inside the
guardrail monitor's loop (no extra process), at most every ``allocator_interval_s``.
Each pass, for every opted-in running experiment, it reads the arms from the store
(reward: ``allocator_reward``, e.g. accuracy; constraint: ``allocator_constraint``,
e.g. p95 TTFT, bounded by the experiment's own guardrail ``max`` on that metric), draws
weights with :func:`ablab.platform.stats.allocator.thompson_weights` and, when a share
moved by at least ``allocator_min_change``, writes them through the registry service:
``update_experiment`` with ``new_phase`` under the version it read (optimistic locking:
a concurrent edit wins and this pass skips), plus an audit entry that says why.

Assignment semantics, chosen on purpose: the assignment engine only changes weights
together with a new phase, which rehashes every unit. For a **request**-randomized
experiment that moves nobody who matters — each request is its own unit and is hashed
once — so the allocator re-weights those only. A user- or session-randomized experiment
would have its users reshuffled between variants at every re-weight (carry-over, units
in two arms, a per-unit analysis that no longer holds), so it is refused with a log line.
Experiments with a paused variant are skipped: a new variant list would also clear the
pause the guardrail set. Results of re-weighted experiments skip the sample-ratio check
(``ExperimentSpec.adaptive``): there is no fixed split to check against.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.analytics import service
from ablab.platform.config import Settings
from ablab.platform.errors import PreconditionFailed
from ablab.platform.registry import service as registry
from ablab.platform.registry.db import transaction
from ablab.platform.registry.schemas import ExperimentRead, ExperimentUpdate, Status, VariantIn
from ablab.platform.stats.allocator import arms_from_stats, thompson_weights

if TYPE_CHECKING:
    from ablab.platform.analytics.store_port import AnalyticsReads

log = logging.getLogger(__name__)
ACTOR = "allocator"
_warned: set[tuple[str, str]] = set()


def _skip(key: str, why: str) -> dict[str, Any]:
    if (key, why) not in _warned:  # once per experiment and reason, not every pass
        _warned.add((key, why))
        log.warning("allocator skips %s: %s", key, why)
    return {"experiment": key, "skipped": why}


def _sla(exp: ExperimentRead, constraint: str) -> float | None:
    bounds = [g.get("max") for g in exp.guardrails if g.get("metric") == constraint and g.get("max") is not None]
    return float(min(bounds)) if bounds else None


def plan(store: AnalyticsReads, exp: ExperimentRead, settings: Settings) -> dict[str, Any]:
    """What the allocator would do with one experiment now (no writes): new weights, or why not."""
    if exp.unit.value != "request":
        return _skip(exp.key, f"unit is {exp.unit.value}: re-weighting needs a new phase, which would reshuffle its units; "
                              "only request-randomized experiments are re-weighted")
    if any(v.paused for v in exp.variants):
        return _skip(exp.key, "a variant is paused by a guardrail; re-weighting would un-pause it")
    if sum(1 for v in exp.variants if v.weight > 0) <= 1:
        return _skip(exp.key, "one variant has all the traffic (it was shipped); re-weighting would undo the ship")
    sla = _sla(exp, settings.allocator_constraint)
    if sla is None:
        return _skip(exp.key, f"no guardrail max on {settings.allocator_constraint} to use as the SLA")
    spec = service.stats_spec(exp, settings=settings)
    from ablab.platform.analytics.results import variant_stats

    stats, _ = variant_stats(store, spec)
    arms = arms_from_stats(spec, stats, reward=settings.allocator_reward, constraint=settings.allocator_constraint)
    trials = sum(a.trials for a in arms.values())
    if trials < settings.allocator_min_trials:
        return {"experiment": exp.key, "skipped": f"{trials:.0f} of {settings.allocator_min_trials} labelled requests"}
    weights = thompson_weights(arms, sla=sla, floor=settings.allocator_floor, seed=exp.phase)
    total = sum(v.weight for v in exp.variants)
    current = {v.key: v.weight / total for v in exp.variants}
    moved = max(abs(weights[k] - current[k]) for k in weights)
    summary = {
        k: {"reward": a.successes / a.trials if a.trials else None, "trials": a.trials,
            settings.allocator_constraint: a.constraint_mean if math.isfinite(a.constraint_mean) else None}
        for k, a in arms.items()
    }
    if moved < settings.allocator_min_change:
        return {"experiment": exp.key, "skipped": f"largest share change {moved:.3f} < {settings.allocator_min_change}",
                "weights": weights}
    return {"experiment": exp.key, "weights": weights, "previous": current, "arms": summary, "sla": sla}


def reweight(sessions: sessionmaker[Session], store: AnalyticsReads, settings: Settings) -> list[dict[str, Any]]:
    """One allocator pass over the opted-in running experiments; returns what it did per experiment."""
    wanted = set(settings.allocator_experiments)
    if not wanted:
        return []
    with transaction(sessions) as session:
        running, _ = registry.list_experiments(session, status=Status.running, limit=500)
        reads = [registry.to_read(e) for e in running if e.key in wanted]
    done = []
    for exp in reads:
        try:
            step = plan(store, exp, settings)
        except Exception:
            log.exception("allocator pass on %s failed", exp.key)
            continue
        if "weights" in step and "skipped" not in step:
            step = _apply(sessions, exp, step, settings)
        done.append(step)
    return done


def _apply(sessions: sessionmaker[Session], exp: ExperimentRead, step: dict[str, Any], settings: Settings) -> dict[str, Any]:
    weights = {k: round(w, 6) for k, w in step["weights"].items()}
    reason = (
        f"Thompson sampling on {settings.allocator_reward} subject to {settings.allocator_constraint} <= {step['sla']:g}: "
        + ", ".join(f"{k} {step['previous'][k]:.3f} -> {weights[k]:.3f}" for k in weights)
    )
    update = ExperimentUpdate(
        variants=[VariantIn(key=v.key, weight=weights[v.key], strategy=v.strategy) for v in exp.variants],
        new_phase=True,
    )
    try:
        with transaction(sessions) as session:
            updated = registry.update_experiment(session, key=exp.key, data=update, expected_version=exp.version, actor=ACTOR)
            registry.record_audit(
                session, actor=ACTOR, action="reweight", entity_type="experiment", entity_key=exp.key,
                before={"weights": step["previous"], "phase": exp.phase, "version": exp.version},
                after={"weights": weights, "phase": updated.phase, "reason": reason, "arms": step["arms"]},
            )
    except PreconditionFailed:  # someone edited it since we read it: their change wins, next pass retries
        log.info("allocator: %s changed concurrently; skipped this pass", exp.key)
        return {"experiment": exp.key, "skipped": "changed concurrently (version moved)"}
    log.info("allocator re-weighted %s: %s", exp.key, reason)
    return {"experiment": exp.key, "weights": weights, "previous": step["previous"], "reason": reason}
