"""The declared-factor table (migration ``0003`` creates it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ablab.platform.registry.models import Base, utcnow


class DeclaredFactor(Base):
    __tablename__ = "strategy_factors"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(80), unique=True)
    type: Mapped[str] = mapped_column(String(16))
    values: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    min: Mapped[float | None] = mapped_column(Float, nullable=True)
    max: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Wrapped as {"value": ...} so a JSON null default stays distinct from SQL NULL.
    default: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
