"""The zeroth_pg.testing fixtures and DSN helpers."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from zeroth_pg.testing import TestServer, libpq_dsn, run_psql, with_database


class TestWithDatabase:
    @pytest.mark.parametrize(
        ("dsn", "expected"),
        [
            (
                "postgresql://postgres:@/postgres?host=/tmp/x/pg",
                "postgresql://postgres:@/other?host=/tmp/x/pg",
            ),
            (
                "postgresql://u:p@h:5432/app?sslmode=disable",
                "postgresql://u:p@h:5432/other?sslmode=disable",
            ),
            ("postgresql://u@h", "postgresql://u@h/other"),
            ("postgresql://u@/app?dbname=app&host=/s", "postgresql://u@/other?host=/s"),
        ],
    )
    def test_swaps_only_the_database(self, dsn: str, expected: str) -> None:
        assert with_database(dsn, "other") == expected

    def test_keyword_dsn(self) -> None:
        swapped = with_database("host=/s dbname=app user=u", "other")
        assert conninfo_to_dict(swapped) == {"host": "/s", "dbname": "other", "user": "u"}

    def test_libpq_dsn_drops_the_driver(self) -> None:
        assert libpq_dsn("postgresql+asyncpg://u@h/d") == "postgresql://u@h/d"


def test_psql_reaches_a_database_by_swapped_name(pg_server: TestServer, database_dsn: str) -> None:
    name = database_dsn.split("/")[3].split("?")[0]
    out = run_psql(with_database(pg_server.dsn, name), "SELECT current_database();", "-At")
    assert out.stdout.strip() == name


async def test_conn_is_rolled_back(conn: Any) -> None:
    await conn.execute("CREATE TABLE zeroth.plugin_probe (x int)")
    assert await conn.fetchval("SELECT count(*) FROM zeroth.plugin_probe") == 0


async def test_conn_sees_no_previous_test_writes(conn: Any) -> None:
    assert await conn.fetchval("SELECT to_regclass('zeroth.plugin_probe')") is None


async def test_connect_and_pool_share_committed_data(connect: Any, pool: Any) -> None:
    first = await connect()
    await first.execute(
        "CREATE TABLE public.shared_probe (x int); INSERT INTO public.shared_probe VALUES (1)"
    )
    second = await connect()
    assert await second.fetchval("SELECT x FROM public.shared_probe") == 1
    assert await pool.fetchval("SELECT x FROM public.shared_probe") == 1
    assert await pool.fetchval("SELECT current_setting('fsync')") in {"off", "on"}


class TestPluginInAnotherProject:
    """The entry point loads the plugin into every pytest session of every project that installs
    zeroth_pg: there it must cost nothing until a test asks for a fixture."""

    def test_a_session_without_its_fixtures_starts_no_server_and_imports_nothing_heavy(
        self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
    ) -> None:
        scratch = tmp_path / "tmp"
        scratch.mkdir()
        monkeypatch.setenv("TMPDIR", str(scratch))  # where a started server would put its data
        monkeypatch.delenv("ZEROTH_PG_TEST_DSN", raising=False)
        pytester.makepyfile(
            """
            import sys

            HEAVY = {"asyncpg", "psycopg", "alembic", "sqlalchemy", "typer", "rich"}

            def test_trivial(request):
                assert "zeroth_pg.testing" in sys.modules  # loaded, through the entry point
                assert sorted(HEAVY & {name.split(".")[0] for name in sys.modules}) == []
                assert request.config.pluginmanager.has_plugin("zeroth_pg.testing")
            """
        )
        # pytest-postgresql's own plugin imports psycopg: keep it out to see ours alone.
        result = pytester.runpytest_subprocess("-p", "no:pytest_postgresql", "-p",
                                               "no:cacheprovider")
        result.assert_outcomes(passed=1)
        assert "zeroth_pg" not in result.stdout.str()  # no header line, no server named
        assert [p.name for p in scratch.iterdir() if p.name.startswith("zeroth-pg-test-")] == []


class TestKeptConnection:
    """``conn`` keeps one connection and one database for every test of a session: what a test
    rolled back must not change what the next one sees."""

    def test_the_runs_an_earlier_test_rolled_back_are_gone_from_the_claim_index_of_the_next(
        self, pytester: pytest.Pytester
    ) -> None:
        # A rolled-back run leaves its entry in runs_claim_pending_idx until a VACUUM, and a
        # claim that reads past many such entries keeps a claim floor for its session
        # (sql/functions/internal/claim_floor.sql): without the fixture's VACUUM a test's claims
        # depended on the runs the tests before it had enqueued in its scope.
        pytester.makeini(
            """
            [pytest]
            asyncio_mode = auto
            asyncio_default_fixture_loop_scope = session
            asyncio_default_test_loop_scope = session
            """
        )
        pytester.makepyfile(
            '''
            ENTRIES = """SELECT pg_stat_get_xact_tuples_returned(
                             'zeroth.runs_claim_pending_idx'::regclass)"""

            async def test_1_leaves_rolled_back_runs(clock_conn):
                assert await clock_conn.fetchval(
                    """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => 'probe',
                           runs => (SELECT jsonb_agg(jsonb_build_object('payload', '{}'::jsonb))
                                      FROM generate_series(1, 1000)))""") == 1000

            async def test_2_claims_read_none_of_their_entries(clock_conn):
                before = await clock_conn.fetchval(ENTRIES)
                assert await clock_conn.fetchval(
                    """SELECT count(run_id) FROM zeroth.claim_pending(deployment_ref => 'probe',
                           worker_id => 'w')""") == 0
                assert await clock_conn.fetchval(ENTRIES) - before == 0
            '''
        )
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                               "-p", "no:pytest_postgresql")
        result.assert_outcomes(passed=2)
