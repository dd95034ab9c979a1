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
from roles import dsn_as, login_role

from zeroth_pg import migrate
from zeroth_pg.testing import libpq_dsn

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def _through_pgbouncer(dsn: str) -> Iterator[str]:
    """``dsn`` through a PgBouncer in front of its server (session pooling, no
    ``ignore_startup_parameters`` beyond extra_float_digits, as stock)."""
    params = conninfo_to_dict(libpq_dsn(dsn))
    host = str(params.get("host") or "/var/run/postgresql")
    port = str(params.get("port") or 5432)
    user = str(params.get("user") or "postgres")
    socket_dir = host if host.startswith("/") else None
    with bouncer(f"* = host={host} port={port}", user=user, socket_dir=socket_dir) as bounced:
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
    with psycopg.connect(empty_database_dsn, autocommit=True) as admin:
        admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    with login_role(empty_database_dsn, None) as (name, password), psycopg.connect(
            dsn_as(empty_database_dsn, name, password), autocommit=True) as stranger:
        stranger.execute(
            """CREATE FUNCTION public.hijacked(name, varchar) RETURNS boolean LANGUAGE plpgsql
                   AS $$BEGIN RAISE EXCEPTION 'hijacked operator ran'; END$$;
               CREATE OPERATOR public.= (LEFTARG = name, RIGHTARG = varchar,
                                         FUNCTION = public.hijacked)""")
        with _through_pgbouncer(empty_database_dsn) as dsn:
            migrate.upgrade(dsn)
            migrate.upgrade(dsn)
    assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
