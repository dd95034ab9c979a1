"""Through PgBouncer in transaction pooling mode (Debian ``pgbouncer``, started here on a
loopback port in front of the test server): the lease protocol works with asyncpg's statement
cache off, a RunWorker completes runs, and the listener warns that it sits behind a pooler and
stops for good once it sees its statements land on another backend.

Skipped, with the reason printed, only when no pgbouncer binary is installed (.ci/run installs
it). The pool is two server connections, so multiplexing is certain and observable.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import asyncpg
import pytest
from pgbouncer_support import bouncer
from psycopg.conninfo import conninfo_to_dict

from zeroth_pg import LeaseManager, RunWorker
from zeroth_pg.notify import Notifier
from zeroth_pg.testing import libpq_dsn

SERVER_CONNECTIONS = 2


@dataclass(frozen=True, slots=True)
class Bouncer:
    port: int
    user: str
    password: str | None

    def dsn(self, database_dsn: str) -> str:
        """``database_dsn``'s database, reached through PgBouncer."""
        dbname = conninfo_to_dict(libpq_dsn(database_dsn))["dbname"]
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}"
                                            if self.password else "")
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"


@contextlib.contextmanager
def start_pgbouncer(admin_dsn: str) -> Iterator[Bouncer]:
    """A transaction-pooling PgBouncer in front of the test server (tests/pgbouncer_support.py)."""
    server = conninfo_to_dict(libpq_dsn(admin_dsn))
    host = str(server.get("host") or "/var/run/postgresql")
    user = str(server.get("user") or getpass.getuser())
    password = server.get("password")
    target = f"host={host} port={server.get('port') or 5432}"
    if password:
        target += f" user={user} password={password}"
    with bouncer(f"* = {target}", user=user, socket_dir=host if host.startswith("/") else None,
                 pool_mode="transaction", pool_size=SERVER_CONNECTIONS,
                 max_client_conn=200) as port:
        yield Bouncer(port, user, str(password) if password else None)


@pytest.fixture(scope="module")
def pgbouncer(pg_server_dsn: str) -> Iterator[Bouncer]:
    with start_pgbouncer(pg_server_dsn) as running:
        yield running


@pytest.fixture
async def bounced_pool(pgbouncer, database_dsn):
    """An asyncpg pool of 6 client connections through PgBouncer, statement cache off (named
    prepared statements cannot survive transaction pooling before PgBouncer 1.21)."""
    pool = await asyncpg.create_pool(pgbouncer.dsn(database_dsn), min_size=6, max_size=6,
                                     statement_cache_size=0)
    try:
        yield pool
    finally:
        await pool.close()


async def wait_for(predicate, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class TestTransactionPooling:
    async def test_client_connections_share_the_few_server_connections(self, bounced_pool):
        # The premise of every other test here: statements of one client land on any backend.
        async def backend_pids() -> set[int]:
            async with bounced_pool.acquire() as conn:
                return {await conn.fetchval("SELECT pg_backend_pid()") for _ in range(5)}

        seen = set().union(*await asyncio.gather(*(backend_pids() for _ in range(6))))
        assert 1 <= len(seen) <= SERVER_CONNECTIONS

    async def test_claim_renew_commit_complete_through_the_pooler(self, bounced_pool,
                                                                 database_dsn):
        lm = LeaseManager(bounced_pool, lease_duration_seconds=30)
        runs = 40
        enqueued = await lm.enqueue_runs("bounced", [{"payload": {"n": n}} for n in range(runs)])

        async def worker(n: int) -> None:
            worker_id = f"w{n}"
            for _attempt in range(200):  # SKIP LOCKED may pass over rows other claims hold
                claim = await lm.claim_pending_result("bounced", worker_id)
                if claim.runs:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"{worker_id} never claimed a run")
            run_id, fence = claim.run_id, {"generation": claim.runs[0].lease_generation}
            assert await lm.renew_lease(run_id, worker_id, **fence)
            assert await lm.start_run(run_id, worker_id, **fence)
            assert await lm.save_checkpoint(run_id, worker_id, {"n": n}, **fence)
            assert await lm.commit_fenced(run_id, worker_id, progress={"done": True}, **fence)
            assert await lm.complete_run(run_id, worker_id, output={"n": n}, **fence)

        await asyncio.gather(*(worker(n) for n in range(runs)))
        direct = await asyncpg.connect(database_dsn)
        try:
            rows = await direct.fetch(
                """SELECT r.run_id, r.status::text AS status, r.progress::text AS progress,
                          (SELECT count(*) FROM zeroth.checkpoints c
                            WHERE c.run_id = r.run_id) AS checkpoints
                     FROM zeroth.runs r WHERE r.deployment_ref = 'bounced'""")
        finally:
            await direct.close()
        assert {row["run_id"] for row in rows} == {run.run_id for run in enqueued}
        assert {(row["status"], row["progress"], row["checkpoints"]) for row in rows} == {
            ("completed", '{"done": true}', 1)}

    async def test_a_worker_completes_runs_and_warns_about_its_listener(
            self, bounced_pool, pgbouncer, database_dsn, caplog):
        async def handler(ctx):
            await ctx.checkpoint({"step": 1})
            await asyncio.sleep(0.5)  # outlives a renewal interval (lease 1 s, renewed each 1/3)
            await ctx.progress({"step": 2})
            return {"ok": True}

        lm = LeaseManager(bounced_pool)
        await lm.enqueue_runs("bounced-worker", [{} for _ in range(8)])
        worker = RunWorker(bounced_pool, "bounced-worker", handler,
                           dsn=pgbouncer.dsn(database_dsn), max_concurrency=4,
                           poll_interval=0.1, lease_duration=1.0)
        caplog.set_level(logging.WARNING, logger="zeroth_pg.notify")
        direct = await asyncpg.connect(database_dsn)
        await worker.start()
        try:
            await wait_for(lambda: direct.fetchval(
                """SELECT count(*) = 8 FROM zeroth.runs r
                    WHERE r.deployment_ref = 'bounced-worker' AND r.status = 'completed'"""),
                "8 completed runs")
            notifier = worker.notifier
            assert notifier is not None

            async def detected() -> bool:  # it may also refuse at once: the pool is busy
                return notifier.behind_pooler

            await wait_for(detected, "the listener to connect")
        finally:
            await worker.graceful_shutdown()
            await direct.close()
        assert any("connection pooler" in record.getMessage() for record in caplog.records)


class TestListenerBehindThePooler:
    async def test_listener_stops_once_its_connection_moves_to_another_backend(
            self, pgbouncer, database_dsn, caplog):
        # database_dsn is new, so PgBouncer's pool for it starts empty: the listener's statements
        # all run on the one server connection A; the holder's transaction then takes A, and the
        # next health ping must open B.
        dsn = pgbouncer.dsn(database_dsn)
        caplog.set_level(logging.WARNING, logger="zeroth_pg.notify")
        notifier = Notifier(dsn, on_notification=lambda _c, _p: None, ping_interval=0.05)
        notifier.start()
        holder = await asyncpg.connect(dsn, statement_cache_size=0)
        try:
            await asyncio.wait_for(notifier.connected.wait(), timeout=10)
            assert (notifier.behind_pooler, notifier.refused) == (True, None)
            async with holder.transaction():
                assert await holder.fetchval("SELECT pg_backend_pid()") == notifier.backend_pid

                async def refused() -> bool:
                    return notifier.refused is not None

                await wait_for(refused, "the listener to refuse")
            # refused is set before the task closes its connection and returns: wait for the end.
            assert notifier._task is not None
            task = notifier._task

            async def ended() -> bool:
                return task.done()

            await wait_for(ended, "the listener task to end")
            assert not notifier.connected.is_set()
        finally:
            await notifier.stop()
            await holder.close()
        assert "transaction-mode pooler" in (notifier.refused or "")
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert errors
        assert "transaction-mode pooler" in errors[0].getMessage()

    async def test_a_direct_listener_is_not_taken_for_a_pooler(self, database_dsn, caplog):
        caplog.set_level(logging.WARNING, logger="zeroth_pg.notify")
        notifier = Notifier(database_dsn, on_notification=lambda _c, _p: None,
                            ping_interval=0.05)
        notifier.start()
        try:
            await asyncio.wait_for(notifier.connected.wait(), timeout=10)
            await asyncio.sleep(0.3)  # several health pings
            assert (notifier.behind_pooler, notifier.refused) == (False, None)
            assert notifier.connected.is_set()
        finally:
            await notifier.stop()
        assert [r.getMessage() for r in caplog.records] == []
