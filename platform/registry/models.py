"""SQLAlchemy 2 models of the registry. Migrations in ``migrations/config_db`` mirror them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timestamps back without a zone; they were written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Layer(Base):
    __tablename__ = "layers"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    salt: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Holdout(Base):
    __tablename__ = "holdouts"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    salt: Mapped[str] = mapped_column(String(64))
    fraction: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    hypothesis: Mapped[str] = mapped_column(Text, default="")
    owner: Mapped[str] = mapped_column(String(200), default="")
    unit: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), default="draft")
    traffic: Mapped[float] = mapped_column(Float)
    control: Mapped[str] = mapped_column(String(64))
    salt: Mapped[str] = mapped_column(String(64))
    phase: Mapped[int] = mapped_column(Integer, default=1)
    layer_id: Mapped[int | None] = mapped_column(ForeignKey("layers.id"), nullable=True)
    layer_lo: Mapped[int | None] = mapped_column(Integer, nullable=True)
    layer_hi: Mapped[int | None] = mapped_column(Integer, nullable=True)
    holdout_id: Mapped[int | None] = mapped_column(ForeignKey("holdouts.id"), nullable=True)
    targeting: Mapped[list[Any]] = mapped_column(default=list)
    forced: Mapped[dict[str, Any]] = mapped_column(default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(default=dict)
    guardrails: Mapped[list[Any]] = mapped_column(default=list)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    stopped_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Archived experiments are read-only, out of the SDK config and of the default list.
    archived_at: Mapped[datetime | None] = mapped_column(nullable=True)
    # Shadow traffic for every variant ({strategy, fraction, max_concurrency, timeout_s}); null: none.
    shadow: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    layer: Mapped[Layer | None] = relationship(lazy="joined")
    holdout: Mapped[Holdout | None] = relationship(lazy="joined")
    variants: Mapped[list[Variant]] = relationship(
        back_populates="experiment",
        cascade="all, delete-orphan",
        order_by="Variant.position",
        lazy="selectin",
    )

    # Optimistic locking: every UPDATE carries `WHERE version = :seen` and bumps it, so two
    # writers that read the same version cannot both win, even across processes.
    __mapper_args__ = {"version_id_col": version}


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (UniqueConstraint("experiment_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(Integer)
    weight: Mapped[float] = mapped_column(Float)
    strategy: Mapped[dict[str, Any]] = mapped_column()
    strategy_hash: Mapped[str] = mapped_column(String(32))
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    paused_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # This variant's own shadow (replaces the experiment's); null: the experiment's, if any.
    shadow: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    experiment: Mapped[Experiment] = relationship(back_populates="variants")


ACTIVE_KEY = text("revoked_at IS NULL")


class ApiKey(Base):
    __tablename__ = "api_keys"
    # One active key per name, so "who holds this key" has one answer; the database
    # enforces it, so two concurrent creates cannot both win.
    __table_args__ = (
        Index("uq_api_keys_active_name", "name", unique=True, sqlite_where=ACTIVE_KEY, postgresql_where=ACTIVE_KEY),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(nullable=True)


class AuthRevision(Base):
    """One row, bumped in the same transaction as every revocation.

    Each API process reads it on every authenticated request (one primary-key read), so
    its token cache can keep positive entries yet never serve a revoked key.
    """

    __tablename__ = "auth_revision"

    id: Mapped[int] = mapped_column(primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, default=0)


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))
    entity_type: Mapped[str] = mapped_column(String(32))
    entity_key: Mapped[str] = mapped_column(String(64), index=True)
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class RegistryRevision(Base):
    """One row, bumped in the same transaction as every registry write.

    Assignment caches (API, SDK config ETag) compare it instead of re-reading everything.
    """

    __tablename__ = "registry_revision"

    id: Mapped[int] = mapped_column(primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, default=0)


class WebhookDelivery(Base):
    """A signed webhook delivery already accepted, kept until its timestamp leaves the
    tolerance window (then the timestamp check refuses it): replay protection shared by
    every API process."""

    __tablename__ = "webhook_deliveries"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)


class PolicyModelRow(Base):
    """A fitted policy model of one variant (docs/policies.md, "Model refresh"). The newest
    row per (experiment, variant) is the one the SDK config serves; the few before it are kept
    (``registry.sdk_config.KEEP_VERSIONS``) so a propensity logged under an older version can
    still be recomputed. Tied to the experiment's row, so a model never reaches a later
    experiment of the same key."""

    __tablename__ = "policy_models"
    __table_args__ = (UniqueConstraint("experiment_id", "variant", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    variant: Mapped[str] = mapped_column(String(64))
    version: Mapped[str] = mapped_column(String(64))
    model: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


@event.listens_for(AuditEntry, "before_update")
@event.listens_for(AuditEntry, "before_delete")
def _audit_is_append_only(_mapper, _connection, target: AuditEntry) -> None:
    raise RuntimeError(f"audit log entry {target.id} is append-only")
