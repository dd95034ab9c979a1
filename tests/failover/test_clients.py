"""Clients follow the primary: a multi-host DSN, and a failover under a live client, listener
and command line (docs/dba-guide.md, "High availability").

The DSN names both servers with ``target_session_attrs=read-write``; after the primary is
SIGKILLed and the standby promoted, the same pool, Notifier and CLI reach the promoted server
without a restart. A call that was in flight fails with a retryable error; repeating it lands.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import asyncpg
import pytest
from failover_support import eventually, retrying
from psycopg.conninfo import conninfo_to_dict
from replication import ReplicatedPair

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import RetryableError
from zeroth_pg.notify import WAKEUP_CHANNEL, Notifier
from zeroth_pg.testing import with_database

MULTI_HOST = ("postgresql://u@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write"
              "&sslmode=prefer")


class TestMultiHostDsn:
    def test_with_database_keeps_every_host(self) -> None:
        assert with_database(MULTI_HOST, "other") == (
            "postgresql://u@10.0.0.1:5432,10.0.0.2:5433/other"
            "?target_session_attrs=read-write&sslmode=prefer")

    def test_with_database_keeps_every_host_of_a_keyword_dsn(self) -> None:
        dsn = "host=10.0.0.1,10.0.0.2 port=5432,5433 dbname=app target_session_attrs=read-write"
        assert conninfo_to_dict(with_database(dsn, "other")) == {
            "host": "10.0.0.1,10.0.0.2", "port": "5432,5433", "dbname": "other",
            "target_session_attrs": "read-write"}


class TestReadOnlyServer:
    async def test_a_write_on_a_read_only_server_is_retryable(self, database_dsn: str) -> None:
        """What a write meets on a standby, or on a demoted primary: 25006, retryable (the
        worker repeats it until its lease deadline instead of failing the run)."""
        conn = await asyncpg.connect(
            database_dsn, server_settings={"default_transaction_read_only": "on"})
        try:
            with pytest.raises(RetryableError) as raised:
                await LeaseManager(conn).enqueue_run("failover-ro", {})  # type: ignore[arg-type]
        finally:
            await conn.close()
        assert raised.value.code == "25006"

    async def test_the_standby_refuses_writes_retryably(
            self, sync_pair: tuple[ReplicatedPair, str]) -> None:
        pair, _dsn = sync_pair
        conn = await asyncpg.connect(pair.standby.dsn("zeroth"))
        try:
            with pytest.raises(RetryableError) as raised:
                await LeaseManager(conn).enqueue_run("failover-ro", {})  # type: ignore[arg-type]
        finally:
            await conn.close()
        assert raised.value.code == "25006"


class TestFailover:
    async def test_pool_listener_and_cli_follow_the_promoted_standby(
            self, sync_pair: tuple[ReplicatedPair, str]) -> None:
        pair, dsn = sync_pair
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
        connects: list[int] = []
        heard: asyncio.Queue[str] = asyncio.Queue()
        notifier = Notifier(dsn, on_notification=lambda _channel, payload: heard.put_nowait(
            payload), on_connect=lambda: connects.append(1), ping_interval=0.5,
            ping_timeout=2.0, reconnect_max=0.5)
        notifier.start()
        try:
            client = LeaseManager(pool)
            before = await client.enqueue_run("failover", {"n": 1}, tenant_id="t")
            await eventually(lambda: asyncio.sleep(0, notifier.connected.is_set()),
                             what="the listener connects")
            assert pool.get_size() == 2
            on_primary = await pool.fetchval("SELECT inet_server_port()")
            assert on_primary == pair.primary.port

            await asyncio.to_thread(pair.failover)

            # The pooled connections were to the dead primary: the first call on each fails
            # retryably, then the pool reconnects through the DSN, to the promoted standby.
            after = await retrying(lambda: client.enqueue_run("failover", {"n": 2},
                                                              tenant_id="t"))
            assert await retrying(lambda: pool.fetchval("SELECT inet_server_port()")) == (
                pair.standby.port)
            # Synchronous replication: the run acknowledged before the kill is there.
            ids = {row["run_id"] for row in await retrying(lambda: pool.fetch(
                "SELECT r.run_id FROM zeroth.runs r"))}
            assert {before.run_id, after.run_id} <= ids

            # The listener reconnected by itself (on_connect: the worker re-polls there) and
            # hears notifications sent on the new primary.
            await eventually(lambda: asyncio.sleep(0, len(connects) >= 2),
                             what="the listener reconnects")
            await eventually(lambda: asyncio.sleep(0, notifier.connected.is_set()),
                             what="the listener is connected again")
            await retrying(lambda: pool.execute(
                "SELECT pg_notify($1, 'after-failover')", WAKEUP_CHANNEL))
            assert await asyncio.wait_for(heard.get(), timeout=60) == "after-failover"
        finally:
            await notifier.stop()
            await pool.close()

        # The command line takes the same DSN; its first host is dead now.
        shown = await asyncio.to_thread(subprocess.run, [
            sys.executable, "-m", "zeroth_pg.cli", "runs", "show", str(before.run_id),
            "--dsn", dsn, "--json"], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert str(before.run_id) in json.dumps(json.loads(shown.stdout))
