"""A client that asks for a writable server gets one by the server's own answer, not by what a
pooler in front of it reports (zeroth_pg/_connect.py; docs/dba-guide.md, "PgBouncer in front").

PgBouncer (1.18) hands every client the startup parameters of the first server connection of
its pool, cached: ``default_transaction_read_only`` and ``in_hot_standby`` among them. Here the
first of two PgBouncers maps the test's database to a second copy of it that becomes read-only
after the PgBouncer cached "read-write" (``ALTER DATABASE … SET default_transaction_read_only``:
what a demoted primary's PgBouncer reports after a switchover, in miniature); the second PgBouncer
reaches the database itself. A multi-host DSN with ``target_session_attrs=read-write`` names the
stale one first. asyncpg trusts the reported values and stays on the read-only copy, every write
refused with 25006; zeroth_pg's pools and connections ask the server and go on to the writable
one. Then a pooled connection that a write finds read-only is not kept. Skipped, with the reason
printed, only when no pgbouncer binary is installed (.ci/run installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import psycopg
import pytest
from pgbouncer_support import bouncer
from psycopg.conninfo import conninfo_to_dict

import zeroth_pg
from zeroth_pg import App, _connect, migrate
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import RetryableError
from zeroth_pg.testing import libpq_dsn
from zeroth_pg.worker import skip_reset

DEPLOYMENT = "writable-server"


@dataclass(frozen=True, slots=True)
class Server:
    host: str
    port: str
    user: str


def _server(dsn: str) -> Server:
    params = conninfo_to_dict(libpq_dsn(dsn))
    return Server(str(params.get("host") or "/var/run/postgresql"),
                  str(params.get("port") or 5432), str(params.get("user") or "postgres"))


@dataclass(frozen=True, slots=True)
class StaleBouncer:
    """The test database ``dbname`` behind two PgBouncers: ``stale_port`` reaches a read-only
    copy while reporting read-write, ``good_port`` the database itself; :attr:`dsn` names both,
    the stale one first, with ``target_session_attrs=read-write``."""

    dbname: str
    copy: str
    user: str
    stale_port: int
    good_port: int

    @property
    def dsn(self) -> str:
        return (f"postgresql://{self.user}@127.0.0.1:{self.stale_port},127.0.0.1:"
                f"{self.good_port}/{self.dbname}?target_session_attrs=read-write")


@pytest.fixture
def stale_bouncer(database_dsn: str, pg_server_dsn: str) -> Iterator[StaleBouncer]:
    server = _server(pg_server_dsn)
    dbname = str(conninfo_to_dict(libpq_dsn(database_dsn))["dbname"])
    copy = f"{dbname}_stale"
    with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{dbname}"')
    target = f"host={server.host} port={server.port}"
    socket_dir = server.host if server.host.startswith("/") else None
    try:
        with bouncer(f"{dbname} = {target} dbname={copy}", user=server.user,
                     socket_dir=socket_dir) as stale, \
                bouncer(f"* = {target}", user=server.user, socket_dir=socket_dir) as good:
            # The stale PgBouncer's pool opens while its server takes writes: it caches
            # default_transaction_read_only = off (and in_hot_standby = off) for every client.
            with psycopg.connect(f"postgresql://{server.user}@127.0.0.1:{stale}/{dbname}",
                                 autocommit=True) as first:
                assert first.info.parameter_status("default_transaction_read_only") == "off"
            with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
                # Then its server stops taking writes (a demoted primary, in miniature), and
                # the server connection PgBouncer keeps from before goes away. The terminate
                # waits until the backend has exited (its timeout argument): without it a test
                # could reach the dying server connection through PgBouncer, whose check then
                # failed as "unreachable" instead of "read-only" (seen once in four runs).
                admin.execute(f'ALTER DATABASE "{copy}" SET default_transaction_read_only = on')
                admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                              " WHERE datname = %s", (copy,))
            yield StaleBouncer(dbname, copy, server.user, stale, good)
    finally:
        with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


async def _landed_in(conn_or_pool: Any) -> tuple[str, str]:
    """Where a write through ``conn_or_pool`` lands: (database, run status)."""
    queued = await LeaseManager(conn_or_pool).enqueue_run(DEPLOYMENT, {})
    found = await conn_or_pool.fetchrow(
        "SELECT current_database() AS db, (SELECT status::text FROM zeroth.runs WHERE run_id"
        " = $1) AS status", queued.run_id)
    return found["db"], found["status"]


class TestAPoolerReportingAStaleRole:
    async def test_the_premise_asyncpg_trusts_the_pooler_and_stays_on_the_read_only_copy(
            self, stale_bouncer: StaleBouncer) -> None:
        conn = await asyncpg.connect(stale_bouncer.dsn)
        try:
            assert await conn.fetchval("SELECT current_database()") == stale_bouncer.copy
            assert conn.get_settings().default_transaction_read_only == "off"  # reported
            assert await conn.fetchval("SHOW transaction_read_only") == "on"  # true
            with pytest.raises(RetryableError) as raised:
                await LeaseManager(conn).enqueue_run(DEPLOYMENT, {})  # type: ignore[arg-type]
            assert raised.value.code == "25006"
        finally:
            await conn.close()

    async def test_an_app_pool_writes_on_the_server_that_takes_writes(
            self, stale_bouncer: StaleBouncer, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.WARNING, logger="zeroth_pg.connect")
        async with App(stale_bouncer.dsn) as app:
            pool = await app.open()
            assert await _landed_in(pool) == (stale_bouncer.dbname, "pending")
        assert any(f"127.0.0.1:{stale_bouncer.stale_port}" in r.getMessage()
                   and "transaction_read_only is on" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]

    async def test_a_lease_manager_pool_of_zeroth_pg_writes_there_too(
            self, stale_bouncer: StaleBouncer) -> None:
        async with zeroth_pg.create_pool(stale_bouncer.dsn, min_size=2, max_size=2) as pool:
            for _ in range(3):  # every connection of the pool, not only the first
                assert await _landed_in(pool) == (stale_bouncer.dbname, "pending")

    async def test_a_single_connection_of_zeroth_pg_writes_there_too(
            self, stale_bouncer: StaleBouncer) -> None:
        conn = await zeroth_pg.connect(stale_bouncer.dsn)
        try:
            assert await _landed_in(conn) == (stale_bouncer.dbname, "pending")
        finally:
            await conn.close()

    async def test_with_no_writable_host_it_gives_up_with_a_retryable_error(
            self, stale_bouncer: StaleBouncer) -> None:
        only_stale = (f"postgresql://{stale_bouncer.user}@127.0.0.1:{stale_bouncer.stale_port}"
                      f"/{stale_bouncer.dbname}?target_session_attrs=read-write")
        with pytest.raises(zeroth_pg.NoWritableServerError, match="transaction_read_only"):
            await zeroth_pg.connect(only_stale)
        from zeroth_pg.errors import ConnectionLostError, translate
        assert isinstance(translate(zeroth_pg.NoWritableServerError("x")), ConnectionLostError)


class TestAConnectionRefusedAWrite:
    """A pooled connection whose server stops taking writes while the pool holds it (here its
    session is made read-only) is closed after the refused write, not handed out again."""

    async def test_a_pool_of_zeroth_pg_replaces_it(self, database_dsn: str) -> None:
        dsn = database_dsn + ("&" if "?" in database_dsn else "?") + \
            "target_session_attrs=read-write"
        # A pool that keeps session state on release (skip_reset), so that a SET makes its one
        # connection's session read-only under the pool, as a demotion would.
        async with zeroth_pg.create_pool(dsn, min_size=1, max_size=1,
                                         reset=skip_reset) as pool:
            async with pool.acquire() as conn:
                await conn.execute("SET default_transaction_read_only = on")
                first = await conn.fetchval("SELECT pg_backend_pid()")
            with pytest.raises(RetryableError) as raised:
                await LeaseManager(pool).enqueue_run(DEPLOYMENT, {})
            assert raised.value.code == "25006"
            queued = await LeaseManager(pool).enqueue_run(DEPLOYMENT, {})
            assert queued.created
            assert await pool.fetchval("SELECT pg_backend_pid()") != first

    async def test_a_connection_that_wrote_fine_is_kept(self, database_dsn: str) -> None:
        dsn = database_dsn + ("&" if "?" in database_dsn else "?") + \
            "target_session_attrs=read-write"
        async with zeroth_pg.create_pool(dsn, min_size=1, max_size=1) as pool:
            first = await pool.fetchval("SELECT pg_backend_pid()")
            await LeaseManager(pool).enqueue_run(DEPLOYMENT, {"n": uuid.uuid4().hex})
            with pytest.raises(asyncpg.UniqueViolationError):
                await pool.execute("CREATE TEMP TABLE t (k int PRIMARY KEY);"
                                   " INSERT INTO t VALUES (1), (1)")
            assert await pool.fetchval("SELECT pg_backend_pid()") == first


class TestAServiceFile:
    """A DSN that names a connection service (``?service=``, read from ``PGSERVICEFILE`` as asyncpg
    and libpq do): its hosts and ``target_session_attrs`` count like the DSN's own."""

    async def test_a_service_asking_for_read_write_writes_on_the_server_that_takes_writes(
            self, stale_bouncer: StaleBouncer, tmp_path: Any,
            monkeypatch: pytest.MonkeyPatch) -> None:
        services = tmp_path / "pg_service.conf"
        services.write_text(
            "[zeroth_ha]\n"
            f"host=127.0.0.1,127.0.0.1\nport={stale_bouncer.stale_port},{stale_bouncer.good_port}\n"
            f"user={stale_bouncer.user}\ndbname={stale_bouncer.dbname}\n"
            "target_session_attrs=read-write\n")
        monkeypatch.setenv("PGSERVICEFILE", str(services))
        async with zeroth_pg.create_pool("postgresql://?service=zeroth_ha",
                                         min_size=1, max_size=1) as pool:
            assert await _landed_in(pool) == (stale_bouncer.dbname, "pending")
        conn = await zeroth_pg.connect("service=zeroth_ha")
        try:
            assert await _landed_in(conn) == (stale_bouncer.dbname, "pending")
        finally:
            await conn.close()


class TestAHostThatHangsAfterLogin:
    """A host that lets the client in and then never answers (here a PgBouncer PAUSEd, as its
    operator does around a switchover: logins succeed, queries wait for RESUME) must not hold a
    connection's open for ever when another host of the DSN takes writes: the server's answer
    to the check is waited for no longer than the connection's own ``timeout``."""

    @pytest.mark.parametrize("connect_timeout", [2, 3600], ids=["its-timeout", "an-hour"])
    async def test_a_paused_pooler_first_in_the_dsn_does_not_stop_the_connection(
            self, database_dsn: str, pg_server_dsn: str, connect_timeout: float) -> None:
        # its-timeout: the check held past the connection's 2 s is given up and the next host
        # asked. an-hour: the first host holds the check, as a PgBouncer whose server restarts
        # (a switchover's demoted primary) queues it until the server is back: with an hour's
        # timeout only the next host, tried meanwhile, can answer.
        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, good, _c):
            dsn = (f"postgresql://{server.user}@127.0.0.1:{paused},127.0.0.1:{good}"
                   f"/{dbname}?target_session_attrs=read-write")
            # A guard against a hang (or waiting out the hour), not a speed assertion.
            conn = await asyncio.wait_for(zeroth_pg.connect(dsn, timeout=connect_timeout), 120)
            try:
                assert await _landed_in(conn) == (dbname, "pending")
            finally:
                await conn.close()


class TestEveryHostUnableToWrite:
    """While no host takes writes (every one a standby, for minutes), a caller that connects
    again and again (the worker's listener, the dashboard's event streams) neither floods the
    log nor skips the pause: each host's state is logged once, and the outage once, until it
    changes."""

    async def test_repeated_connects_log_the_read_only_host_and_the_outage_once(
            self, stale_bouncer: StaleBouncer, caplog: pytest.LogCaptureFixture) -> None:
        caplog.set_level(logging.DEBUG, logger="zeroth_pg.connect")
        only_stale = (f"postgresql://{stale_bouncer.user}@127.0.0.1:{stale_bouncer.stale_port}"
                      f"/{stale_bouncer.dbname}?target_session_attrs=read-write")
        for _ in range(2):  # the second waits for the pause the first left (shared)
            with pytest.raises(zeroth_pg.NoWritableServerError):
                await zeroth_pg.connect(only_stale)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len([m for m in warnings if "cannot take writes" in m]) == 1, warnings
        assert len([m for m in warnings if "no writable server" in m]) == 1, warnings


    async def test_a_long_pause_ends_when_the_host_it_found_read_only_goes_away(
            self, stale_bouncer: StaleBouncer, pg_server_dsn: str,
            monkeypatch: pytest.MonkeyPatch) -> None:
        # A long outage grew the shared pause (up to 5 s in production; an hour here, so that
        # only the event can end it): the connection the last pass found read-only is watched
        # meanwhile, and when it is lost (its server restarted: here the copy is made writable
        # and its sessions terminated, as a demoted or promoted server's are) the next pass
        # comes at once instead of at the end of the pause, and finds the host writable.
        only_stale = (f"postgresql://{stale_bouncer.user}@127.0.0.1:{stale_bouncer.stale_port}"
                      f"/{stale_bouncer.dbname}?target_session_attrs=read-write")
        state = _connect._Hosts("read-write", pause=3600.0)
        monkeypatch.setitem(_connect._CONNECT_STATES,
                            (zeroth_pg.asyncpg_dsn(only_stale), "read-write", "None", "None"),
                            state)
        connecting = asyncio.create_task(zeroth_pg.connect(only_stale))
        try:
            while state.quiet_until < time.monotonic() + 600:  # the hour's pause has begun
                assert not connecting.done(), connecting
                await asyncio.sleep(0.05)
            with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{stale_bouncer.copy}"'
                              " SET default_transaction_read_only = off")
                admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                              " WHERE datname = %s", (stale_bouncer.copy,))
            # A guard against waiting out the hour, not a speed assertion.
            conn = await asyncio.wait_for(asyncio.shield(connecting), 120)
        finally:
            connecting.cancel()
        try:
            assert await conn.fetchval("SELECT current_database()") == stale_bouncer.copy
            assert await conn.fetchval("SHOW transaction_read_only") == "off"
        finally:
            await conn.close()


class TestAPauseEndsForEveryCaller:
    """A shared pause (every host unable to write) ends for every caller waiting it out as soon
    as one caller finds a writable host, whether the caller was watching the read-only
    connections of the last pass or sleeping (issue 35: a Patroni switchover's promoted server
    was left unused for up to a second by a caller asleep for its whole pause — a renewal that
    then missed its lease deadline on the new primary)."""

    @staticmethod
    def _paused(watched: list[asyncpg.Connection]) -> _connect._Hosts:
        state = _connect._Hosts("read-write")
        state.watch(watched)
        # An hour's pause: only another caller's find can end it within the guard below.
        state.paused_at, state.quiet_until = time.monotonic(), time.monotonic() + 3600.0
        return state

    async def _ends_when_found(self, state: _connect._Hosts) -> None:
        waiting = asyncio.create_task(state.wait())
        try:
            await asyncio.sleep(0.3)
            assert not waiting.done()  # the pause holds while nothing changes
            state.found(("127.0.0.1", 5432), "127.0.0.1:5432")
            # A guard against waiting out the hour, not a speed assertion.
            await asyncio.wait_for(asyncio.shield(waiting), 60)
        finally:
            waiting.cancel()

    async def test_a_caller_with_nothing_to_watch_resumes_when_another_finds_a_writable_host(
            self) -> None:
        await self._ends_when_found(self._paused([]))

    async def test_a_caller_watching_a_host_that_stays_read_only_resumes_when_another_finds_one(
            self, connect: Any) -> None:
        read_only = await connect(server_settings={"default_transaction_read_only": "on"})
        state = self._paused([read_only])
        await self._ends_when_found(state)


class TestAMigration:
    """``python -m zeroth_pg.migrate`` (libpq, through alembic) trusts what a pooler reports no
    more than the asyncpg clients do: it runs on the host that takes writes by its own answer,
    or refuses naming each host."""

    def test_an_upgrade_with_the_stale_pooler_first_runs_on_the_writable_host(
            self, stale_bouncer: StaleBouncer, pg_server_dsn: str) -> None:
        # The second host is the server itself (the migration pins its settings with the
        # ``options`` startup parameter, which PgBouncer 1.18 refuses: docs/dba-guide.md runs
        # `zeroth-pg migrate` on a direct connection); the first, the PgBouncer that reports
        # read-write in front of the read-only copy.
        server = _server(pg_server_dsn)
        dsn = (f"host=127.0.0.1,{server.host} port={stale_bouncer.stale_port},{server.port} "
               f"dbname={stale_bouncer.dbname} user={stale_bouncer.user} "
               "target_session_attrs=read-write")
        with psycopg.connect(dsn) as premise:
            # libpq trusts the cached "read-write" and stays on the read-only copy.
            assert premise.execute("SELECT current_database()").fetchone() == (
                stale_bouncer.copy,)
        migrate.upgrade(dsn)  # re-applies the function files: writes
        with psycopg.connect(migrate.writable_libpq_dsn(dsn)) as conn:
            assert conn.execute("SELECT current_database(), current_setting("
                                "'transaction_read_only')").fetchone() == (
                stale_bouncer.dbname, "off")

    def test_with_no_writable_host_it_refuses_naming_the_host_and_why(
            self, stale_bouncer: StaleBouncer) -> None:
        only_stale = (f"host=127.0.0.1 port={stale_bouncer.stale_port} "
                      f"dbname={stale_bouncer.dbname} user={stale_bouncer.user} "
                      "target_session_attrs=read-write")
        with pytest.raises(zeroth_pg.NoWritableServerError,
                           match=f"127.0.0.1:{stale_bouncer.stale_port}: "
                                 "transaction_read_only is on"):
            migrate.upgrade(only_stale)


class TestAConnectionsOwnReadOnlyTransaction:
    async def test_a_write_refused_by_a_read_only_transaction_of_its_own_keeps_the_connection(
            self, database_dsn: str) -> None:
        # SET TRANSACTION READ ONLY (asyncpg's readonly=True) on a primary: 25006 says nothing
        # about the server, which takes writes; closing the connection would make every such
        # refusal cost a new connection and its check.
        dsn = database_dsn + ("&" if "?" in database_dsn else "?") + \
            "target_session_attrs=read-write"
        async with zeroth_pg.create_pool(dsn, min_size=1, max_size=1) as pool:
            first = await pool.fetchval("SELECT pg_backend_pid()")
            async with pool.acquire() as conn:
                with pytest.raises(asyncpg.ReadOnlySQLTransactionError):
                    async with conn.transaction(readonly=True):
                        await conn.execute("CREATE TEMP TABLE refused (k int)")
            assert await pool.fetchval("SELECT pg_backend_pid()") == first
            await LeaseManager(pool).enqueue_run(DEPLOYMENT, {"n": uuid.uuid4().hex})

    async def test_concurrent_acquires_probe_each_host_once_per_pass_not_once_per_caller(
            self, database_dsn: str) -> None:
        # A server whose sessions cannot write (default_transaction_read_only from the DSN's
        # options): 8 callers of one pool at once during the outage. The pause is shared; the
        # pass over the hosts is shared too, or every caller opens a connection to every host
        # at every pass (N callers x hosts x passes against standbys, fleet-wide).
        opened: list[int] = []

        class Counted(asyncpg.Connection):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                opened.append(1)

        dsn = database_dsn + ("&" if "?" in database_dsn else "?") + \
            "target_session_attrs=read-write&options=-c%20default_transaction_read_only%3Don"
        async with zeroth_pg.create_pool(dsn, min_size=0, max_size=8,
                                         connection_class=Counted) as pool:
            async def one() -> BaseException | None:
                try:
                    await pool.fetchval("SELECT 1")
                except BaseException as exc:
                    return exc
                return None

            got = await asyncio.gather(*(one() for _ in range(8)))
        assert all(isinstance(e, zeroth_pg.NoWritableServerError) for e in got), got
        # One host, three passes: one connection per pass (a caller that finds the pause over
        # while a pass is under way may start one of its own: at most twice that).
        assert 3 <= len(opened) <= 6, len(opened)


@contextlib.contextmanager
def _two_poolers(database_dsn: str, pg_server_dsn: str
                 ) -> Iterator[tuple[Server, str, int, int]]:
    """Two PgBouncers in front of the test's server: yields (server, dbname, port, port)."""
    server = _server(pg_server_dsn)
    dbname = str(conninfo_to_dict(libpq_dsn(database_dsn))["dbname"])
    target = f"host={server.host} port={server.port}"
    socket_dir = server.host if server.host.startswith("/") else None
    with bouncer(f"* = {target}", user=server.user, socket_dir=socket_dir) as one, \
            bouncer(f"* = {target}", user=server.user, socket_dir=socket_dir) as two:
        yield server, dbname, one, two


@contextlib.contextmanager
def _paused_then_good(database_dsn: str, pg_server_dsn: str
                      ) -> Iterator[tuple[Server, str, int, int, psycopg.Connection[Any]]]:
    """Two PgBouncers in front of the test's server, the first PAUSEd (logins succeed, queries
    wait for RESUME): yields (server, dbname, paused_port, good_port, console)."""
    with _two_poolers(database_dsn, pg_server_dsn) as (server, dbname, paused, good):
        # A client first, so that PgBouncer answers later logins from its cache.
        with psycopg.connect(f"postgresql://{server.user}@127.0.0.1:{paused}/{dbname}",
                             autocommit=True) as first:
            first.execute("SELECT 1")
        with psycopg.connect(f"postgresql://{server.user}@127.0.0.1:{paused}/pgbouncer",
                             autocommit=True) as console:
            console.execute("PAUSE")
            try:
                yield server, dbname, paused, good, console
            finally:
                console.execute("RESUME")


class TestAMigrationAndAHostThatHangsAfterLogin:
    def test_a_paused_pooler_first_in_the_dsn_does_not_hang_the_migrations_host_choice(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        # `zeroth-pg migrate` with a PgBouncer PAUSEd around a switchover first in its DSN:
        # the login succeeds, the check waits for RESUME. connect_timeout bounds the login
        # only; the host choice must still give up on that host (its connect_timeout) and
        # pin the migration to the next one, which takes writes.
        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, _, _c):
            dsn = (f"host=127.0.0.1,{server.host} port={paused},{server.port} "
                   f"dbname={dbname} user={server.user} target_session_attrs=read-write "
                   "connect_timeout=2")
            result: list[Any] = []
            thread = threading.Thread(
                target=lambda: result.append(migrate.writable_libpq_dsn(dsn)), daemon=True)
            thread.start()
            thread.join(30)  # a guard against a hang, far above the 2 s asked for
            assert not thread.is_alive(), "the host choice still waits for the PAUSEd host"
        assert conninfo_to_dict(result[0])["port"] == server.port


class TestAMigrationWithAServiceFile:
    def test_a_service_asking_for_read_write_pins_the_migration_to_the_writable_host(
            self, stale_bouncer: StaleBouncer, pg_server_dsn: str, tmp_path: Any,
            monkeypatch: pytest.MonkeyPatch) -> None:
        # The asyncpg clients read the service's hosts and target_session_attrs
        # (TestAServiceFile); `zeroth-pg migrate service=...` must not fall back to libpq's
        # trust in the stale PgBouncer's reported role.
        server = _server(pg_server_dsn)
        services = tmp_path / "pg_service.conf"
        services.write_text(
            "[zeroth_ha]\n"
            f"host=127.0.0.1,{server.host}\nport={stale_bouncer.stale_port},{server.port}\n"
            f"user={stale_bouncer.user}\ndbname={stale_bouncer.dbname}\n"
            "target_session_attrs=read-write\n")
        monkeypatch.setenv("PGSERVICEFILE", str(services))
        with psycopg.connect(migrate.writable_libpq_dsn("service=zeroth_ha")) as conn:
            assert conn.execute("SELECT current_database(), current_setting("
                                "'transaction_read_only')").fetchone() == (
                stale_bouncer.dbname, "off")


class TestConcurrentConnectsWhenTheCallerGoingOverTheHostsIsCancelled:
    async def test_the_waiting_callers_do_not_each_start_a_pass_of_their_own(
            self, database_dsn: str, pg_server_dsn: str,
            monkeypatch: pytest.MonkeyPatch) -> None:
        # 8 callers connect at once (a pool's acquires after an outage); the one going over
        # the hosts is cancelled (its acquire timed out, its task was stopped) while a host
        # holds the check. The 7 that waited for its pass must not each start one of their
        # own (7 callers x every host: the unbounded probing that sharing the pass prevents).
        opened: list[int] = []

        class Counted(asyncpg.Connection):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                opened.append(1)

        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, _, _c):
            # The PAUSEd host first, then the server with sessions that cannot write.
            dsn = (f"postgresql://{server.user}@127.0.0.1:{paused},127.0.0.1:{paused}"
                   f"/{dbname}?target_session_attrs=read-write")
            state = _connect._Hosts("read-write")
            monkeypatch.setitem(_connect._CONNECT_STATES,
                                (zeroth_pg.asyncpg_dsn(dsn), "read-write", "None", "None"),
                                state)
            first = asyncio.create_task(
                zeroth_pg.connect(dsn, timeout=3600, connection_class=Counted))
            while state.probe is None:
                assert not first.done(), first
                await asyncio.sleep(0.01)
            others = [asyncio.create_task(
                zeroth_pg.connect(dsn, timeout=3600, connection_class=Counted))
                for _ in range(7)]
            while len(opened) < 2:  # both hosts' checks are held
                assert not first.done(), first
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # the 7 wait for the pass under way
            assert len(opened) == 2, len(opened)
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await asyncio.sleep(1.0)  # the 7 go on: one pass among them, not seven
            try:
                assert len(opened) <= 4, len(opened)
            finally:
                for task in others:
                    task.cancel()
                await asyncio.gather(*others, return_exceptions=True)


#: The codes that open a connection that logs in: SSLRequest, GSSENCRequest, protocol 3.0's
#: StartupMessage (anything else, a CancelRequest or nothing at all, is no client's session).
_LOGIN_CODES = {(80877103).to_bytes(4, "big"), (80877104).to_bytes(4, "big"),
                (196608).to_bytes(4, "big")}


@dataclass(slots=True)
class _Tapped:
    """What went through a :func:`_tap`: the first 8 bytes of each connection (less when it
    closed before) and how many of them the client has not closed yet."""

    port: int
    firsts: list[bytes]
    open_from_client: list[int]


async def _closed(still_open: Callable[[], Any], what: str) -> None:
    """Wait until ``still_open()`` is falsy: the relay (or black hole) has read the end of every
    connection the client closed. A bound, not a timing: a loaded machine may take longer than
    the 0.5 s these tests slept before looking, and a connection left open fails after 30 s."""
    deadline = time.monotonic() + 30
    while still_open():
        assert time.monotonic() < deadline, f"{what} still open after 30 s: {still_open()}"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _tap(port: int) -> Any:
    """A TCP relay on a loopback port to the PgBouncer at ``port`` (a network path, not a
    server: every byte goes to PgBouncer and back); yields a :class:`_Tapped`, to see the
    cancel requests a client sends and the connections it leaves open (a PgBouncer PAUSEd
    does not read from a waiting client, so its own list cannot tell)."""
    tapped = _Tapped(0, [], [0])

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tapped.open_from_client[0] += 1
        try:
            first = await reader.read(8)
            tapped.firsts.append(first)
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            up_writer.write(first)
            upstream = asyncio.ensure_future(pipe(up_reader, writer))
            await pipe(reader, up_writer)  # until the client closes its side
        finally:
            tapped.open_from_client[0] -= 1
        upstream.cancel()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    tapped.port = server.sockets[0].getsockname()[1]
    try:
        yield tapped
    finally:
        server.close()


class TestACheckThatGetsNoAnswer:
    async def test_a_check_held_past_the_timeout_is_not_cancelled_by_a_cancel_request(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        # Every host holds the check (here the one host, a PAUSEd PgBouncer) for longer than
        # the connection's timeout: the check is given up. It must be given up as an
        # abandoned one is, by closing its connection, not with asyncpg's cancel request (on
        # a new connection, which PgBouncer 1.18 crashed on when it was dropped half-way).
        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, _, _c):
            async with _tap(paused) as tapped:
                firsts = tapped.firsts
                dsn = (f"postgresql://{server.user}@127.0.0.1:{tapped.port}/{dbname}"
                       "?target_session_attrs=read-write")
                with pytest.raises((TimeoutError, zeroth_pg.NoWritableServerError)):
                    # A guard against a hang, far above the 2 s asked for.
                    await asyncio.wait_for(zeroth_pg.connect(dsn, timeout=2), 120)
                await asyncio.sleep(0.5)  # a cancel request sent meanwhile has come through
                assert firsts, "the check did not go through the relay"
                # Each connection through the relay logs in: none is a cancel request, or the
                # connection of one dropped before it was sent.
                assert all(first[4:8] in _LOGIN_CODES for first in firsts), firsts


class TestAbandonedChecksAreClosed:
    async def test_a_cancelled_connect_leaves_no_connection_to_hosts_that_hold_the_check(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        # The caller gives up (its acquire timed out) while every host holds the check: each
        # connection the pass opened is closed by the client.
        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, _, _c):
            async with _tap(paused) as first, _tap(paused) as second:
                dsn = (f"postgresql://{server.user}@127.0.0.1:{first.port},127.0.0.1:"
                       f"{second.port}/{dbname}?target_session_attrs=read-write")
                connecting = asyncio.create_task(zeroth_pg.connect(dsn, timeout=3600))
                while first.open_from_client[0] + second.open_from_client[0] < 2:
                    assert not connecting.done(), connecting
                    await asyncio.sleep(0.05)
                connecting.cancel()
                await asyncio.gather(connecting, return_exceptions=True)
                await _closed(lambda: first.open_from_client[0] + second.open_from_client[0],
                              "a check's connection")
                assert (first.open_from_client, second.open_from_client) == ([0], [0])

    async def test_a_pass_won_by_the_next_host_closes_the_check_held_by_the_first(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, good,
                                                                 _c):
            async with _tap(paused) as held:
                dsn = (f"postgresql://{server.user}@127.0.0.1:{held.port},127.0.0.1:{good}"
                       f"/{dbname}?target_session_attrs=read-write")
                conn = await asyncio.wait_for(zeroth_pg.connect(dsn, timeout=3600), 120)
                try:
                    await _closed(lambda: held.open_from_client[0], "the held check")
                    assert held.firsts, "the first host was not tried"
                    assert held.open_from_client == [0], held.open_from_client
                finally:
                    await conn.close()


class TestDsnParametersOnEachHostsConnection:
    async def test_sslmode_require_is_kept_on_each_hosts_connection_no_plaintext_fallback(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        # Two PgBouncers without TLS: each refuses the SSL upgrade. The per-host connections
        # of the check must not drop the DSN's sslmode=require and log in in plain text.
        with _two_poolers(database_dsn, pg_server_dsn) as (server, dbname, one, two):
            dsn = (f"postgresql://{server.user}@127.0.0.1:{one},127.0.0.1:{two}/{dbname}"
                   "?target_session_attrs=read-write&sslmode=require")
            with pytest.raises(ConnectionError, match="SSL"):
                await zeroth_pg.connect(dsn)
            with pytest.raises(ConnectionError, match="SSL"):
                async with zeroth_pg.create_pool(dsn, min_size=1, max_size=1):
                    pass


class TestTwoHostsThatTakeWrites:
    async def test_connections_stay_on_one_of_them(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        # Split brain (both take writes, here two PgBouncers in front of one server): every
        # connection of a pool goes to the same host, the one found writable first, not some
        # to each.
        with _two_poolers(database_dsn, pg_server_dsn) as (server, dbname, one, two):
            dsn = (f"postgresql://{server.user}@127.0.0.1:{one},127.0.0.1:{two}/{dbname}"
                   "?target_session_attrs=read-write")
            async with zeroth_pg.create_pool(dsn, min_size=0, max_size=6) as pool:
                conns = [await pool.acquire() for _ in range(6)]
                try:
                    ports = {conn._addr[1] for conn in conns}
                finally:
                    for conn in conns:
                        await pool.release(conn)
            assert ports == {one}, (ports, one, two)


@contextlib.asynccontextmanager
async def _black_hole() -> Any:
    """A loopback port that accepts connections and never answers (a SIGSTOPped server, a
    partition after the handshake): yields (its port, [connections the client has not closed
    yet])."""
    open_now = [0]

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_now[0] += 1
        try:
            with contextlib.suppress(OSError):
                while await reader.read(65536):
                    pass
        finally:
            open_now[0] -= 1
            writer.close()

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], open_now
    finally:
        server.close()


class TestAHostThatNeverAnswersTheLogin:
    async def test_the_next_host_wins_and_the_hung_login_is_closed(
            self, database_dsn: str, pg_server_dsn: str) -> None:
        server = _server(pg_server_dsn)
        dbname = str(conninfo_to_dict(libpq_dsn(database_dsn))["dbname"])
        target = f"host={server.host} port={server.port}"
        socket_dir = server.host if server.host.startswith("/") else None
        with bouncer(f"* = {target}", user=server.user, socket_dir=socket_dir) as good:
            async with _black_hole() as (hole, open_now):
                dsn = (f"postgresql://{server.user}@127.0.0.1:{hole},127.0.0.1:{good}"
                       f"/{dbname}?target_session_attrs=read-write")
                # A guard against waiting out the hour, not a speed assertion.
                conn = await asyncio.wait_for(zeroth_pg.connect(dsn, timeout=3600), 120)
                try:
                    assert await _landed_in(conn) == (dbname, "pending")
                    await _closed(lambda: open_now[0], "the hung login")
                    assert open_now == [0], open_now
                finally:
                    await conn.close()

    async def test_alone_it_fails_after_the_connections_timeout_with_nothing_left_open(
            self) -> None:
        async with _black_hole() as (hole, open_now):
            dsn = (f"postgresql://nobody@127.0.0.1:{hole},127.0.0.1:{hole}/db"
                   "?target_session_attrs=read-write")
            with pytest.raises((TimeoutError, zeroth_pg.NoWritableServerError)):
                # A guard against a hang, far above the 1 s asked for.
                await asyncio.wait_for(zeroth_pg.connect(dsn, timeout=1), 120)
            await _closed(lambda: open_now[0], "a hung login")
            assert open_now == [0], open_now


class TestConnectsFromOneEventLoopAfterAnother:
    def test_a_connect_after_an_outage_seen_from_an_earlier_event_loop_succeeds(
            self, stale_bouncer: StaleBouncer, pg_server_dsn: str) -> None:
        # A CLI command (asyncio.run per command), a test, a process that restarts its loop:
        # the first loop saw an outage (its last pass's read-only connection kept to watch
        # the pause) and closed. The next loop's connect must not trip over that connection.
        only_stale = (f"postgresql://{stale_bouncer.user}@127.0.0.1:{stale_bouncer.stale_port}"
                      f"/{stale_bouncer.dbname}?target_session_attrs=read-write")
        with pytest.raises(zeroth_pg.NoWritableServerError):
            asyncio.run(zeroth_pg.connect(only_stale))
        with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{stale_bouncer.copy}"'
                          " SET default_transaction_read_only = off")
            admin.execute("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                          " WHERE datname = %s", (stale_bouncer.copy,))

        async def connected() -> str:
            conn = await zeroth_pg.connect(only_stale)
            try:
                return str(await conn.fetchval("SHOW transaction_read_only"))
            finally:
                await conn.close()

        assert asyncio.run(connected()) == "off"


class TestAMigrationsHostListForms:
    def test_a_list_of_hostaddr_without_host_names_tries_each_address(
            self, stale_bouncer: StaleBouncer) -> None:
        # libpq's multi-host forms include hostaddr=a,b (no host names): the host choice must
        # ask each address, not only the first.
        dsn = (f"hostaddr=127.0.0.1,127.0.0.1 port={stale_bouncer.stale_port},"
               f"{stale_bouncer.good_port} dbname={stale_bouncer.dbname} "
               f"user={stale_bouncer.user} target_session_attrs=read-write")
        pinned = conninfo_to_dict(migrate.writable_libpq_dsn(dsn))
        assert pinned["port"] == str(stale_bouncer.good_port), pinned


class TestACallerCancelledAsItsPassIsWon:
    async def test_the_connection_found_is_closed_not_left_open(
            self, database_dsn: str, pg_server_dsn: str,
            monkeypatch: pytest.MonkeyPatch) -> None:
        # The caller's deadline (an acquire's timeout, asyncio.timeout around a connect) comes
        # in the instant the pass has its winner, while the abandoned checks are being closed:
        # the connection found is the caller's to close no more, so the pass must close it
        # (else only the GC does, with "unclosed connection"). The cancellation is delivered at
        # that instant by a hook on the winner's marking.
        marked = _connect._watch_refused_writes

        def cancelled_now(conn: asyncpg.Connection) -> None:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            marked(conn)

        monkeypatch.setattr(_connect, "_watch_refused_writes", cancelled_now)
        opened: list[asyncpg.Connection] = []

        class Tracked(asyncpg.Connection):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                opened.append(self)

        with _paused_then_good(database_dsn, pg_server_dsn) as (server, dbname, paused, good,
                                                                 _c):
            dsn = (f"postgresql://{server.user}@127.0.0.1:{paused},127.0.0.1:{good}"
                   f"/{dbname}?target_session_attrs=read-write")
            with pytest.raises(asyncio.CancelledError):
                await zeroth_pg.connect(dsn, timeout=3600, connection_class=Tracked)
            await asyncio.sleep(0.5)  # the abandoned tasks have ended
            await _closed(lambda: [conn for conn in opened if not conn.is_closed()],
                          "a connection of the pass")
            try:
                assert len(opened) == 2, opened  # the held check's, the winner's
                assert [conn.is_closed() for conn in opened] == [True, True]
            finally:
                for conn in opened:
                    conn.terminate()
