"""A test's database is what a user's migration makes: the harness's templates may be compacted
(zeroth_pg/testing.py ``_compact``), but zeroth_pg's own tables must look to the planner as they
do in a freshly migrated database. A table never vacuumed nor analyzed has ``reltuples = -1``,
and the planner then assumes at least ten pages (plancat.c's "never vacuumed" heuristic); a
VACUUM FULL sets it to 0 and the planner believes the table is empty. The plan tests
(tests/plans, test_fresh_database.py: issue 30, a fresh database before its first ANALYZE) and
every race test would then run plans a user's cold start never runs."""

from __future__ import annotations

import psycopg

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn

SIZES = """
    SELECT n.nspname || '.' || c.relname, c.relkind, c.relpages, c.reltuples
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
      AND c.relkind IN ('r', 'i', 'm', 'p')
    ORDER BY 1
"""


def _sizes(dsn: str) -> list[tuple[str, str, int, float]]:
    with psycopg.connect(libpq_dsn(dsn)) as conn:
        return conn.execute(SIZES).fetchall()


def test_a_tests_database_looks_to_the_planner_as_a_freshly_migrated_one(
        database_dsn: str, empty_database_dsn: str) -> None:
    migrate.upgrade(empty_database_dsn)
    fresh = _sizes(empty_database_dsn)
    assert fresh  # the schema's tables and indexes are there
    assert _sizes(database_dsn) == fresh
