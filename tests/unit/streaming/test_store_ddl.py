"""ClickHouse DDL migrations against the real engine (chDB, in memory)."""

from __future__ import annotations

import pytest

from ablab.streaming.store import applied_versions, apply_ddl, make_client, migration_files
from ablab.streaming.store.client import StoreURLError
from ablab.streaming.store.ddl import split_statements


@pytest.fixture
def client(memory_db):
    return memory_db


def test_upgrade_creates_every_table_and_is_idempotent(client):
    applied = apply_ddl(client)
    assert applied == [m.name for m in migration_files()]
    tables = {row[0] for row in client.query("SHOW TABLES").result_rows}
    assert {"raw_events", "window_stats", "late_events", "dead_letters"} <= tables
    assert "rum_window_stats" not in tables  # RUM is attributed at query time (0009)
    assert apply_ddl(client) == []
    assert sorted(applied_versions(client)) == list(range(1, len(applied) + 1))


def test_a_changed_applied_migration_is_refused(client, tmp_path):
    (tmp_path / "0001_first.sql").write_text("CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;\n")
    assert apply_ddl(client, directory=tmp_path) == ["0001_first"]
    (tmp_path / "0001_first.sql").write_text("CREATE TABLE IF NOT EXISTS a (x UInt16) ENGINE = MergeTree ORDER BY x;\n")
    with pytest.raises(ValueError, match="0001_first changed"):
        apply_ddl(client, directory=tmp_path)


def test_gaps_and_bad_names_are_refused(tmp_path):
    (tmp_path / "0001_a.sql").write_text("SELECT 1")
    (tmp_path / "0003_c.sql").write_text("SELECT 1")
    with pytest.raises(ValueError, match="without gaps"):
        migration_files(tmp_path)
    (tmp_path / "0003_c.sql").unlink()
    (tmp_path / "2-bad.sql").write_text("SELECT 1")
    with pytest.raises(ValueError, match="NNNN_snake_case"):
        migration_files(tmp_path)


def test_split_statements_drops_comments_and_splits_on_line_end_semicolons():
    sql = "-- a comment; with a semicolon\nCREATE TABLE a (x String DEFAULT 'a;b') ENGINE = Memory;\n\nSELECT 1;\n"
    assert split_statements(sql) == ["CREATE TABLE a (x String DEFAULT 'a;b') ENGINE = Memory", "SELECT 1"]


@pytest.mark.parametrize(
    ("url", "message"),
    [("chdb://somehost/x", "three slashes"), ("http:///nohost", "no host"), ("postgres://x", "scheme must be")],
)
def test_bad_urls_name_the_problem(url, message):
    with pytest.raises(StoreURLError, match=message):
        make_client(url)
