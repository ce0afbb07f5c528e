"""API tokens: random, shown once, stored only as SHA-256 hashes, each with one scope.

Tokens carry 256 bits of randomness, so a fast hash is the right tool (a slow password
hash defends low-entropy secrets, which these are not) and lets every request be checked.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from ablab.platform.registry.models import ApiKey, utcnow
from ablab.platform.registry.schemas import Scope

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


def create_api_key(session: Session, *, name: str, scope: Scope) -> tuple[ApiKey, str]:
    token = new_token()
    key = ApiKey(name=name, prefix=token[: len(TOKEN_PREFIX) + 6], token_hash=hash_token(token), scope=scope.value)
    session.add(key)
    session.flush()
    return key, token


def authenticate(session: Session, token: str) -> ApiKey | None:
    if not token.startswith(TOKEN_PREFIX):
        return None
    digest = hash_token(token)
    key = session.scalar(select(ApiKey).where(ApiKey.token_hash == digest))
    if key is None or key.revoked_at is not None:
        return None
    # The lookup is by hash; compare again in constant time so timing says nothing.
    return key if hmac.compare_digest(key.token_hash, digest) else None


def revoke_api_key(session: Session, *, prefix: str) -> int:
    keys = session.scalars(select(ApiKey).where(ApiKey.prefix == prefix, ApiKey.revoked_at.is_(None))).all()
    for key in keys:
        key.revoked_at = utcnow()
    return len(keys)
