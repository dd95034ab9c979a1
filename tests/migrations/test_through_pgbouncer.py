"""Migrations through a stock PgBouncer (Debian 12's 1.18, its default settings: no
``ignore_startup_parameters`` for ``options``), session pooling.

The upgrade used to pin its search_path with a libpq startup option (``options=-c
search_path=…``), which PgBouncer 1.18 refuses at login ("unsupported startup parameter:
options"): ``python -m zeroth_pg.migrate upgrade`` failed through it (issue 35). It now pins it
with a SET as each connection's first statement, which a session-mode PgBouncer passes on.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgbouncer_support import bouncer
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from roles import planted_equals_operator

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _through_pgbouncer(dsn: str, pool_mode: str = "session") -> Iterator[str]:
    """``dsn`` through a PgBouncer in front of its server (session pooling unless
    ``pool_mode`` says otherwise, no ``ignore_startup_parameters`` beyond extra_float_digits,
    as stock)."""
    params = conninfo_to_dict(libpq_dsn(dsn))
    host = str(params.get("host") or "/var/run/postgresql")
    port = str(params.get("port") or 5432)
    user = str(params.get("user") or "postgres")
    socket_dir = host if host.startswith("/") else None
    with bouncer(f"* = host={host} port={port}", user=user, socket_dir=socket_dir,
                 pool_mode=pool_mode, pool_size=3) as bounced:
        yield make_conninfo(libpq_dsn(dsn), host="127.0.0.1", port=str(bounced))


def test_the_stock_pooler_refuses_a_startup_options_parameter(
        empty_database_dsn: str) -> None:
    # What the upgrade no longer sends: without it this test would say nothing.
    with _through_pgbouncer(empty_database_dsn) as dsn, pytest.raises(
            psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(dsn, options="-c search_path=pg_catalog")


def test_an_upgrade_through_pgbouncer_installs_and_then_does_nothing(
        empty_database_dsn: str) -> None:
    with _through_pgbouncer(empty_database_dsn) as dsn:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        for _ in range(2):  # a fresh install, then one with nothing to do
            done = subprocess.run(
                [sys.executable, "-m", "zeroth_pg.migrate", "upgrade", "--dsn", dsn],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
            assert done.stdout.strip() == migrate.head_revision()
        assert migrate.current_revision(dsn) == migrate.head_revision()
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()


def test_the_search_path_is_still_pinned_through_pgbouncer(empty_database_dsn: str) -> None:
    # As tests/migrations/test_function_files.py::TestTheUpgradeSession, through PgBouncer: an
    # operator a stranger planted in public for alembic's `relname IN ($1::VARCHAR)` is not
    # bound by the upgrade's own queries (the SET comes before them).
    with planted_equals_operator(empty_database_dsn), \
            _through_pgbouncer(empty_database_dsn) as dsn:
        migrate.upgrade(dsn)
        migrate.upgrade(dsn)
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()


def test_an_upgrade_in_transaction_pooling_leaves_no_pinned_session_behind(
        empty_database_dsn: str) -> None:
    # In transaction mode a SET outside a transaction block stays with the server session that
    # ran it, and a session advisory lock with it: the upgrade checks, at the start of each of
    # its transactions, that it still holds its lock and its pin (a moved session is refused,
    # before any migration runs), and resets the pin with the lock. Busy or quiet, no server
    # session of the pooler is left pinned for the application's clients.
    with _through_pgbouncer(empty_database_dsn, "transaction") as dsn:
        outcomes = []
        for _ in range(3):
            try:
                migrate.upgrade(dsn)
                outcomes.append("upgraded")
            except Exception as exc:
                outcomes.append(str(exc))
        # Upgraded, or refused with the check's own words: nothing else.
        assert all(o == "upgraded" or "do not reach one server session" in o
                   for o in outcomes), outcomes
        clients = [psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
                   for _ in range(3)]
        try:
            # Three transactions at once: every server session of the pool (pool_size 3).
            for c in clients:
                c.execute("BEGIN")
            paths = {str(c.execute("SHOW search_path").fetchone()[0]) for c in clients}
            for c in clients:
                c.execute("COMMIT")
        finally:
            for c in clients:
                c.close()
    assert "pg_catalog, pg_temp" not in paths, (outcomes, paths)
    if "upgraded" in outcomes:
        assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()


def test_a_session_without_the_upgrade_lock_is_refused(empty_database_dsn: str) -> None:
    # What the check sees when the pooler moved the upgrade to another server session: neither
    # the lock nor the pin there.
    from sqlalchemy import create_engine, text

    from zeroth_pg._migrate_alembic import (
        ADVISORY_LOCK_KEY,
        SessionMovedError,
        check_same_session,
        to_sqlalchemy_url,
    )
    engine = create_engine(to_sqlalchemy_url(empty_database_dsn))
    try:
        with engine.connect() as connection:
            with pytest.raises(SessionMovedError, match="pooler in session mode"):
                check_same_session(connection)
            connection.rollback()
            connection.execute(text("SET search_path = pg_catalog, pg_temp"))
            with pytest.raises(SessionMovedError):  # the pin alone: the lock is elsewhere
                check_same_session(connection)
            connection.rollback()
            connection.execute(text("SET search_path = pg_catalog, pg_temp"))
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY})
            check_same_session(connection)  # both here: the upgrade goes on
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_LOCK_KEY})
    finally:
        engine.dispose()
