"""alembic upgrades: from empty, re-run, concurrent, and what survives the trip to the server."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from zeroth_pg import migrate


def _zeroth_objects(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = 'zeroth')
                    + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                        WHERE n.nspname = 'zeroth')"""
        ).fetchone()
    assert row is not None
    return int(row[0])


def _version_rows(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT version_num FROM zeroth.alembic_version")]


class TestUpgrade:
    def test_empty_database_reaches_head(self, empty_database_dsn: str) -> None:
        assert migrate.current_revision(empty_database_dsn) is None
        migrate.upgrade(empty_database_dsn)
        assert migrate.current_revision(empty_database_dsn) == migrate.head_revision()
        assert _zeroth_objects(empty_database_dsn) > 1  # more than the version table

    def test_second_upgrade_does_nothing(self, empty_database_dsn: str) -> None:
        migrate.upgrade(empty_database_dsn)
        before = (_zeroth_objects(empty_database_dsn), migrate.dump_schema(empty_database_dsn))
        migrate.upgrade(empty_database_dsn)
        after = (_zeroth_objects(empty_database_dsn), migrate.dump_schema(empty_database_dsn))
        assert after == before
        assert _version_rows(empty_database_dsn) == [migrate.head_revision()]

    def test_concurrent_upgrades_serialise_and_apply_once(self, empty_database_dsn: str) -> None:
        # Separate processes, as in a rolling deploy: only the advisory lock keeps them apart.
        # Each waits for a start file so they really begin together.
        start = tempfile.mktemp(prefix="zeroth-upgrade-go-")
        script = (
            "import os, sys, time\n"
            "from zeroth_pg import migrate\n"
            "while not os.path.exists(sys.argv[2]): time.sleep(0.005)\n"
            "migrate.upgrade(sys.argv[1])\n"
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, empty_database_dsn, start],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        time.sleep(0.5)  # let the interpreters import
        Path(start).touch()
        try:
            results = [(*p.communicate(timeout=120), p.returncode) for p in procs]
        finally:
            Path(start).unlink()
        assert [r[2] for r in results] == [0, 0, 0], [r[1] for r in results]
        assert _version_rows(empty_database_dsn) == [migrate.head_revision()]
        assert _zeroth_objects(empty_database_dsn) > 1

    def test_concurrent_upgrades_in_one_process(self, empty_database_dsn: str) -> None:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda _: migrate.upgrade(empty_database_dsn), range(3)))
        assert _version_rows(empty_database_dsn) == [migrate.head_revision()]

    def test_template_database_is_at_head(self, database_dsn: str) -> None:
        assert migrate.current_revision(database_dsn) == migrate.head_revision()

    def test_downgrade_is_refused(self, database_dsn: str) -> None:
        from alembic import command

        with pytest.raises(NotImplementedError, match="forward-only"):
            command.downgrade(migrate._alembic_config(database_dsn), "-1")  # type: ignore[arg-type]
        assert migrate.current_revision(database_dsn) == migrate.head_revision()


def test_raw_cursor_keeps_percent_and_colon_names(empty_database_dsn: str) -> None:
    # apply_sql_file sends the file through psycopg's cursor with no parameters: '%' and ':name'
    # must reach the server untouched (SQLAlchemy text() would bind ':name').
    body = """
        CREATE FUNCTION public.f(name text) RETURNS text LANGUAGE plpgsql AS $$
        BEGIN
            IF name = 'boom' THEN
                RAISE EXCEPTION 'bad % :name %%', name;
            END IF;
            RETURN format('%s:name', name);
        END $$;
        CREATE TABLE public.t (x int);
    """
    with psycopg.connect(empty_database_dsn) as conn:
        with conn.cursor() as cur:
            cur.execute(body)  # type: ignore[call-overload]
        assert conn.execute("SELECT public.f('a')").fetchone() == ("a:name",)
        with pytest.raises(psycopg.errors.RaiseException, match="bad boom :name %"):
            conn.execute("SELECT public.f('boom')")


class TestUrls:
    @pytest.mark.parametrize(
        ("dsn", "expected"),
        [
            (
                "postgresql://postgres:@/postgres?host=/tmp/x/pg",
                "postgresql+psycopg://postgres@/postgres?host=%2Ftmp%2Fx%2Fpg",
            ),
            (
                "postgres://u:p%40ss@db.example:6543/app?sslmode=require",
                "postgresql+psycopg://u:p%40ss@db.example:6543/app?sslmode=require",
            ),
            ("postgresql+asyncpg://u@h/d", "postgresql+psycopg://u@h/d"),
            (
                "host=/run/pg port=5433 dbname=d user=u",
                "postgresql+psycopg://u@/d?host=%2Frun%2Fpg&port=5433",
            ),
        ],
    )
    def test_to_sqlalchemy_url(self, dsn: str, expected: str) -> None:
        url = migrate.to_sqlalchemy_url(dsn)
        assert url.render_as_string(hide_password=False) == expected


def test_an_upgrade_from_0019_leaves_none_of_its_registry_functions_behind(
        empty_database_dsn: str) -> None:
    """Release 0019's zeroth._change_deployment(deployment_ref, max_attempts, priority,
    managed_by, via) — five arguments, before the retry policy and lease of 0020 — was
    never dropped: the file dropped only the later signatures, so a database upgraded from 0019
    kept a second writer of zeroth.deployments that no caller uses and a fresh install lacks."""
    migrate.upgrade(empty_database_dsn, "0019")
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        conn.execute(
            """CREATE FUNCTION zeroth._change_deployment(deployment_ref text, max_attempts integer,
                   priority integer, managed_by text, via text)
                   RETURNS text LANGUAGE plpgsql AS $$ BEGIN RETURN 'kept'; END $$;
               ALTER FUNCTION zeroth._change_deployment(text, integer, integer, text, text)
                   OWNER TO zeroth_owner;""")
    migrate.upgrade(empty_database_dsn)
    with psycopg.connect(empty_database_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT to_regprocedure("
            "'zeroth._change_deployment(text, integer, integer, text, text)')"
        ).fetchone() == (None,)
