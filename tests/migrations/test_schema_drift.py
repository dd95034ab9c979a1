"""sql/schema.sql is the readable present of the schema: it must match a migrated database."""

from __future__ import annotations

import difflib

import pytest

from zeroth_pg import migrate


def test_schema_sql_matches_migrated_database(database_dsn: str) -> None:
    path = migrate.schema_sql_path()
    regenerate = f"regenerate it with: {migrate.SCHEMA_DUMP_COMMAND}"
    if not path.exists():
        pytest.fail(f"{path} is missing; {regenerate}")
    committed = path.read_text(encoding="utf-8")
    migrated = migrate.dump_schema(database_dsn)
    if committed != migrated:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                migrated.splitlines(keepends=True),
                "sql/schema.sql (committed)",
                "migrated database",
            )
        )
        pytest.fail(f"sql/schema.sql drifted from the migrations; {regenerate}\n{diff}")
