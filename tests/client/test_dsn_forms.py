"""Both DSN forms libpq takes reach the database through every asyncpg connection of zeroth_pg:
a URI, and a key=value string naming several hosts (docs/dba-guide.md, "High availability"),
which asyncpg itself refuses. zeroth_pg._libpq.asyncpg_dsn is the one conversion; the
LeaseManager pool, App and RunWorker (its pool and its LISTEN connection) are checked against
the test server with the first host down."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import asyncpg
import pytest
from dsn_forms import keyword_multi_host
from helpers import wait_until

import zeroth_pg
from zeroth_pg import App
from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker

DEADLINE = 60.0


def query(uri: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(uri).query, strict_parsing=True))


class TestConversion:
    def test_a_keyword_multi_host_dsn_becomes_the_equivalent_uri(self):
        converted = zeroth_pg.asyncpg_dsn(
            "host=db1,db2 port=5432,5433 dbname=app user=worker "
            "target_session_attrs=read-write sslmode=require passfile=/etc/zp/pgpass "
            "fallback_application_name=zp connect_timeout=5")
        assert converted.startswith("postgresql://?")
        assert query(converted) == {
            "host": "db1,db2", "port": "5432,5433", "dbname": "app", "user": "worker",
            "target_session_attrs": "read-write", "sslmode": "require",
            "passfile": "/etc/zp/pgpass", "application_name": "zp"}

    def test_one_port_applies_to_every_host_and_ipv6_addresses_keep_their_brackets(self):
        assert query(zeroth_pg.asyncpg_dsn("host=::1,db2 port=6432 password='a b&c'")) == {
            "host": "[::1],db2", "port": "6432,6432", "password": "a b&c"}

    def test_a_uri_passes_unchanged_but_for_a_driver_suffix(self):
        uri = "postgresql://u@db1:5432,db2:5433/app?target_session_attrs=read-write"
        assert zeroth_pg.asyncpg_dsn(uri) == uri
        assert zeroth_pg.asyncpg_dsn("postgresql+asyncpg://u@h/db") == "postgresql://u@h/db"

    @pytest.mark.parametrize(("dsn", "match"), [
        ("host=db1 hostaddr=10.0.0.1", "hostaddr"),
        ("host=db1 channel_binding=require", "channel_binding"),
        ("host=db1 nonsense=1", "not a valid libpq connection string"),
        ("host='db1", "not a valid libpq connection string"),
    ])
    def test_what_asyncpg_cannot_honour_is_refused_clearly(self, dsn, match):
        with pytest.raises(ValueError, match=match):
            zeroth_pg.asyncpg_dsn(dsn)

    @pytest.mark.parametrize("dsn", [
        "host=db1 password=hunter2 s3cr3t dbname=app",  # a password with a space, unquoted
        "host=db1 password=hunter2 s3cr3t=x dbname=app",
        "host=db1 password='hunter2 s3cr3t",
        "postgress://u:hunter2s3cr3t@db1/app",  # a typo in the scheme
        "pg://u:hunter2s3cr3t@db1/app",
    ])
    def test_a_dsn_it_cannot_read_is_refused_without_its_password(self, dsn):
        with pytest.raises(ValueError, match="connection string") as raised:
            zeroth_pg.asyncpg_dsn(dsn)
        message = str(raised.value)
        assert "hunter2" not in message
        assert "s3cr3t" not in message

    def test_a_uri_scheme_in_any_case_reaches_asyncpg_as_a_uri(self):
        # asyncpg reads the scheme case-insensitively: such a URI worked before the conversion.
        assert zeroth_pg.asyncpg_dsn("PostgreSQL://u:pw@h/db") == "PostgreSQL://u:pw@h/db"
        assert zeroth_pg.asyncpg_dsn("POSTGRES+asyncpg://u:pw@h/db") == "POSTGRES://u:pw@h/db"


class TestKeywordMultiHostDsn:
    async def test_a_lease_manager_pool_reaches_the_server_after_the_dead_host(
            self, database_dsn):
        pool = await asyncpg.create_pool(zeroth_pg.asyncpg_dsn(keyword_multi_host(database_dsn)),
                                         min_size=1, max_size=2)
        try:
            queued = await LeaseManager(pool).enqueue_run("dsn-forms", {"n": 1})
            assert await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                       queued.run_id) == "pending"
        finally:
            await pool.close()

    async def test_an_app_opens_its_pool_from_it(self, database_dsn, pool):
        app = App(keyword_multi_host(database_dsn))

        @app.deployment("dsn-forms-app")
        async def handler(run: Any) -> None: ...

        async with app:
            queued = await handler.enqueue()
        assert await pool.fetchval("SELECT deployment_ref FROM zeroth.runs WHERE run_id = $1",
                                   queued.run_id) == "dsn-forms-app"

    async def test_a_worker_listens_and_completes_runs_through_it(self, database_dsn, pool):
        async def handle(ctx: RunContext) -> dict[str, Any]:
            return {"ok": True}

        worker = RunWorker(pool, "dsn-forms-worker", handle,
                           dsn=keyword_multi_host(database_dsn), poll_interval=60.0,
                           orphan_sweep_interval=60.0, shutdown_timeout=2.0)
        await worker.start()
        try:
            assert worker.notifier is not None
            # The LISTEN connection is the worker's own, opened from the DSN.
            await asyncio.wait_for(worker.notifier.connected.wait(), timeout=DEADLINE)
            queued = await LeaseManager(pool).enqueue_run("dsn-forms-worker", {})

            async def completed() -> bool:
                return await pool.fetchval(
                    "SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                    queued.run_id) == "completed"

            await wait_until(completed, "the run to complete", within=DEADLINE)
        finally:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=DEADLINE)
