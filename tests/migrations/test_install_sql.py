"""The psql install script builds the same schema as alembic and stamps the head revision."""

from __future__ import annotations

from schema_catalog import differences, snapshot

from zeroth_pg import migrate
from zeroth_pg.testing import run_psql


def test_install_script_matches_alembic(empty_database_dsn: str, database_dsn: str) -> None:
    run_psql(empty_database_dsn, migrate.install_sql())
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
    assert migrate.dump_schema(empty_database_dsn) == migrate.dump_schema(database_dsn)
    assert differences(snapshot(empty_database_dsn), snapshot(database_dsn)) == []


def test_alembic_finds_an_installed_database_current(empty_database_dsn: str) -> None:
    run_psql(empty_database_dsn, migrate.install_sql())
    before = snapshot(empty_database_dsn)
    migrate.upgrade(empty_database_dsn)
    assert differences(snapshot(empty_database_dsn), before) == []


def test_install_script_refuses_an_installed_database(database_dsn: str) -> None:
    before = snapshot(database_dsn)
    result = run_psql(database_dsn, migrate.install_sql(), check=False)
    assert result.returncode != 0
    assert "already installed" in result.stderr
    assert differences(snapshot(database_dsn), before) == []
