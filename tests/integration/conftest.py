"""Shared fixtures for integration tests: real services, started once per session.

``kafka_broker`` yields the bootstrap string of a real Kafka 4.x broker (KRaft). It reuses
``ABLAB_TEST_KAFKA_BOOTSTRAP`` when set (a broker someone else runs); otherwise it starts
one on a free port in a temp dir, with the ablab topics created, and stops it at the end.
``store`` is a fresh embedded ClickHouse store (chDB) with the schema applied, per test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ablab_testing import server_ports


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from ablab.streaming.kafka.broker import BrokerConfig, start_broker, stop_broker
    from ablab.streaming.kafka.topics import create_topics

    external = os.environ.get("ABLAB_TEST_KAFKA_BOOTSTRAP")
    if external:
        create_topics(bootstrap=external)
        yield external
        return
    config = BrokerConfig(directory=tmp_path_factory.mktemp("kafka"), port=server_ports(2), heap_mb=384)
    status = start_broker(config=config)
    try:
        yield status.bootstrap or config.bootstrap
    finally:
        stop_broker(directory=config.directory)


@pytest.fixture
def store(tmp_path):
    from ablab.streaming.store import apply_ddl, make_client

    client = make_client(f"chdb:///{tmp_path / 'chdb'}")
    apply_ddl(client)
    yield client
    client.close()
