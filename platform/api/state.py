"""Process-wide state of the API, built in ``create_app``'s lifespan (never at import)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from ablab.platform.api.ports import AnalyticsBackend, Component, IngestPipeline
from ablab.platform.assignment import AssignmentConfig
from ablab.platform.auth import authenticate, hash_token
from ablab.platform.config import Settings
from ablab.platform.errors import Unauthorized, Unavailable
from ablab.platform.registry import service
from ablab.platform.registry.db import make_engine, transaction
from ablab.platform.registry.models import aware
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
        self._variants: tuple[object, dict[str, frozenset[str]]] = (None, {})

    def invalidate(self) -> None:
        self._checked_at = 0.0

    def live_variants(self, key: str) -> frozenset[str] | None:
        """The variants of a live (not stopped) experiment; None for any other key."""
        config = self.current().config
        seen, variants = self._variants
        if seen is not config:  # rebuilt only when the registry revision moved
            variants = {e.key: frozenset(v.key for v in e.variants) for e in config.experiments}
            self._variants = (config, variants)
        return variants.get(key)

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


@dataclass(frozen=True, slots=True)
class _Cached:
    principal: Principal
    auth_revision: int  # the revocation counter the key was looked up under
    until: float  # monotonic: look the key up again after this
    expires_at: float | None  # epoch seconds; the key is refused from then on


# A constant statement (no input). Run on raw driver connections: SQLAlchemy's pool
# checkout and result machinery cost ~5x the query itself (docs/benchmarks/control-plane.md).
_AUTH_REVISION_SQL = "SELECT revision FROM auth_revision WHERE id = 1"
_IDLE_READERS = 8


class TokenCache:
    """Validated tokens by hash, so the hot path skips the key lookup.

    Every request still reads the one-row revocation counter (``auth_revision``), which
    each revocation bumps in its own transaction: an entry cached under an older counter
    is looked up again, so a revoked key fails on its next request on every API process.
    The read is one primary-key SELECT on a kept autocommit driver connection, one round
    trip (cost measured in docs/benchmarks/control-plane.md).
    """

    def __init__(self, factory: sessionmaker[Session], revision_engine: Engine, *, ttl_s: float = 30.0) -> None:
        self._factory = factory
        self._engine = revision_engine
        self._ttl_s = ttl_s
        self._entries: dict[str, _Cached] = {}
        self._idle: list[Any] = []  # driver connections; list pop/append are atomic

    def _auth_revision(self) -> int:
        for attempt in (0, 1):
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = None
            try:
                if conn is None:
                    conn = self._engine.raw_connection()
                cursor = conn.cursor()
                cursor.execute(_AUTH_REVISION_SQL)
                row = cursor.fetchone()
                cursor.close()
            except Exception as exc:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.invalidate()
                if attempt == 0:
                    continue
                raise Unavailable("cannot check whether the token was revoked: the config database "
                                  "is unreachable; retry shortly") from exc
            if len(self._idle) < _IDLE_READERS:
                self._idle.append(conn)
            else:
                conn.close()
            return int(row[0]) if row else 0
        raise AssertionError("unreachable")

    def resolve(self, token: str) -> Principal | None:
        """The token's principal; None for an unknown or revoked token. Raises
        :class:`Unauthorized` for an expired one (the message says so)."""
        digest = hash_token(token)
        revision = self._auth_revision()
        hit = self._entries.get(digest)
        if hit is not None and hit.auth_revision == revision and hit.until > time.monotonic():
            if hit.expires_at is not None and time.time() >= hit.expires_at:
                self._entries.pop(digest, None)
                raise _expired(hit.expires_at)
            return hit.principal
        with transaction(self._factory) as session:
            key = authenticate(session, token)
            if key is None:
                self._entries.pop(digest, None)
                return None
            principal = Principal(name=key.name, scope=Scope(key.scope))
            expires = aware(key.expires_at)
        expires_ts = expires.timestamp() if expires is not None else None
        if expires_ts is not None and time.time() >= expires_ts:
            raise _expired(expires_ts)
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[digest] = _Cached(principal, revision, time.monotonic() + self._ttl_s, expires_ts)
        return principal

    def close(self) -> None:
        while self._idle:
            with contextlib.suppress(Exception):
                self._idle.pop().close()
        self._engine.dispose()


def _expired(at: float) -> Unauthorized:
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
    return Unauthorized(f"this token expired at {when}; ask an admin for a new key (POST /v1/keys or ablab keys create)",
                        field="Authorization")


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
    # Wired by ``create_app``'s caller (``ablab.cli.wiring``); None where this process runs none.
    ingest: IngestPipeline | None = None
    analytics: AnalyticsBackend | None = None
    # Everything else started with the app (the guardrail monitor, extensions), in start order.
    components: list[Any] = field(default_factory=list)
    _known: tuple[str | None, frozenset[str]] = field(default=(None, frozenset()), init=False, repr=False)

    def registered_experiments(self) -> frozenset[str]:
        """Every experiment ever registered (stopped ones still get late labels), re-read
        only when the registry revision moves, so a new experiment is known at once."""
        revision = self.assignments.current().config.revision
        if revision != self._known[0]:
            with transaction(self.sessions) as session:
                items, _ = service.list_experiments(session, limit=100_000)
            self._known = (revision, frozenset(e.key for e in items))
        return self._known[1]

    def running(self) -> list[Component]:
        """The components that report readiness and metrics, ingestion first."""
        parts = [self.ingest, self.analytics, *self.components]
        return [c for c in parts if c is not None and isinstance(c, Component)]

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
            tokens=TokenCache(sessions, make_engine(settings.resolved_database_url, revision_reader=True)),
            metrics=Metrics(),
        )
