"""The registry's revision counter and audit log, shared by every registry write.

Each write records who changed what (``record_audit``) and bumps the revision
(``bump_revision``), which the assignment caches watch to rebuild their config.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict
from ablab.platform.registry.models import AuditEntry, RegistryRevision
from ablab.platform.registry.schemas import AuditRead


def bump_revision(session: Session) -> None:
    # An atomic increment: with read-modify-write two concurrent writers could store the
    # same number, and a cache that read it after the first would never see the second.
    session.flush()
    session.execute(update(RegistryRevision).where(RegistryRevision.id == 1).values(revision=RegistryRevision.revision + 1))


def flush_new(session: Session, conflict: str, *, field: str) -> None:
    """Flush an insert; a unique key taken by a concurrent writer since our check is a 409."""
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise Conflict(conflict, field=field) from exc


def registry_revision(session: Session) -> int:
    return session.scalar(select(RegistryRevision.revision).where(RegistryRevision.id == 1)) or 0


def record_audit(
    session: Session, *, actor: str, action: str, entity_type: str, entity_key: str, before: Any, after: Any
) -> None:
    session.add(
        AuditEntry(
            actor=actor,
            action=action,
            entity_type=entity_type,
            entity_key=entity_key,
            before=before,
            after=after,
        )
    )



def audit_log(
    session: Session, *, key: str | None = None, entity_type: str | None = None, limit: int = 200
) -> list[AuditRead]:
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if key is not None:
        query = query.where(AuditEntry.entity_key == key)
    if entity_type is not None:
        query = query.where(AuditEntry.entity_type == entity_type)
    return [AuditRead.model_validate(e, from_attributes=True) for e in session.scalars(query)]
