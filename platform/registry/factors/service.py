"""Declared factors: declare, change, list, delete; and the check every experiment write runs.

Services flush; the caller's transaction commits (``registry.db.transaction``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict, Invalid, NotFound
from ablab.platform.policy.spec import error_field, parse_policy
from ablab.platform.registry.factors.catalog import FactorCatalog, FactorDef, sets_factor
from ablab.platform.registry.factors.models import DeclaredFactor
from ablab.platform.registry.factors.schemas import FactorCreate, FactorRead, FactorUpdate
from ablab.platform.registry.models import AuditEntry, Experiment
from ablab.platform.strategy import OpenStrategy, open_strategy


def _definition(row: DeclaredFactor) -> FactorDef:
    default = (row.default or {}).get("value")
    values = tuple(row.values) if row.values is not None else None
    return FactorDef(row.name, row.type, "declared", values, row.min, row.max, default, row.description or "")


def _snapshot(d: FactorDef) -> dict[str, Any]:
    return FactorRead.of(d).model_dump(mode="json", exclude={"json_schema", "allowed", "origin", "nullable"})


def catalog(session: Session) -> FactorCatalog:
    """Built-in, gateway and every declared factor, as one catalog."""
    return FactorCatalog(_definition(r) for r in session.scalars(select(DeclaredFactor)))


def list_factors(session: Session) -> list[FactorRead]:
    return [FactorRead.of(d) for d in catalog(session).all()]


def get_factor(session: Session, name: str) -> FactorRead:
    found = catalog(session).get(name)
    if found is None:
        raise NotFound(f"factor '{name}' is not declared; GET /v1/factors lists every factor", field="name")
    return FactorRead.of(found)


def _row(session: Session, name: str, *, lock: bool = False) -> DeclaredFactor | None:
    query = select(DeclaredFactor).where(DeclaredFactor.name == name)
    return session.scalar(query.with_for_update() if lock else query)


def _write(row: DeclaredFactor, data: FactorUpdate) -> None:
    row.type, row.values, row.min, row.max = data.type, data.values, data.min, data.max
    row.default = {"value": data.default} if data.default is not None else None
    row.description = data.description


def _audit(session: Session, *, actor: str, action: str, name: str, before: Any, after: Any) -> None:
    session.add(AuditEntry(actor=actor, action=action, entity_type="factor", entity_key=name[:64], before=before, after=after))


def declare_factor(session: Session, *, data: FactorCreate, actor: str) -> tuple[FactorRead, bool]:
    """Declare a factor; the same declaration again changes nothing (returns created=False)."""
    wanted = data.definition(data.name)
    existing = _row(session, data.name)
    if existing is not None:
        if _snapshot(_definition(existing)) == _snapshot(wanted):
            return FactorRead.of(wanted), False
        raise Conflict(f"factor '{data.name}' is already declared differently ({_definition(existing).allowed()}); "
                       f"change it with PUT /v1/factors/{data.name}", field="name")
    row = DeclaredFactor(name=data.name)
    _write(row, data)
    session.add(row)
    session.flush()
    _audit(session, actor=actor, action="declare", name=data.name, before=None, after=_snapshot(wanted))
    return FactorRead.of(wanted), True


def update_factor(session: Session, *, name: str, data: FactorUpdate, actor: str) -> FactorRead:
    """Replace a declaration, unless a live experiment sets a level it would no longer allow."""
    row = _row(session, name)
    if row is None:
        raise NotFound(f"factor '{name}' is not declared; declare it with POST /v1/factors", field="name")
    before = _definition(row)
    wanted = data.definition(name)
    current = catalog(session)
    current.declared[name] = wanted
    broken = []
    for exp in session.scalars(select(Experiment).where(Experiment.status != "stopped")):
        for label, strategy in _strategies(exp):
            broken += [f"{label}: {why}" for factor, why in current.problems(open_strategy(strategy)) if factor == name]
    if broken:
        raise Conflict(f"live experiments set levels the new definition of '{name}' refuses: " + "; ".join(broken[:5])
                       + ("; ..." if len(broken) > 5 else "") + ". Change or stop them first", field="name")
    _write(row, data)
    session.flush()
    _audit(session, actor=actor, action="update", name=name, before=_snapshot(before), after=_snapshot(wanted))
    return FactorRead.of(wanted)


def experiments_setting(session: Session, name: str) -> list[str]:
    """Keys of every experiment, whatever its status and archived or not, one of whose
    variants (or shadows) sets the factor ``name``."""
    return [exp.key for exp in session.scalars(select(Experiment).order_by(Experiment.key))
            if any(sets_factor(strategy, name) for _, strategy in _strategies(exp))]


def _strategies(exp: Experiment) -> list[tuple[str, dict[str, Any]]]:
    """Every strategy an experiment serves or shadows, each with a label naming where it is."""
    out = []
    for v in exp.variants:
        out.append((f"{exp.key}/{v.key}", v.strategy))
        if v.shadow:
            out.append((f"{exp.key}/{v.key} (shadow)", v.shadow["strategy"]))
    if exp.shadow:
        out.append((f"{exp.key} (shadow)", exp.shadow["strategy"]))
    return out


def delete_factor(session: Session, *, name: str, actor: str) -> None:
    """Delete a declaration no experiment uses; the name may be declared again afterwards.

    Every experiment counts, stopped and archived ones too: their results are kept and
    read through the factor (attribution fills in its default for the variants that leave
    it out), and a new declaration under the same name could give their stored levels
    another meaning. A draft that sets it can be changed or deleted first.
    """
    # Locked before the experiments are read: an experiment write holds the declared rows
    # FOR SHARE from its check to its commit (check_strategies), so it either commits first
    # (and the scan below sees it) or waits and then finds the factor gone (PostgreSQL;
    # SQLite ignores row locks).
    row = _row(session, name, lock=True)
    if row is None:
        fixed = catalog(session).get(name)
        if fixed is not None:
            why = ("the strategy schema defines it and the in-repo runtime serves it" if fixed.origin == "builtin"
                   else "the gateway reads it from every strategy")
            raise Conflict(f"factor '{name}' is a {fixed.origin} factor, not a declared one: {why}, so it cannot be deleted",
                           field="name")
        raise NotFound(f"factor '{name}' is not declared; GET /v1/factors lists every factor", field="name")
    users = experiments_setting(session, name)
    if users:
        shown = ", ".join(users[:20]) + (f" and {len(users) - 20} more" if len(users) > 20 else "")
        raise Conflict(f"factor '{name}' is set by experiment{'s' if len(users) > 1 else ''} {shown}; an experiment's "
                       "results are read through the factors it sets, stopped and archived ones included, so it stays "
                       "declared while they exist (an experiment that never ran can be changed or deleted first)",
                       field="name")
    before = _snapshot(_definition(row))
    session.delete(row)
    session.flush()
    _audit(session, actor=actor, action="delete", name=name, before=before, after=None)


def check_strategies(session: Session, variants: Sequence[Any] | None, *, shadow: Any = None,
                     custom: Mapping[str, Any] | None = None) -> None:
    """Refuse a write whose strategies set an undeclared factor or a level not allowed.

    A policy strategy (``{policy: {...}}``, docs/policies.md) is validated whole by
    ``parse_policy`` with the catalog (each arm is a strategy) and ``custom`` (the
    experiment's custom metrics, name → metric, for the objective); the error names the
    policy's field (``variants.1.strategy.policy.arms.fast``).

    ``variants`` are ``VariantIn``; the error names the variant's field (``variants.1.strategy.engine``).
    Shadow strategies (the experiment's ``shadow``, a ``ShadowIn``, and each variant's) are
    checked by the same rules (``shadow.strategy.engine``, ``variants.1.shadow.strategy.engine``).
    """
    checks: list[tuple[str, OpenStrategy]] = []
    for i, v in enumerate(variants or ()):
        checks.append((f"variants.{i}.strategy", v.strategy))
        if getattr(v, "shadow", None) is not None:
            checks.append((f"variants.{i}.shadow.strategy", v.shadow.strategy))
    if shadow is not None:
        checks.append(("shadow.strategy", shadow.strategy))
    if not checks:
        return
    # FOR SHARE until the write commits, so a concurrent delete_factor cannot remove a
    # factor these strategies were just checked against (it waits for this commit).
    rows = session.scalars(select(DeclaredFactor).with_for_update(read=True))
    factors = FactorCatalog(_definition(r) for r in rows)
    for where, strategy in checks:
        if strategy.policy is not None:
            try:
                parse_policy(strategy.policy, factors=factors, custom=custom)
            except ValidationError as exc:
                field, message = error_field(exc, f"{where}.policy.")
                raise Invalid(f"{field}: {message}", field=field) from None
            continue
        problems = factors.problems(strategy)
        if problems:
            field = f"{where}.{problems[0][0]}"
            raise Invalid(f"{field}: " + "; ".join(message for _, message in problems), field=field)


def with_declared_defaults(session: Session, exp: Any) -> Any:
    """An ``ExperimentRead`` whose variant strategies spell out the defaults of declared
    factors they leave out, so attribution compares levels, not spellings."""
    defaults = catalog(session).defaults()
    if not defaults:
        return exp
    variants = []
    for v in exp.variants:
        strategy = dict(v.strategy)
        if isinstance(strategy.get("policy"), dict):  # a policy holds only its arms (each served as set)
            variants.append(v)
            continue
        params = dict(strategy.get("params") or {})
        for name, default in defaults.items():
            if name.startswith("params."):
                params.setdefault(name.split(".", 1)[1], default)
            else:
                strategy.setdefault(name, default)
        if params:
            strategy["params"] = params
        variants.append(v.model_copy(update={"strategy": strategy}))
    return exp.model_copy(update={"variants": variants})
