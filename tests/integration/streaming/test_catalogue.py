"""The field catalogue against a migrated ClickHouse store: ``DESCRIBE TABLE`` of every
table that holds a field (raw_events, window_stats, late_events, the rollup tables) must
agree with ``ablab.platform.fields``. Real chDB, every migration applied, in a subprocess
(chDB holds one session per process)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ablab.platform import fields
from ablab_testing import run_child_json

_DESCRIBE = textwrap.dedent("""
    import json, sys
    from ablab.streaming.store import apply_ddl, make_client
    client = make_client(f"chdb:///{sys.argv[1]}")
    apply_ddl(client)
    tables = {}
    for table in json.loads(sys.argv[2]):
        result = client.query(f"DESCRIBE TABLE {table}")
        tables[table] = {row[0]: row[1] for row in result.result_rows}
    print(json.dumps(tables))
""")


def _problems(described: dict[str, dict[str, str]]) -> list[str]:
    problems = []
    for table, (kind, expected) in fields.clickhouse_expected().items():
        problems += fields.mismatches(
            table, kind, expected, described[table], fields.CLICKHOUSE_FIXED.get(table, frozenset())
        )
    return problems


@pytest.fixture(scope="module")
def described(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    store = Path(tmp_path_factory.mktemp("catalogue")) / "store"
    return run_child_json(_DESCRIBE, str(store), json.dumps(list(fields.clickhouse_expected())), timeout=300)


def test_every_table_agrees_with_the_catalogue(described: dict[str, dict[str, str]]) -> None:
    assert _problems(described) == []
    # and the loader's window tuple is the table's column order, key to emitted_at
    window = [c for c in described["window_stats"] if c != "loaded_at"]
    assert tuple(window) == fields.WINDOW_COLUMNS


def test_the_table_check_fails_when_a_table_disagrees(described: dict[str, dict[str, str]]) -> None:
    wrong = {table: dict(columns) for table, columns in described.items()}
    wrong["raw_events"]["score"] = "Nullable(UInt8)"
    del wrong["window_stats"]["tpot_ms_sumsq"]
    wrong["late_events"]["device_s"] = "Nullable(Float64)"
    del wrong["unit_stats"]["e2e_ms_sq"]
    problems = _problems(wrong)
    assert len(problems) == 4, problems
    assert any("raw_events.score: type Nullable(UInt8)" in p for p in problems)
    assert any("window_stats: missing column tpot_ms_sumsq" in p for p in problems)
    assert any("late_events: column device_s is not in the field catalogue" in p for p in problems)
    assert any("unit_stats: missing column e2e_ms_sq" in p for p in problems)
