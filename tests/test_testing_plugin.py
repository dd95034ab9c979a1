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
