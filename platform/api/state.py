"""Process-wide state of the API, built in ``create_app``'s lifespan (never at import)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.assignment import AssignmentConfig
from ablab.platform.auth import authenticate, hash_token
from ablab.platform.config import Settings
from ablab.platform.registry import service
from ablab.platform.registry.db import transaction
from ablab.platform.registry.schemas import Scope


class AssignmentCache:
    """The compiled assignment config, rebuilt only when the registry revision moves.

    The revision is re-read at most every ``ttl_s`` (or right after a local commit), so
    writes from other API processes show up within ``ttl_s``.
    """

    def __init__(self, factory: sessionmaker[Session], *, bucket_space: int, ttl_s: float = 1.0) -> None:
        self._factory = factory
        self._bucket_space = bucket_space
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._revision: int | None = None
        self.config: AssignmentConfig = AssignmentConfig(bucket_space=bucket_space)
        self.payload: dict[str, Any] = {}
        self.etag = ""

    def invalidate(self) -> None:
        self._checked_at = 0.0

    def current(self) -> AssignmentCache:
        if time.monotonic() - self._checked_at < self._ttl_s:
            return self
        with self._lock:
            if time.monotonic() - self._checked_at < self._ttl_s:
                return self
            with transaction(self._factory) as session:
                revision = service.registry_revision(session)
                if revision != self._revision:
                    payload = service.sdk_config(session, bucket_space=self._bucket_space)
                    self.config = service.config_from_payload(payload)
                    self.payload = payload
                    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
                    self.etag = f'"{digest[:20]}"'
                    self._revision = revision
            self._checked_at = time.monotonic()
        return self


@dataclass(frozen=True)
class Principal:
    name: str
    scope: Scope


class TokenCache:
    """Validated tokens by hash for ``ttl_s``: the hot path skips the database.

    A revoked key stops working within ``ttl_s``.
    """

    def __init__(self, factory: sessionmaker[Session], *, ttl_s: float = 30.0) -> None:
        self._factory = factory
        self._ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal]] = {}

    def resolve(self, token: str) -> Principal | None:
        digest = hash_token(token)
        hit = self._entries.get(digest)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        with transaction(self._factory) as session:
            key = authenticate(session, token)
            principal = Principal(name=key.name, scope=Scope(key.scope)) if key else None
        if principal is None:
            self._entries.pop(digest, None)
            return None
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = (now + self._ttl_s, principal)
        return principal


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "ablab_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "ablab_http_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=self.registry,
        )
        self.assignments = Counter(
            "ablab_assignments", "Assignments returned", ["experiment", "variant"], registry=self.registry
        )
        self.bodies_refused = Counter(
            "ablab_http_bodies_refused", "Request bodies refused before the route read them (too large, too slow)",
            ["reason"], registry=self.registry,
        )


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    assignments: AssignmentCache
    tokens: TokenCache
    metrics: Metrics
    extras: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings, engine: Engine, sessions: sessionmaker[Session]) -> AppState:
        assignments = AssignmentCache(sessions, bucket_space=settings.bucket_space)
        # Re-read the registry right after a local write; read-only commits change nothing.
        def _mark_write(session: Session, _context: object, _instances: object) -> None:
            if session.new or session.dirty or session.deleted:
                session.info["wrote"] = True

        def _after_commit(session: Session) -> None:
            if session.info.pop("wrote", False):
                assignments.invalidate()

        event.listen(sessions, "before_flush", _mark_write)
        event.listen(sessions, "after_commit", _after_commit)
        return cls(
            settings=settings,
            engine=engine,
            sessions=sessions,
            assignments=assignments,
            tokens=TokenCache(sessions),
            metrics=Metrics(),
        )
