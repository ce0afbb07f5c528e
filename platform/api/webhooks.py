"""Replay protection for signed webhooks, shared by every API process through the config DB."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, Table, delete, insert
from sqlalchemy.exc import IntegrityError

from ablab.platform.registry.models import WebhookDelivery


class SqlReplayGuard:
    """``first_seen`` inserts the delivery's key; the primary key makes a second insert fail,
    in this process or any other on the same database.

    Rows whose window has passed are deleted on the way, so the table holds at most one
    tolerance window of deliveries. Core statements on the engine, not an ORM session: a
    delivery is not a registry write and must not invalidate the assignment cache.
    """

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        self._engine = engine
        self._clock = clock

    def first_seen(self, key: str, *, expires_at: float) -> bool:
        table = WebhookDelivery.__table__
        assert isinstance(table, Table)  # a declarative model's table, for the typed delete/insert below
        try:
            with self._engine.begin() as conn:
                conn.execute(delete(table).where(table.c.expires_at < int(self._clock())))
                conn.execute(insert(table).values(key=key, expires_at=int(expires_at)))
        except IntegrityError:
            return False
        return True
