"""Ship a winning variant: a new phase in which it takes all of the experiment's traffic.

The gate (:func:`ship_gate`, pure) reads the experiment's current results: a variant may be
shipped when its decision is ``ship`` (the stats engine's own verdict: a significant win on
every primary metric, every guardrail passing, no sample-ratio mismatch; see
:func:`ablab.platform.stats.decisions.decide`). Anything else is refused with the decision's
reasons, unless an editor forces it with a reason; a forced ship is audited as forced.

The effect (:func:`ship_variant`), one audited registry write:

- a new phase (``phase + 1``): the shipped variant's weight is 1 and every other variant's 0,
  so every unit the experiment assigns gets the shipped variant. The other variants stay (with
  their strategies) so past results keep their labels;
- ``traffic`` 1.0 and ``status`` running (a paused experiment serves again); ``forced`` test
  units are cleared (they would keep seeing a losing variant); the previous values are in the
  audit entry's ``before``;
- the experiment's *population* does not change: its targeting, its layer range and its
  holdout stay. Other experiments in the same layer keep their buckets (a ship never takes a
  neighbour's units), and a holdout keeps its units on the default experience, which is what
  a holdout is for: measuring the shipped changes together. To serve a strategy beyond the
  experiment's population, make it the application's default.
- the registry revision moves, so the SDK config (and its ETag) and ``/v1/assign`` follow.

A retried ship of the variant already shipped in the current phase is the same event: it
answers the recorded ship again (``replayed``), with no new phase and no new audit entry.
The ship record is the audit entry (action ``ship``); :func:`current_ship` reads it back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform import fields
from ablab.platform.errors import AblabError, Conflict, NotFound, Unavailable
from ablab.platform.registry.audit import bump_revision, record_audit
from ablab.platform.registry.experiments import (
    _check_version,
    _flush_versioned,
    _refuse_if_archived,
    _snapshot,
    get_experiment,
    to_read,
)
from ablab.platform.registry.models import AuditEntry, Experiment, aware
from ablab.platform.registry.schemas import ExperimentRead, Status
from ablab.platform.stats.result_models import Results

SHIP_ACTION = "ship"
MAX_REASON_CHARS = 500


class ShipRequest(BaseModel):
    """The body of ``POST /v1/experiments/{key}/ship``."""

    model_config = ConfigDict(extra="forbid")

    variant: str = Field(min_length=1, max_length=64, description="The variant to ship to all of the experiment's traffic.")
    force: bool = Field(default=False, description="Ship although the decision is not `ship` (audited as forced).")
    reason: str = Field(default="", max_length=MAX_REASON_CHARS, description="Why; required with force, kept in the audit log.")

    @model_validator(mode="after")
    def _forced_needs_reason(self) -> ShipRequest:
        if self.force and not self.reason.strip():
            raise ValueError("reason: a forced ship needs a reason (it is kept in the audit log)")
        return self


class ShipRecord(BaseModel):
    """One ship, as the audit log keeps it."""

    variant: str
    phase: int = Field(description="The phase the ship started; the shipped variant has all traffic in it.")
    previous_phase: int
    actor: str
    at: datetime
    forced: bool
    reason: str
    decision: str | None = Field(description="The variant's decision when it shipped (null: no results were read).")
    reasons: list[str] = Field(default_factory=list, description="The decision's reasons, as results gave them.")
    evidence: dict[str, Any] = Field(default_factory=dict, description="The primary metrics, guardrails and SRM check "
                                     "behind the decision, as results gave them.")


class ShipResult(BaseModel):
    experiment: ExperimentRead
    ship: ShipRecord
    replayed: bool = Field(description="True: this variant was already shipped in this phase; nothing changed.")


class ShipStatus(BaseModel):
    experiment: str
    shipped: ShipRecord | None = Field(description="The ship in force (its phase is the current one), else null.")


class ShipRefused(Conflict):
    """A 409 with the decision behind it: the API adds ``decision`` and ``reasons`` to the problem."""

    def __init__(self, message: str, *, field: str, decision: str | None = None, reasons: list[str] | None = None) -> None:
        super().__init__(message, field=field)
        self.decision = decision
        self.reasons = list(reasons or [])


@dataclass(frozen=True)
class Gate:
    """What results say about shipping one variant."""

    variant: str
    decision: str | None
    reasons: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def passes(self) -> bool:
        return self.decision == "ship"


# The primary rows' fields a ship keeps as evidence (the audit entry's JSON).
EVIDENCE_FIELDS = frozenset({"metric", "variant", "estimate", "ci", "abs_diff", "rel_diff", "rel_ci", "p_value",
                             "p_value_adjusted", "n", "units"})


def ship_gate(result: Results, variant: str, primary: Sequence[str]) -> Gate:
    """The variant's decision in the engine's results, with the rows that back it: the
    ``primary`` metrics' rows of the variant and the control, its guardrails, the SRM check
    (pure; the evidence is JSON, NaN already null in the models)."""
    decision = next((d for d in result.decisions if d.variant == variant), None)
    rows = [m for m in result.metrics if m.variant in (variant, result.control) and m.metric in primary]
    evidence = {
        "primary": [m.model_dump(mode="json", include=EVIDENCE_FIELDS) for m in rows],
        "guardrails": [g.model_dump(mode="json") for g in result.guardrails if g.variant == variant],
        "srm": result.srm.model_dump(mode="json", include={"p_value", "flagged"}),
    }
    if decision is None:
        return Gate(variant, None, [], evidence)
    return Gate(variant, decision.decision, list(decision.reasons), evidence)


# -- reading the ship back -----------------------------------------------------------------
def _record(entry: AuditEntry) -> ShipRecord:
    ship = dict((entry.after or {}).get("ship") or {})
    return ShipRecord(actor=entry.actor, at=aware(entry.at) or entry.at, **ship)


def _last_entry(session: Session, key: str) -> AuditEntry | None:
    return session.scalar(
        select(AuditEntry)
        .where(AuditEntry.entity_type == "experiment", AuditEntry.entity_key == key, AuditEntry.action == SHIP_ACTION)
        .order_by(AuditEntry.id.desc())
        .limit(1)
    )


def last_ship(session: Session, key: str) -> ShipRecord | None:
    entry = _last_entry(session, key)
    return _record(entry) if entry is not None else None


@dataclass(frozen=True)
class ShipWindow:
    """A ship that closed the experiment's comparison, and the variants' weights just before it
    (the audit entry's ``before``): the split the compared units were assigned under."""

    record: ShipRecord
    weights: dict[str, float]


def ship_window(session: Session, exp: Experiment | ExperimentRead) -> ShipWindow | None:
    """The last ship while the experiment is still in its phase (a pause or a stop since does
    not make later traffic comparable; a later phase, a new split, ends it), else None."""
    entry = _last_entry(session, exp.key)
    if entry is None:
        return None
    record = _record(entry)
    if exp.phase != record.phase:
        return None
    before = (entry.before or {}).get("variants") or []
    return ShipWindow(record, {str(v["key"]): float(v["weight"]) for v in before})


def _still_shipped(exp: Experiment, record: ShipRecord) -> bool:
    """The experiment is as the ship left it: same phase, the variant alone has traffic."""
    if exp.phase != record.phase or exp.status != Status.running.value or exp.traffic < 1.0 or exp.forced:
        return False
    live = [v.key for v in exp.variants if v.weight > 0 and not v.paused]
    return live == [record.variant]


def current_ship(session: Session, key: str) -> ShipRecord | None:
    """The ship in force for experiment ``key``, or None (never shipped, or changed since)."""
    exp = get_experiment(session, key)
    record = last_ship(session, key)
    return record if record is not None and _still_shipped(exp, record) else None


# -- shipping ------------------------------------------------------------------------------
ResultsOf = Callable[[ExperimentRead], Results]


def _refuse_state(exp: Experiment, variant: str) -> None:
    _refuse_if_archived(exp, "ship a variant of")
    key = exp.key
    if exp.status == Status.stopped.value:
        raise Conflict(f"cannot ship a variant of experiment '{key}': it is stopped, which is final, and out of the SDK "
                       f"config; make variant '{variant}''s strategy your application's default, or create a new "
                       "experiment with it", field="status")
    if exp.status == Status.draft.value:
        raise Conflict(f"cannot ship a variant of experiment '{key}': it never started, so it has no results to "
                       f"decide on; start it (POST /v1/experiments/{key}/start) and wait for a decision", field="status")


def ship_variant(
    session: Session,
    *,
    key: str,
    request: ShipRequest,
    actor: str,
    results_of: ResultsOf | None,
    expected_version: int | None = None,
) -> ShipResult:
    """Ship ``request.variant`` of experiment ``key`` (see the module's doc). ``results_of``
    reads the experiment's current results; it is called only when the gate is needed (not
    for a replay) and may be None where no analytics store is configured: then only a forced
    ship goes through."""
    exp = get_experiment(session, key)
    variant = request.variant
    target = next((v for v in exp.variants if v.key == variant), None)
    if target is None:
        known = ", ".join(v.key for v in exp.variants)
        raise NotFound(f"experiment '{key}' has no variant '{variant}' (its variants: {known})", field="variant")
    previous = last_ship(session, key)
    if previous is not None and previous.variant == variant and _still_shipped(exp, previous):
        return ShipResult(experiment=to_read(exp), ship=previous, replayed=True)  # a retry: the same event
    if expected_version is not None:
        _check_version(exp, expected_version)
    _refuse_state(exp, variant)
    if target.paused:
        raise ShipRefused(f"variant '{variant}' is paused ({target.paused_reason or 'no reason given'}); a paused "
                          f"variant is not shipped, even forced: resume it first (POST /v1/experiments/{key}/variants/"
                          f"{variant}/resume) if its pause no longer holds", field="variant")
    gate = _gate(exp, variant, request, results_of)

    before = _snapshot(exp)
    for v in exp.variants:
        v.weight = 1.0 if v.key == variant else 0.0
    exp.traffic = 1.0
    exp.forced = {}
    exp.status = Status.running.value
    exp.phase += 1
    _flush_versioned(session, exp)
    ship = {"variant": variant, "phase": exp.phase, "previous_phase": before["phase"], "forced": request.force and not gate.passes,
            "reason": request.reason.strip(), "decision": gate.decision, "reasons": gate.reasons, "evidence": gate.evidence}
    record_audit(session, actor=actor, action=SHIP_ACTION, entity_type="experiment", entity_key=key, before=before,
                 after={**_snapshot(exp), "ship": ship})
    bump_revision(session)  # flushes the audit entry too
    # Read back from the audit entry, so this answer and every replay of it are the same.
    record = last_ship(session, key)
    assert record is not None
    return ShipResult(experiment=to_read(exp), ship=record, replayed=False)


def _gate(exp: Experiment, variant: str, request: ShipRequest, results_of: ResultsOf | None) -> Gate:
    """The decision for ``variant``; raises :class:`ShipRefused` (409) unless it is ``ship`` or
    the request forces it."""
    key = exp.key
    force_hint = "or, as an editor who knows why, send force: true with a reason (audited as forced)"
    if variant == exp.control:
        if request.force:
            return Gate(variant, None, ["control shipped by hand"])
        raise ShipRefused(f"'{variant}' is the control: it has no decision of its own, and shipping it keeps the status "
                          f"quo; stop the experiment (POST /v1/experiments/{key}/stop) to end it, {force_hint}",
                          field="variant")
    if results_of is None:
        if request.force:
            return Gate(variant, None, ["no results were read: the analytics store is not configured here"])
        raise ShipRefused("this API process has no analytics store (ABLAB_ANALYTICS=false), so it cannot read the "
                          f"decision a ship needs; ship through an API that reads results, {force_hint}",
                          field="analytics")
    try:
        result = results_of(to_read(exp))
    except Exception as exc:  # the store's failure: a forced ship goes on without it; any other waits
        why = exc.message if isinstance(exc, AblabError) else f"{type(exc).__name__}: {exc}"
        if request.force:
            return Gate(variant, None, [f"results could not be read: {why}"])
        raise Unavailable(f"the results of experiment '{key}' could not be read ({why}), so its decision is unknown; "
                          f"retry, {force_hint}", field="results") from exc
    gate = ship_gate(result, variant, (exp.metrics or {}).get("primary") or [fields.HEADLINE_LATENCY])
    if gate.passes or request.force:
        return gate
    why = "; ".join(gate.reasons) or "results have no decision for it yet"
    if gate.decision == "no_ship":
        todo = "a guardrail is harmed or the primary metric is worse: do not ship it"
    else:
        todo = "keep the experiment running until the decision is ship"
    raise ShipRefused(f"variant '{variant}' of experiment '{key}' cannot ship: its decision is "
                      f"{gate.decision or 'missing'} ({why}); {todo}, {force_hint}",
                      field="variant", decision=gate.decision, reasons=gate.reasons)
