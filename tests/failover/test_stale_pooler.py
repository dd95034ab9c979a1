"""After a failover, clients behind one PgBouncer per server find the new primary by themselves
(zeroth_pg/_connect.py; docs/dba-guide.md, "PgBouncer in front").

A primary and its streaming standby, each behind a session-pooling PgBouncer that has served a
client (so each cached its server's role at that time: the standby's says
``in_hot_standby = on``). The primary is killed and the standby promoted; no PgBouncer is
restarted. The clients' DSN names both PgBouncers, the old primary's first, with
``target_session_attrs=read-write``. asyncpg trusts the cached values: the dead primary's
PgBouncer still says "read-write" (it answers the startup itself) and the promoted standby's
still says "standby", so no write ever lands. zeroth_pg's pools and connections ask each server
and write on the promoted one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from failover_support import DATABASE, eventually
from pgbouncer_support import bouncer, pgbouncer_executable
from replication import ReplicatedPair

import zeroth_pg
from zeroth_pg import App, _connect, asyncpg_dsn
from zeroth_pg.client import LeaseManager

pytestmark = [pytest.mark.failover, pytest.mark.slow, pytest.mark.dedicated_server]

DEPLOYMENT = "stale-pooler"


def test_after_a_failover_the_clients_leave_the_poolers_that_report_stale_roles(
        sync_pair: tuple[ReplicatedPair, str]) -> None:
    pgbouncer_executable()
    pair, _dsn = sync_pair
    with bouncer(f"* = host=127.0.0.1 port={pair.primary.port}", user="postgres") as old, \
            bouncer(f"* = host=127.0.0.1 port={pair.standby.port}", user="postgres") as new:
        for port, hot_standby in ((old, "off"), (new, "on")):
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}") as conn:
                assert conn.info.parameter_status("in_hot_standby") == hot_standby
        pair.failover()
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{new}/{DATABASE}",
                             autocommit=True) as conn:
            # The premise: the promoted server's PgBouncer still reports a standby.
            assert conn.info.parameter_status("in_hot_standby") == "on"
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        dsn = (f"postgresql://postgres@127.0.0.1:{old},127.0.0.1:{new}/{DATABASE}"
               "?target_session_attrs=read-write")

        async def scenario() -> dict[str, Any]:
            async with App(dsn, pool_size=2) as app:
                pool = await app.open()

                async def enqueued() -> Any:
                    return await LeaseManager(pool).enqueue_run(DEPLOYMENT, {})

                # Far above what a loaded machine needs: without the check no write lands ever.
                queued = await eventually(enqueued, within=60, what="a write through the App")
                return dict(await pool.fetchrow(
                    "SELECT pg_is_in_recovery() AS in_recovery, inet_server_port() AS port,"
                    " (SELECT status::text FROM zeroth.runs WHERE run_id = $1) AS status",
                    queued.run_id))

        found = asyncio.run(scenario())
    assert found == {"in_recovery": False, "port": pair.standby.port, "status": "pending"}


def test_a_client_waiting_out_a_long_pause_connects_to_the_standby_once_it_is_promoted(
        sync_pair: tuple[ReplicatedPair, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Every host a standby for long (here the DSN names only the standby, behind its PgBouncer)
    # grew the shared pause between passes (up to 5 s in production; an hour here, so that only
    # the promotion can end it). The standby the last pass found in recovery is asked again
    # during the pause: its promotion ends the pause, and the caller connects to it then, not
    # at the end of the pause (the first claims after a switchover through PgBouncer came
    # 1.9-2.4 s after the promotion, issue 35, where the servers' own DSN saw 0.2-0.8 s).
    pgbouncer_executable()
    pair, _dsn = sync_pair
    with bouncer(f"* = host=127.0.0.1 port={pair.standby.port}", user="postgres") as port:
        dsn = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}?target_session_attrs=read-write"

        async def scenario() -> tuple[bool, int]:
            state = _connect._Hosts("read-write", pause=3600.0)
            monkeypatch.setitem(_connect._CONNECT_STATES,
                                (asyncpg_dsn(dsn), "read-write", "None", "None"), state)
            connecting = asyncio.create_task(zeroth_pg.connect(dsn))
            try:
                while state.quiet_until < time.monotonic() + 600:  # the hour's pause began
                    assert not connecting.done(), connecting
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(pair.failover)
                # A guard against waiting out the hour, not a speed assertion.
                conn = await asyncio.wait_for(asyncio.shield(connecting), 120)
            finally:
                connecting.cancel()
            try:
                row = await conn.fetchrow("SELECT pg_is_in_recovery() AS in_recovery,"
                                          " inet_server_port() AS port")
                assert row is not None
                return row["in_recovery"], row["port"]
            finally:
                await conn.close()

        assert asyncio.run(scenario()) == (False, pair.standby.port)
