"""The webhook replay guard on a real, migrated config DB (SQLite, and PostgreSQL when configured):
one delivery is accepted once across engines (API processes) and racing threads, and
forgotten only after its window."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from ablab.platform.api.webhooks import SqlReplayGuard
from ablab.platform.registry.db import make_engine
from ablab.platform.registry.migrate import downgrade, upgrade
from ablab.platform.registry.models import WebhookDelivery

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engines(database_url: str):
    upgrade(database_url)
    first, second = make_engine(database_url), make_engine(database_url)
    yield first, second
    first.dispose()
    second.dispose()


def test_a_delivery_is_accepted_once_by_any_process(engines) -> None:
    first, second = engines
    clock = [1_000.0]
    here, there = SqlReplayGuard(first, clock=lambda: clock[0]), SqlReplayGuard(second, clock=lambda: clock[0])
    assert here.first_seen("a" * 64, expires_at=1_300)
    assert not here.first_seen("a" * 64, expires_at=1_300)
    assert not there.first_seen("a" * 64, expires_at=1_300)
    assert there.first_seen("b" * 64, expires_at=1_300)
    clock[0] = 1_301.0  # the window has passed (the timestamp check refuses the delivery from now on)
    assert there.first_seen("c" * 64, expires_at=1_600)
    with first.connect() as conn:  # expired rows are purged on the way: the table holds one window
        keys = set(conn.execute(select(WebhookDelivery.__table__.c.key)).scalars())
    assert keys == {"c" * 64}


def test_racing_deliveries_of_one_signature_accept_exactly_one(engines) -> None:
    first, second = engines
    guards = [SqlReplayGuard(first), SqlReplayGuard(second)]
    key = "d" * 64
    expires = 4_000_000_000
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: guards[i % 2].first_seen(key, expires_at=expires), range(16)))
    assert outcomes.count(True) == 1
    with first.connect() as conn:
        table = WebhookDelivery.__table__
        assert conn.execute(select(func.count()).select_from(table).where(table.c.key == key)).scalar() == 1


def test_the_migration_goes_down_and_up(database_url: str, engines) -> None:
    downgrade(database_url, "-1")  # this revision only
    upgrade(database_url)
    assert SqlReplayGuard(engines[0]).first_seen("e" * 64, expires_at=4_000_000_000)
