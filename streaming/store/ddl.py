"""ClickHouse DDL migrations: numbered ``.sql`` files in ``migrations/clickhouse``.

Each file is one change (``0001_raw_events.sql``, …), applied once in order and recorded
in ``ablab_ch_migrations``. Statements are written ``IF NOT EXISTS`` so a file cut short
by a crash is simply applied again. ``ablab db upgrade`` calls :func:`apply_ddl`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

MIGRATIONS_TABLE = "ablab_ch_migrations"
_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    def statements(self) -> list[str]:
        return split_statements(self.sql)


def _migrations_dir() -> Path:
    """``migrations/clickhouse`` of the installed package, else of this source tree."""
    spec = importlib.util.find_spec("ablab.migrations")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "clickhouse"
        if candidate.is_dir():
            return candidate
    return Path(__file__).resolve().parents[2] / "migrations" / "clickhouse"


def migration_files(directory: Path | None = None) -> list[Migration]:
    """The migrations in version order; refuses gaps, duplicates and badly named files."""
    directory = directory or _migrations_dir()
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if not match:
            raise ValueError(f"{path}: ClickHouse migration files are named NNNN_snake_case.sql")
        migrations.append(Migration(int(match.group(1)), path.stem, path.read_text()))
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"{directory}: migration versions must run 1, 2, 3, … without gaps; found {versions}")
    return migrations


def split_statements(sql: str) -> list[str]:
    """Split a file on ``;`` at line ends, dropping ``--`` comment lines (our DDL has no ``;`` in strings)."""
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [part.strip() for part in re.split(r";\s*(?:\n|$)", body) if part.strip()]


def _ensure_table(client: Client) -> None:
    client.command(
        f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} "
        "(version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = ReplacingMergeTree(applied_at) ORDER BY version"
    )


def applied_versions(client: Client) -> dict[int, str]:
    """version → checksum of the migrations already applied."""
    _ensure_table(client)
    rows = client.query(f"SELECT version, argMax(checksum, applied_at) FROM {MIGRATIONS_TABLE} GROUP BY version").result_rows
    return {int(version): checksum for version, checksum in rows}


def apply_ddl(client: Client, *, directory: Path | None = None) -> list[str]:
    """Apply the migrations not yet applied; return their names (empty when up to date).

    A changed file that was already applied is refused: write a new numbered file instead.
    """
    done = applied_versions(client)
    applied = []
    for migration in migration_files(directory):
        if migration.version in done:
            if done[migration.version] != migration.checksum:
                raise ValueError(
                    f"ClickHouse migration {migration.name} changed after it was applied; add a new file instead"
                )
            continue
        for statement in migration.statements():
            client.command(statement)
        client.insert(
            MIGRATIONS_TABLE,
            [[migration.version, migration.name, migration.checksum]],
            column_names=["version", "name", "checksum"],
        )
        applied.append(migration.name)
    return applied
