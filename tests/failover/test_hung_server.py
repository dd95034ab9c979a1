"""A worker whose server hangs: every call it makes is bounded (``RunWorker(call_timeout=…)``).

A primary frozen (SIGSTOP, a paused VM) or cut off by a partition that drops packets keeps its
TCP connections open: a call on them waits for ever, and under Patroni a worker fleet so waited
until the old primary was resumed, seconds after another node had been promoted (issue 35,
docs/dba-guide.md "High availability"). Here the hung host is a PgBouncer frozen with SIGSTOP in
front of the test's server (its clients see what they would see of a frozen server):

* a worker on a two-host DSN whose first host freezes drops the hung connections, finds the
  second host and claims and completes a run there while the first is still frozen;
* a completion whose call gets no answer in time (its commit held on the server) is not
  counted as landed, though it commits later: the worker's repeat is refused by the fence, and
  the run ends exactly once, with the handler's output.

No timed assertions: each waits for its outcome, with a guard far above the bounds asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from failover_support import eventually
from pgbouncer_support import bouncer_process
from prometheus_client import CollectorRegistry
from psycopg.conninfo import conninfo_to_dict

import zeroth_pg
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import CallTimeoutError
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.notify import WAKEUP_CHANNEL, Notifier
from zeroth_pg.testing import libpq_dsn
from zeroth_pg.worker import RunContext, RunWorker
from zeroth_pg.worker._gate import GateState

DEPLOYMENT = "hung-server"
TENANT = "t"


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0] == "T"


@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def _two_poolers(database_dsn: str, pg_server_dsn: str) -> Iterator[tuple[str, int]]:
    """Two PgBouncers in front of the test's server; yields (the worker's DSN naming both,
    the first one first; the first's pid)."""
    params = conninfo_to_dict(libpq_dsn(pg_server_dsn))
    host, port = str(params.get("host") or "/var/run/postgresql"), str(params.get("port") or 5432)
    user = str(params.get("user") or "postgres")
    dbname = str(conninfo_to_dict(libpq_dsn(database_dsn))["dbname"])
    target = f"host={host} port={port}"
    socket_dir = host if host.startswith("/") else None
    with bouncer_process(f"* = {target}", user=user, socket_dir=socket_dir) as (one, first), \
            bouncer_process(f"* = {target}", user=user, socket_dir=socket_dir) as (two, _):
        yield (f"postgresql://{user}@127.0.0.1:{one},127.0.0.1:{two}/{dbname}"
               "?target_session_attrs=read-write", first.pid)


@contextlib.asynccontextmanager
async def _worker(dsn: str, handler: Any, **options: Any) -> AsyncIterator[RunWorker]:
    pool = await zeroth_pg.create_pool(dsn, min_size=2, max_size=4)
    worker = RunWorker(pool, DEPLOYMENT, handler, tenant_id=TENANT, poll_interval=0.1,
                       orphan_sweep_interval=0.5, shutdown_timeout=5.0, **options)
    await worker.start()
    try:
        yield worker
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=120)
        pool.terminate()


async def _status(pool: asyncpg.Pool, run_id: uuid.UUID) -> str:
    return str(await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                   run_id))


class TestAHostThatHangs:
    async def test_the_worker_claims_on_the_next_host_while_the_first_is_still_frozen(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool) -> None:
        lm = LeaseManager(pool)

        async def handler(ctx: RunContext) -> dict[str, Any]:
            return {"n": ctx.payload["n"]}

        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid):
            async with _worker(dsn, handler, call_timeout=1.0):
                before = await lm.enqueue_run(DEPLOYMENT, {"n": 1}, tenant_id=TENANT)
                # Served through the first host: the pool's connections are all there.
                await eventually(lambda: _completed(pool, before.run_id), within=120,
                                 what="the first run completed")
                with _frozen(first_pid):
                    during = await lm.enqueue_run(DEPLOYMENT, {"n": 2}, tenant_id=TENANT)
                    # Without a bound (call_timeout=None) the claim loop waits on the frozen
                    # host until it is continued: this wait gave up at its guard (run by hand,
                    # 2026-12-06).
                    await eventually(lambda: _completed(pool, during.run_id), within=120,
                                     what="a run completed while the first host is frozen")
                    assert _stopped(first_pid)  # so it went through the second host


async def _completed(pool: asyncpg.Pool, run_id: uuid.UUID) -> bool:
    return await _status(pool, run_id) == "completed"


def _holding(name: str, when: str, lock: int) -> str:
    """A table ``public.<name>`` of run ids and an AFTER UPDATE trigger on zeroth.runs that,
    once per listed run, when ``when`` (a condition on OLD and NEW) holds, takes advisory lock
    ``lock`` and so holds the update's commit until the test lets go of it. SECURITY DEFINER,
    no lock_timeout: it runs as the test's owner and waits for as long as the test holds on."""
    return f"""
CREATE TABLE public.{name} (run_id uuid PRIMARY KEY);
CREATE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog SET lock_timeout = 0 AS $$
BEGIN
    IF {when} THEN
        DELETE FROM public.{name} WHERE run_id = NEW.run_id;
        IF FOUND THEN
            PERFORM pg_advisory_xact_lock({lock});
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER {name} AFTER UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION public.{name}();
"""


#: Holds an update that completes a run (until the test lets go of advisory lock 35) once per
#: row of hold_completion, so that the completion's answer comes long after the worker's bound:
#: its write is done, its commit waits. The trigger function waits without lock_timeout (the
#: completion's own 2 s would end the wait), as the test's owner (the worker's role may not
#: touch the table).
_HOLD = _holding(
    "hold_completion",
    "NEW.status::text = 'completed' AND OLD.status::text <> 'completed'", 35)


class TestACompletionThatHangs:
    async def test_it_is_not_counted_as_landed_and_the_run_ends_once(
            self, database_dsn: str, pool: asyncpg.Pool,
            caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.WARNING)
        await pool.execute(_HOLD)
        metrics = WorkerMetrics.create(CollectorRegistry())
        lm = LeaseManager(pool)
        holder = await asyncpg.connect(database_dsn)
        try:
            await holder.execute("SELECT pg_advisory_lock(35)")

            async def handler(ctx: RunContext) -> dict[str, Any]:
                return {"answer": 42}

            queued = await lm.enqueue_run(DEPLOYMENT, {}, tenant_id=TENANT)
            await pool.execute("INSERT INTO public.hold_completion VALUES ($1)", queued.run_id)
            async with _worker(database_dsn, handler, call_timeout=0.5, lease_duration=60.0,
                               metrics=metrics):
                # The completion is written and waits to commit; the worker's call gives up.
                await eventually(lambda: _timed_out(caplog), within=120,
                                 what="a completion call timed out")
                assert await _status(pool, queued.run_id) == "running"
                await holder.execute("SELECT pg_advisory_unlock(35)")
                # The held completion commits; the worker's repeat is refused by the fence:
                # an outcome whose first try had no answer, counted as unknown, not as a lease
                # lost (the lease was never lost: the worker's own completion ended it).
                await eventually(lambda: _counted(metrics.outcomes_unknown), within=120,
                                 what="the repeated completion refused")
                completed = metrics.runs_completed.labels(DEPLOYMENT)._value.get()
                assert completed == 0, "a completion without an answer was counted as landed"
                assert metrics.lease_lost.labels(DEPLOYMENT)._value.get() == 0
                assert metrics.fencing_rejected.labels(DEPLOYMENT)._value.get() == 0
        finally:
            await holder.close()
        row = await pool.fetchrow("SELECT status::text AS status, output::text AS output,"
                                  " attempts FROM zeroth.runs WHERE run_id = $1", queued.run_id)
        assert (row["status"], row["output"], row["attempts"]) == ("completed",
                                                                    '{"answer": 42}', 1)
        assert not await pool.fetchval("SELECT count(*) FROM public.hold_completion")


async def _timed_out(caplog: pytest.LogCaptureFixture) -> bool:
    return any("got no answer within" in r.getMessage() and "complet" in r.getMessage()
               for r in caplog.records)


async def _counted(counter: Any) -> bool:
    return bool(counter.labels(DEPLOYMENT)._value.get() >= 1)


def test_call_timeout_error_is_a_lost_connection() -> None:
    from zeroth_pg.errors import ConnectionLostError, RetryableError
    assert issubclass(CallTimeoutError, ConnectionLostError)
    assert issubclass(CallTimeoutError, RetryableError)


class TestALeaseManagerCallOnAFrozenHost:
    async def test_it_raises_call_timeout_and_the_pool_serves_again_once_thawed(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid):
            only_first = dsn[:dsn.index(",")] + dsn[dsn.index("/", dsn.index(",")):]
            async with zeroth_pg.create_pool(only_first, min_size=2, max_size=2) as pool:
                lm = LeaseManager(pool, call_timeout=0.5)
                assert await lm.count_pending(DEPLOYMENT, tenant_id=TENANT) == 0
                with _frozen(first_pid):
                    # A pooled connection: its query hangs, the connection is terminated.
                    with pytest.raises(CallTimeoutError, match="no answer within"):
                        await asyncio.wait_for(lm.count_pending(DEPLOYMENT, tenant_id=TENANT),
                                               timeout=120)  # a guard, far above the bound
                    # The pool's other connections were expired: a new one hangs at login.
                    with pytest.raises(CallTimeoutError, match="no connection of the pool"):
                        await asyncio.wait_for(lm.count_pending(DEPLOYMENT, tenant_id=TENANT),
                                               timeout=120)
                assert await eventually(
                    lambda: _answers(lm), within=120, what="the pool serving again")


async def _answers(lm: LeaseManager) -> bool:
    return await lm.count_pending(DEPLOYMENT, tenant_id=TENANT) == 0


class TestTcpKeepalives:
    """The second line, for a partition that drops packets: every TCP connection zeroth_pg
    opens has keepalives and TCP_USER_TIMEOUT set (asyncpg has no option for them)."""

    @pytest.mark.parametrize("hosts", [1, 2])
    async def test_connections_and_pool_connections_have_them(
            self, database_dsn: str, pg_server_dsn: str, hosts: int) -> None:
        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, _):
            if hosts == 1:  # one host: asyncpg's own connect, no writable-server check
                dsn = dsn.replace(dsn[dsn.index(","):dsn.index("/", dsn.index(","))], "")
                dsn = dsn.replace("?target_session_attrs=read-write", "")
            conn = await zeroth_pg.connect(dsn)
            try:
                _check_keepalive(conn._transport.get_extra_info("socket"))
                async with zeroth_pg.create_pool(dsn, min_size=1, max_size=1) as pool, \
                        pool.acquire() as pooled:
                    _check_keepalive(pooled._con._transport.get_extra_info("socket"))
            finally:
                await conn.close()


def _check_keepalive(sock: Any) -> None:
    assert sock.family == socket.AF_INET
    assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10


class TestACallAbandonedBehindALock:
    """A server that is only slow, or a DBA's lock (LOCK TABLE … IN SHARE MODE: what a CREATE
    INDEX without CONCURRENTLY holds): the bound abandons the call, and the server must abandon
    it too, or the claim commits later and leases its runs to a worker that never heard of
    them, while each retry adds another waiting backend."""

    APP = "bound-behind-a-lock"

    async def _waiting(self, pool: asyncpg.Pool) -> int:
        return int(await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
            "   AND wait_event_type = 'Lock'", self.APP))

    async def test_the_abandoned_claim_ends_on_the_server_and_leases_nothing(
            self, database_dsn: str, pool: asyncpg.Pool) -> None:
        lm = LeaseManager(pool)
        ids = [(await lm.enqueue_run(DEPLOYMENT, {"n": n}, tenant_id=TENANT)).run_id
               for n in range(4)]
        bounded_pool = await zeroth_pg.create_pool(
            database_dsn, min_size=1, max_size=2,
            server_settings={"application_name": self.APP})
        dba = await asyncpg.connect(database_dsn)
        try:
            bounded = LeaseManager(bounded_pool, 30.0, call_timeout=0.5)
            await dba.execute("BEGIN; LOCK TABLE zeroth.runs IN SHARE MODE")
            with pytest.raises(CallTimeoutError):
                await bounded.claim_and_start(DEPLOYMENT, "w-bound", tenant_id=TENANT,
                                              batch_size=4)
            # The server ends the abandoned claim (client_connection_check_interval, set by
            # zeroth_pg.create_pool) while the lock is still held: no backend of it waits on.
            await eventually(lambda: self._waiting_none(pool), what="the abandoned claim's end")
            await dba.execute("COMMIT")
            statuses = await pool.fetch(
                "SELECT status::text AS status, lease_worker_id FROM zeroth.runs"
                " WHERE run_id = ANY($1::uuid[])", ids)
            assert [(r["status"], r["lease_worker_id"]) for r in statuses] == \
                [("pending", None)] * 4
        finally:
            await dba.close()
            bounded_pool.terminate()

    async def _waiting_none(self, pool: asyncpg.Pool) -> bool:
        return await self._waiting(pool) == 0


async def test_a_handlers_own_calls_are_not_bounded_by_the_workers_call_timeout(
        database_dsn: str, pool: asyncpg.Pool) -> None:
    # A handler told that its checkpoint timed out would take it as unwritten, yet the
    # abandoned call may still commit: the handler's writes wait as without the bound (here
    # behind an operator's open UPDATE of the run's row, held for several bounds).
    lm = LeaseManager(pool)
    queued = await lm.enqueue_run(DEPLOYMENT, {}, tenant_id=TENANT)
    started, go = asyncio.Event(), asyncio.Event()
    failures: list[str] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        started.set()
        await go.wait()
        try:
            await ctx.checkpoint({"attempt": ctx.attempt})
        except Exception as exc:
            failures.append(type(exc).__name__)
            raise
        return {"attempt": ctx.attempt}

    operator = await asyncpg.connect(database_dsn)
    async with _worker(database_dsn, handler, call_timeout=0.5, lease_duration=30.0):
        try:
            await asyncio.wait_for(started.wait(), 120)
            await operator.execute("BEGIN")
            await operator.execute(
                "UPDATE zeroth.runs SET metadata = metadata WHERE run_id = $1", queued.run_id)
            go.set()
            await asyncio.sleep(2.0)  # four bounds
            await operator.execute("COMMIT")
            await eventually(lambda: _completed(pool, queued.run_id), what="the completion")
        finally:
            await operator.close()
    row = await pool.fetchrow(
        "SELECT attempts, output, (SELECT count(*) FROM zeroth.checkpoints c"
        " WHERE c.run_id = r.run_id) AS checkpoints FROM zeroth.runs r WHERE run_id = $1",
        queued.run_id)
    assert failures == []
    assert (row["attempts"], row["checkpoints"]) == (1, 1)


class TestAFailedClaimPass:
    """A claim pass that fails — its connection lost to a failover, or no server taking
    connections yet — is tried again after a short backoff (50 ms doubling up to 1 s), not a
    poll interval later: through a PgBouncer per node, a Patroni switchover's first claim on the
    promoted node came up to 1.56 s after the promotion (issue 35, docs/ha-measurements.md)."""

    async def test_the_worker_claims_as_soon_as_the_server_takes_connections_again(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool,
            caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.ERROR, logger="zeroth_pg.worker")
        lm = LeaseManager(pool)
        queued = await lm.enqueue_run(DEPLOYMENT, {"n": 1}, tenant_id=TENANT)
        dbname = str(conninfo_to_dict(libpq_dsn(database_dsn))["dbname"])
        dba = await zeroth_pg.connect(pg_server_dsn)  # another database: it may disallow this one
        # No connection of the worker's pool exists yet: its first pass must open one.
        worker_pool = await zeroth_pg.create_pool(database_dsn, min_size=0, max_size=2)

        async def handler(ctx: RunContext) -> dict[str, Any]:
            return {"n": ctx.payload["n"]}

        # A poll and a sweep interval of an hour and no listener: only the retry of the failed
        # pass can find the run within the test's guard.
        worker = RunWorker(worker_pool, DEPLOYMENT, handler, tenant_id=TENANT,
                           poll_interval=3600, orphan_sweep_interval=3600, shutdown_timeout=5.0)
        try:
            await dba.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
            await worker.start()
            await eventually(lambda: _claim_failed(caplog), within=120,
                             what="a failed claim pass")
            await dba.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            await eventually(lambda: _completed(pool, queued.run_id), within=120,
                             what="the run completed after the server took connections again")
        finally:
            await dba.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            await dba.close()
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=120)
            worker_pool.terminate()


async def _claim_failed(caplog: pytest.LogCaptureFixture) -> bool:
    return any("claim pass failed" in r.getMessage() for r in caplog.records)


def _one_host(dsn: str, which: int) -> str:
    """The two-host DSN of _two_poolers with only its first (0) or second (1) host."""
    scheme, rest = dsn.split("@", 1)
    hosts, tail = rest.split("/", 1)
    return f"{scheme}@{hosts.split(',')[which]}/{tail}"


class TestAListenerWhoseServerHangs:
    """The Notifier's set-up (the connect, pg_backend_pid(), each LISTEN) is bounded like its
    later statements: a server that accepts the connection and then stops answering would
    otherwise hold the listener's reconnect for ever, and it would never reach the promoted
    node. NOTIFY is a hint: the worker's polling goes on whatever the listener does."""

    async def test_a_server_that_hangs_after_the_connect_does_not_hold_the_reconnect(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool) -> None:
        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid):
            connects = 0

            async def connect(_dsn: str) -> asyncpg.Connection:
                # The first connect lands on the first host, which then freezes: its set-up
                # statements get no answer. Later ones go to the second host.
                nonlocal connects
                connects += 1
                if connects == 1:
                    conn = await zeroth_pg.connect(_one_host(dsn, 0))
                    os.kill(first_pid, signal.SIGSTOP)
                    return conn
                return await zeroth_pg.connect(_one_host(dsn, 1))

            heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
            notifier = Notifier(dsn, on_notification=lambda c, p: heard.put_nowait((c, p)),
                                connect=connect, ping_timeout=0.5, reconnect_min=0.05)
            notifier.start()
            try:
                # Without the bound the first LISTEN set-up waited until the host was
                # continued: this wait gave up at its guard.
                await asyncio.wait_for(notifier.connected.wait(), timeout=120)
                assert _stopped(first_pid)  # still frozen: it listens through the second
                assert connects >= 2
                await pool.execute(f"NOTIFY {WAKEUP_CHANNEL}, 'after-the-hang'")
                assert await asyncio.wait_for(heard.get(), timeout=120) == (
                    WAKEUP_CHANNEL, "after-the-hang")
            finally:
                os.kill(first_pid, signal.SIGCONT)
                await notifier.stop()

    @pytest.mark.parametrize("cut", ["the health ping", "an owner's call"])
    async def test_a_call_that_times_out_drops_the_connection_and_sends_no_cancel(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool, cut: str) -> None:
        """A health ping, or an owner's call on the session (the wakeup gate's), with no answer
        in ``ping_timeout`` terminates the LISTEN connection and the Notifier reconnects: no
        cancel request goes out, which asyncpg would send on a new connection to the same hung
        server (a frozen host's kernel still completes that connection: it waits in the
        listening socket's accept queue, where this test counts it). The control at the end
        shows a cancel request does show there."""
        owners = cut == "an owner's call"
        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid):
            first_port = int(_one_host(dsn, 0).split("@", 1)[1].split("/")[0].split(":")[1])
            connects = 0

            async def connect(_dsn: str) -> asyncpg.Connection:
                nonlocal connects
                connects += 1
                return await zeroth_pg.connect(_one_host(dsn, 0 if connects == 1 else 1))

            heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
            notifier = Notifier(dsn, on_notification=lambda c, p: heard.put_nowait((c, p)),
                                connect=connect, ping_interval=600.0 if owners else 0.2,
                                ping_timeout=0.5, reconnect_min=0.05)
            control = await zeroth_pg.connect(_one_host(dsn, 0))
            notifier.start()
            try:
                await asyncio.wait_for(notifier.connected.wait(), timeout=120)
                assert notifier.connects == 1
                with _frozen(first_pid):
                    if owners:  # no ping comes before this call's bound
                        with pytest.raises(TimeoutError):
                            await notifier.on_session(lambda conn: conn.fetchval("SELECT 1"))
                    await eventually(lambda: _reconnected(notifier), within=120,
                                     what="the listener to reconnect past the frozen host")
                    assert _stopped(first_pid)
                    assert _waiting_to_be_accepted(first_port) == 0  # no cancel request
                    await pool.execute(f"NOTIFY {WAKEUP_CHANNEL}, 'after-the-ping'")
                    assert await asyncio.wait_for(heard.get(), timeout=120) == (
                        WAKEUP_CHANNEL, "after-the-ping")
                    # The control: asyncpg's own timeout sends a cancel request, and the frozen
                    # host's kernel queues its connection.
                    with pytest.raises(TimeoutError):
                        await control.fetchval("SELECT 1", timeout=0.2)
                    await eventually(lambda: _queued(first_port), within=120,
                                     what="the control's cancel request to be queued")
                    control.terminate()
            finally:
                control.terminate()
                await notifier.stop()

    async def test_the_worker_polls_on_while_its_listener_hangs(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool) -> None:
        lm = LeaseManager(pool)

        async def handler(ctx: RunContext) -> dict[str, Any]:
            return {"n": ctx.payload["n"]}

        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid), _frozen(first_pid):
            # The worker's pool reaches the server; its listener only the frozen host.
            worker_pool = await zeroth_pg.create_pool(database_dsn, min_size=1, max_size=2)
            worker = RunWorker(worker_pool, DEPLOYMENT, handler, tenant_id=TENANT,
                               dsn=_one_host(dsn, 0), poll_interval=0.1,
                               orphan_sweep_interval=0.5, shutdown_timeout=5.0)
            await worker.start()
            try:
                queued = await lm.enqueue_run(DEPLOYMENT, {"n": 3}, tenant_id=TENANT)
                await eventually(lambda: _completed(pool, queued.run_id), within=120,
                                 what="a run completed by polling")
                assert worker.notifier is not None
                assert not worker.notifier.connected.is_set()
            finally:
                await asyncio.wait_for(worker.graceful_shutdown(), timeout=120)
                worker_pool.terminate()


    async def test_claims_go_on_when_the_listener_hangs_after_the_gate_was_taken(
            self, database_dsn: str, pg_server_dsn: str, pool: asyncpg.Pool) -> None:
        """The wakeup gate's calls (announce_busy / announce_idle) run on the LISTEN connection
        and the claim loop made them between passes: a listener whose host froze after the
        worker took the gate held the claim loop for the Notifier's whole ping bound (5 s; here
        an hour, so only the claim loop's own bound can let it go on). The claim loop waits for
        the gate a moment at most; the call goes on in the background, bounded by the
        Notifier as before."""
        lm = LeaseManager(pool)

        async def handler(ctx: RunContext) -> dict[str, Any]:
            return {"n": ctx.payload["n"]}

        with _two_poolers(database_dsn, pg_server_dsn) as (dsn, first_pid):
            # The worker's pool reaches the server; its listener the first host only. A fleet
            # worker (no completion carries the next claim), one run at a time: every run
            # needs a claim pass of its own, and each pass lets the gate go (announce_busy).
            worker_pool = await zeroth_pg.create_pool(database_dsn, min_size=1, max_size=2)
            worker = RunWorker(worker_pool, {DEPLOYMENT: handler}, dsn=_one_host(dsn, 0),
                               max_concurrency=1, poll_interval=0.1, orphan_sweep_interval=0.5,
                               shutdown_timeout=5.0)
            await worker.start()
            try:
                notifier = worker.notifier
                assert notifier is not None
                await eventually(lambda: _holds_the_gate(worker), within=120,
                                 what="the idle worker to hold its wakeup gate")
                notifier.ping_timeout = 3600.0
                with _frozen(first_pid):
                    queued = [await lm.enqueue_run(DEPLOYMENT, {"n": n}, tenant_id=TENANT)
                              for n in range(3)]
                    # Before, the first pass's announce_busy waited on the frozen listener:
                    # the first run completed, the others stayed pending until the guard.
                    for run in queued:
                        await eventually(lambda run=run: _completed(pool, run.run_id),
                                         within=60, what="a run completed while the "
                                         "listener's host is frozen")
                    assert _stopped(first_pid)
            finally:
                await asyncio.wait_for(worker.graceful_shutdown(), timeout=120)
                worker_pool.terminate()


async def _reconnected(notifier: Notifier) -> bool:
    return notifier.connects >= 2 and notifier.connected.is_set()


def _waiting_to_be_accepted(port: int) -> int:
    """Connections to 127.0.0.1:``port`` that the kernel completed and the listening process
    has not accepted (the rx queue of a listening socket in /proc/net/tcp)."""
    waiting = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "0A" and int(local.split(":")[1], 16) == port:
            waiting += int(queues.split(":")[1], 16)
    return waiting


async def _queued(port: int) -> bool:
    return _waiting_to_be_accepted(port) > 0


async def _holds_the_gate(worker: RunWorker) -> bool:
    return worker._gate.state is GateState.IDLE


#: Holds the claim of each run listed in hold_claim (until the test lets go of advisory lock 36):
#: its lease is written and its commit waits, as a claim held up on a slow or locked server
#: waits after the database read its clock. As the test's owner, like _HOLD.
_HOLD_CLAIM = _holding("hold_claim", "NEW.lease_generation <> OLD.lease_generation", 36)


class TestAClaimHeldUpPastItsLease:
    """A claim fixes its lease from the database clock when the call begins (``_claim_pending``
    reads it before anything can wait), so a claim held up on the server after that — here its
    commit held on an advisory lock by a trigger — commits a lease that is shorter from the
    commit on, and can have run out already. The worker's own estimate counts from the moment
    it *sent* the call, before the database read its clock, so it is never later than the
    database's expiry; and a run whose claim was answered after that estimate is never started
    (who could break it: a worker whose lease ran out while its claim waited — its handler would
    run beside the run's next holder)."""

    APP = "claim-held-past-its-lease"
    LEASE = 1.0

    async def _claim_waits(self, pool: asyncpg.Pool) -> bool:
        return bool(await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1"
            "   AND wait_event_type = 'Lock'", self.APP))

    async def _hold(self, pool: asyncpg.Pool, run_id: uuid.UUID,
                    holder: asyncpg.Connection) -> None:
        await pool.execute(_HOLD_CLAIM)
        await pool.execute("INSERT INTO public.hold_claim VALUES ($1)", run_id)
        await holder.execute("SELECT pg_advisory_lock(36)")

    async def test_the_database_expiry_is_never_earlier_than_the_workers_estimate(
            self, database_dsn: str, pool: asyncpg.Pool) -> None:
        lm = LeaseManager(pool)
        queued = await lm.enqueue_run(DEPLOYMENT, {}, tenant_id=TENANT)
        held_pool = await zeroth_pg.create_pool(
            database_dsn, min_size=1, max_size=1,
            server_settings={"application_name": self.APP})
        holder = await asyncpg.connect(database_dsn)
        try:
            await self._hold(pool, queued.run_id, holder)
            claimer = LeaseManager(held_pool, self.LEASE)
            # The worker's estimate: its send time (wall clock: the test's server is on this
            # machine, on the same clock) plus the lease it asked for.
            sent = time.time()
            claim = asyncio.create_task(claimer.claim_and_start(DEPLOYMENT, "w-held",
                                                                tenant_id=TENANT))
            await eventually(lambda: self._claim_waits(pool), what="the claim waiting")
            await asyncio.sleep(self.LEASE + 0.5)  # held past the lease it granted
            await holder.execute("SELECT pg_advisory_unlock(36)")
            claimed = await asyncio.wait_for(claim, timeout=120)
            answered = time.time()
        finally:
            await holder.close()
            held_pool.terminate()
        assert claimed is not None
        assert claimed.run_id == queued.run_id
        expires = (await pool.fetchval("SELECT lease_expires_at FROM zeroth.runs"
                                       " WHERE run_id = $1", queued.run_id)).timestamp()
        assert expires >= sent + self.LEASE  # the estimate is conservative
        assert expires < answered  # and the lease had run out before the answer came

    async def test_the_worker_never_starts_a_run_whose_claim_came_back_after_its_lease(
            self, database_dsn: str, pool: asyncpg.Pool) -> None:
        lm = LeaseManager(pool)
        started: list[int] = []

        async def handler(ctx: RunContext) -> dict[str, Any]:
            started.append(ctx.lease_generation)
            return {}

        queued = await lm.enqueue_run(DEPLOYMENT, {}, tenant_id=TENANT)
        metrics = WorkerMetrics.create(CollectorRegistry())
        worker_pool = await zeroth_pg.create_pool(
            database_dsn, min_size=1, max_size=2,
            server_settings={"application_name": self.APP})
        # No orphan sweep in the test's time: the run stays where the held claim leaves it.
        worker = RunWorker(worker_pool, DEPLOYMENT, handler, tenant_id=TENANT,
                           lease_duration=self.LEASE, poll_interval=0.05,
                           orphan_sweep_interval=3600, shutdown_timeout=5.0, call_timeout=None,
                           metrics=metrics)
        holder = await asyncpg.connect(database_dsn)
        try:
            await self._hold(pool, queued.run_id, holder)
            await worker.start()
            await eventually(lambda: self._claim_waits(pool), what="the claim waiting")
            await asyncio.sleep(self.LEASE + 0.5)
            await holder.execute("SELECT pg_advisory_unlock(36)")
            # The claim committed a lease that had run out: the worker drops the run unstarted
            # (a lost lease) and writes nothing for it.
            await eventually(lambda: _counted(metrics.lease_lost), what="the run dropped")
            row = await pool.fetchrow("SELECT status::text AS status,"
                                      " lease_expires_at < clock_timestamp() AS expired"
                                      " FROM zeroth.runs WHERE run_id = $1", queued.run_id)
        finally:
            await holder.close()
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=120)
            worker_pool.terminate()
        assert (row["status"], row["expired"]) == ("running", True)
        assert started == []
        assert metrics.runs_started.labels(DEPLOYMENT)._value.get() == 0
