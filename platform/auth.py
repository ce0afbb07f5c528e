"""API tokens: random, shown once, stored only as SHA-256 hashes, each with one scope.

Tokens carry 256 bits of randomness, so a fast hash is the right tool (a slow password
hash defends low-entropy secrets, which these are not) and lets every request be checked.

Revoking a key bumps the ``auth_revision`` row in the same transaction; API processes
read that row on every request, so a revoked token fails on its next request everywhere.
Services here flush; the caller's transaction commits.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ablab.platform.errors import Conflict, Invalid, NotFound
from ablab.platform.registry.models import ApiKey, AuthRevision, aware, utcnow
from ablab.platform.registry.schemas import ApiKeyRead, Scope
from ablab.platform.registry.service import record_audit

TOKEN_PREFIX = "abl_"

# What each scope may do. `admin` may do everything; `sdk` is for services that assign and
# emit events, and can read nothing else.
GRANTS: dict[Scope, frozenset[Scope]] = {
    Scope.admin: frozenset(Scope),
    Scope.editor: frozenset({Scope.editor, Scope.viewer}),
    Scope.viewer: frozenset({Scope.viewer}),
    Scope.sdk: frozenset({Scope.sdk}),
}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def allows(held: Scope, needed: Scope) -> bool:
    return needed in GRANTS[held]


def key_status(key: ApiKey, now: datetime | None = None) -> str:
    if key.revoked_at is not None:
        return "revoked"
    expires = aware(key.expires_at)
    if expires is not None and expires <= (now or utcnow()):
        return "expired"
    return "active"


def key_read(key: ApiKey) -> ApiKeyRead:
    """What an admin may see of a key: never the token or its hash."""
    return ApiKeyRead(id=key.id, name=key.name, prefix=key.prefix, scope=Scope(key.scope), status=key_status(key),
                      created_at=aware(key.created_at), expires_at=aware(key.expires_at), revoked_at=aware(key.revoked_at))


def _active_named(session: Session, name: str) -> ApiKey | None:
    return session.scalar(select(ApiKey).where(ApiKey.name == name, ApiKey.revoked_at.is_(None)))


def _name_taken(name: str, holder: ApiKey | None) -> Conflict:
    which = f" (id {holder.id}, prefix {holder.prefix})" if holder is not None else ""
    return Conflict(f"an active key named '{name}' exists{which}; revoke it first "
                    "(DELETE /v1/keys/{id} or `ablab keys revoke`) or pick another name", field="name")


def create_api_key(
    session: Session, *, name: str, scope: Scope, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    if expires_at is not None:
        expires_at = aware(expires_at)
        if expires_at <= utcnow():  # type: ignore[operator]
            raise Invalid(f"expires_at {expires_at.isoformat()} is not in the future", field="expires_at")  # type: ignore[union-attr]
    if (holder := _active_named(session, name)) is not None:
        raise _name_taken(name, holder)
    token = new_token()
    key = ApiKey(name=name, prefix=token[: len(TOKEN_PREFIX) + 6], token_hash=hash_token(token), scope=scope.value,
                 expires_at=expires_at)
    session.add(key)
    try:
        # The unique index on active names settles a race the check above cannot see.
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise _name_taken(name, None) from exc
    return key, token


def authenticate(session: Session, token: str) -> ApiKey | None:
    """The active or expired key this token belongs to (callers check expiry), else None."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    key = session.scalar(select(ApiKey).where(ApiKey.token_hash == digest))
    if key is None or key.revoked_at is not None:
        return None
    # The lookup is by hash; compare again in constant time so timing says nothing.
    return key if hmac.compare_digest(key.token_hash, digest) else None


def auth_revision(session: Session) -> int:
    return session.scalar(select(AuthRevision.revision).where(AuthRevision.id == 1)) or 0


def _bump_auth_revision(session: Session) -> None:
    # One atomic increment in SQL: a read-modify-write could let two concurrent
    # revocations write the same number, and a cache that read it between them would
    # then never see the second.
    session.flush()
    session.execute(update(AuthRevision).where(AuthRevision.id == 1).values(revision=AuthRevision.revision + 1))


def _revoke(session: Session, keys: list[ApiKey], *, actor: str) -> None:
    now = utcnow()
    for key in keys:
        before = key_read(key).model_dump(mode="json")
        key.revoked_at = now
        record_audit(session, actor=actor, action="revoke", entity_type="api_key", entity_key=key.prefix,
                     before=before, after=key_read(key).model_dump(mode="json"))
    if keys:
        _bump_auth_revision(session)


def revoke_api_key(session: Session, *, prefix: str, actor: str = "cli") -> int:
    keys = list(session.scalars(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))))
    _revoke(session, keys, actor=actor)
    return len(keys)


def revoke_api_key_by_id(session: Session, *, key_id: int, actor: str) -> ApiKey:
    """Revoke one key; revoking a revoked key changes nothing and is not audited again."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"no API key has id {key_id}; GET /v1/keys lists them", field="id")
    if key.revoked_at is None:
        _revoke(session, [key], actor=actor)
    return key


def list_api_keys(
    session: Session, *, include_revoked: bool = False, limit: int = 100, offset: int = 0
) -> tuple[list[ApiKey], int]:
    query = select(ApiKey)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    return list(session.scalars(query.order_by(ApiKey.id).limit(limit).offset(offset))), total
