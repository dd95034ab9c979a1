"""LISTEN/NOTIFY wakeups: hints that cut latency, never the truth.

NOTIFY and LISTEN need no privilege, so anyone who can connect can send any notification and hear
every one. The payloads are therefore opaque keys (32 hex digits derived from a per-database
secret only zeroth_owner can read): the SQL functions that make work claimable notify
``zeroth_wakeup`` with the key of the (deployment, tenant, workspace); a cancel request notifies
``zeroth_control`` with the key of the run's worker id; the end of a thread run notifies
``zeroth_run_finished`` with the run's key; an append to a run's event stream (and the END of a
stream that has events) notifies ``zeroth_run_events`` with the run's key. A listener asks the
database for the keys it cares about (``LeaseManager.wakeup_key`` / ``control_key`` /
``run_finished_key`` / ``run_events_key``) and compares. A notification is only ever a hint: a
worker claims by query, and confirms a cancel with ``renew_leases`` before it stops anything.

A :class:`Notifier` holds ONE dedicated connection outside any pool (a pooled connection runs
``UNLISTEN *`` on release, and a transaction-mode pooler cannot LISTEN at all),
pings it on an interval so a silently dead connection is noticed, reconnects with backoff, and
calls ``on_connect`` after every (re)connect: notifications sent while it was away are gone, so
the owner must poll once.

Poolers: LISTEN works through a session-mode pooler, never through a transaction-mode one (the
server connection that ran LISTEN goes back to the pool and the notifications with it). After
each connect the Notifier compares the backend pid the server reports with the one in the
protocol handshake: they differ behind any pooler, and a warning says so. It then checks on every
health ping that ``pg_backend_pid()`` has not changed since LISTEN; a change proves the
connection is multiplexed by a transaction-mode pooler, and the Notifier stops for good with an
error (:attr:`Notifier.refused`) instead of pretending to listen. The worker keeps polling, so no
run is lost, only latency. Give the listener a DSN that reaches the server directly.

Every step of a (re)connect is bounded, as every later statement is: the connect by
``connect_timeout`` and each set-up statement (``pg_backend_pid()``, each ``LISTEN``) by
``ping_timeout``. A server that accepts the connection and then stops answering (a primary
frozen by SIGSTOP, a paused VM, a partition that drops packets: its TCP connection stays open)
would otherwise hold the reconnect for ever, and the listener would never reach the promoted
node. A set-up statement past its bound has its connection terminated (no cancel request: it
would go to the same hung server) and the Notifier reconnects with its backoff (issue 35).
A health ping or an owner's call (:meth:`Notifier.on_session`) past the same bound is cut by a
cancellation, then its connection terminated at once: asyncpg schedules its cancel request in a
task of its own when the query is cancelled, and the terminate cancels that task before it
starts, so no cancel request goes to the hung server either (tests/failover/test_hung_server.py
counts the connections a frozen host's kernel queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from zeroth_pg._connect import connect as writable_connect

__all__ = [
    "CHANNELS",
    "CONTROL_CHANNEL",
    "RUN_EVENTS_CHANNEL",
    "RUN_FINISHED_CHANNEL",
    "WAKEUP_CHANNEL",
    "ListenMultiplexedError",
    "Notifier",
    "enqueue_wakeup",
]

WAKEUP_CHANNEL = "zeroth_wakeup"
CONTROL_CHANNEL = "zeroth_control"
RUN_FINISHED_CHANNEL = "zeroth_run_finished"
#: A run's event stream moved (an event appended, its END written): payload run_events_key.
RUN_EVENTS_CHANNEL = "zeroth_run_events"
CHANNELS = frozenset({WAKEUP_CHANNEL, CONTROL_CHANNEL, RUN_FINISHED_CHANNEL, RUN_EVENTS_CHANNEL})
"""Every channel the SQL functions notify (a test keeps it equal to the migrations); a Notifier
refuses any other name, so a typo or a caller-supplied string can never become a LISTEN."""

log = logging.getLogger("zeroth_pg.notify")

NotificationHandler = Callable[[str, str], None]
T = TypeVar("T")


class ListenMultiplexedError(ConnectionError):
    """The LISTEN connection changed server backend between statements: a transaction-mode
    pooler sits in between, and no notification can arrive on it."""


async def enqueue_wakeup(conn: asyncpg.Connection | asyncpg.Pool | None, *, deployment_ref: str,
                         tenant_id: str | None = None, workspace_id: str | None = None) -> None:
    """Best-effort wakeup of the workers of a scope; never raises (the poll covers a lost hint).

    The SQL functions already notify when they make work claimable; this is for callers that
    changed something outside them and want workers to look now. It sends the scope's key
    (``zeroth.wakeup_key``), so it needs EXECUTE on that function (zeroth_worker has it).
    """
    if conn is None:
        return
    try:
        await conn.execute(
            "SELECT pg_notify($1, zeroth.wakeup_key(deployment_ref => $2, tenant_id => $3,"
            " workspace_id => $4))", WAKEUP_CHANNEL, deployment_ref, tenant_id, workspace_id)
    except Exception as exc:  # a hint must never break the caller
        log.warning("wakeup for deployment %s not sent (%s: %s); poll fallback active",
                    deployment_ref, type(exc).__name__, exc)


class Notifier:
    """One dedicated LISTEN connection with health pings and reconnect-with-backoff.

    ``on_notification(channel, payload)`` is called for every notification with its payload
    text (anyone can send one: treat it as a hint); it must not block. ``on_connect()`` is
    called after every successful (re)connect, before any notification of that connection is
    delivered.
    """

    def __init__(
        self,
        dsn: str,
        *,
        on_notification: NotificationHandler,
        on_connect: Callable[[], None] | None = None,
        channels: tuple[str, ...] = (WAKEUP_CHANNEL, CONTROL_CHANNEL),
        ping_interval: float = 5.0,
        ping_timeout: float = 5.0,
        reconnect_min: float = 0.1,
        reconnect_max: float = 5.0,
        connect: Callable[[str], Awaitable[asyncpg.Connection]] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        unknown = sorted(set(channels) - CHANNELS)
        if unknown or not channels:
            raise ValueError(f"a Notifier listens on {sorted(CHANNELS)} only, not {unknown}")
        self.dsn = dsn
        self.channels = channels
        self.on_notification = on_notification
        self.on_connect = on_connect
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.connect_timeout = connect_timeout
        self._connect = connect or writable_connect
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._backend_pid: int | None = None
        self._lost = asyncio.Event()
        # One statement at a time on the LISTEN connection: health pings and the owner's calls
        # (announce_idle / announce_busy, whose session locks must live on this connection).
        self._statement = asyncio.Lock()
        self.connected = asyncio.Event()
        self.connects = 0
        self.behind_pooler = False
        """The last connection went through a pooler (its handshake pid is not the backend's)."""
        self.refused: str | None = None
        """Why the Notifier stopped for good (a transaction-mode pooler), else None."""

    @property
    def backend_pid(self) -> int | None:
        """The server backend pid of the LISTEN connection (None while disconnected)."""
        conn = self._conn
        return None if conn is None or conn.is_closed() else self._backend_pid

    async def on_session(self, call: Callable[[asyncpg.Connection], Awaitable[T]], *,
                         session: int | None = None) -> T:
        """Run ``call`` on the LISTEN connection, one statement at a time with the pings. With
        ``session`` (a value of :attr:`connects`), only on that connection: session state such
        as advisory locks belongs to it. Raises ConnectionError while disconnected or once the
        connection is another one. Bounded by ``ping_timeout``, the wait for the connection
        included: a call that does not come back in time (a dead peer raises nothing by itself)
        drops the connection, so the listener reconnects and the caller never hangs."""
        try:
            async with asyncio.timeout(self.ping_timeout), self._statement:
                conn = self._conn
                if (conn is None or conn.is_closed() or not self.connected.is_set()
                        or (session is not None and session != self.connects)):
                    raise ConnectionError("the LISTEN connection is not the one asked for")
                return await call(conn)
        except TimeoutError:
            self._drop("a call on the LISTEN connection")
            raise

    def _drop(self, what: str) -> None:
        """The connection stopped answering: terminate it; the run loop reconnects."""
        conn = self._conn
        log.warning("%s got no answer in %.1fs; dropping the LISTEN connection", what,
                    self.ping_timeout)
        if conn is not None and not conn.is_closed():
            conn.terminate()
        self._lost.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="zeroth-notifier")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._close()

    async def _run(self) -> None:
        delay = self.reconnect_min
        while True:
            try:
                await self._listen_once()
                delay = self.reconnect_min
            except asyncio.CancelledError:
                raise
            except ListenMultiplexedError as exc:
                self.refused = str(exc)
                log.error("%s", exc)
                return  # a reconnect would meet the same pooler
            except Exception as exc:
                log.warning("LISTEN connection failed (%s: %s); reconnecting in %.2fs",
                            type(exc).__name__, exc, delay)
            finally:
                self.connected.clear()
                await self._close()
            await asyncio.sleep(delay * (0.5 + random.random() / 2))
            delay = min(self.reconnect_max, delay * 2)

    async def _listen_once(self) -> None:
        self._lost.clear()
        # asyncio.timeout: a connect cancelled in flight leaves nothing on the server (the
        # writable-server check's own connections are terminated, zeroth_pg._connect).
        async with asyncio.timeout(self.connect_timeout):
            conn = await self._connect(self.dsn)
        self._conn = conn
        conn.add_termination_listener(lambda _conn: self._lost.set())
        self._backend_pid = backend_pid = int(await self._set_up(
            conn, "SELECT pg_backend_pid()", lambda: conn.fetchval("SELECT pg_backend_pid()")))
        handshake_pid = conn.get_server_pid()
        self.behind_pooler = handshake_pid != backend_pid
        if self.behind_pooler:
            log.warning(
                "the LISTEN connection goes through a connection pooler (handshake pid %s, "
                "server backend %s): LISTEN works in session pooling mode only; give the "
                "listener a DSN that reaches the server directly", handshake_pid, backend_pid)
        for channel in self.channels:
            await self._set_up(conn, f"LISTEN {channel}",
                               functools.partial(conn.add_listener, channel, self._deliver))
        await self._check_backend(conn, backend_pid)
        self.connects += 1
        self.connected.set()
        log.info("listening on %s (connect #%d)", ", ".join(self.channels), self.connects)
        if self.on_connect is not None:
            self.on_connect()
        while True:
            # asyncio.timeout: wait_for can drop a cancellation on 3.11 (gh-86296), and
            # Notifier.stop waits for this task.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ping_interval):
                    await self._lost.wait()
            if self._lost.is_set() or conn.is_closed():
                raise ConnectionError("LISTEN connection closed")
            # A dead TCP peer raises no exception by itself: ask the server something.
            await self._check_backend(conn, backend_pid)

    async def _set_up(self, conn: asyncpg.Connection, what: str,
                      call: Callable[[], Awaitable[T]]) -> T:
        """One set-up statement, answered within ``ping_timeout`` or its connection terminated
        (a timer, not a cancellation: asyncpg would send a cancel request to the same hung
        server) and ConnectionError raised; the run loop reconnects."""
        fired = False

        def cut() -> None:
            nonlocal fired
            fired = True
            log.warning("%s got no answer in %.1fs; dropping the LISTEN connection", what,
                        self.ping_timeout)
            conn.terminate()

        timer = asyncio.get_running_loop().call_later(self.ping_timeout, cut)
        try:
            return await call()
        except Exception as exc:
            if fired:
                raise ConnectionError(f"{what} got no answer in {self.ping_timeout:.1f}s; the "
                                      "LISTEN connection was dropped") from exc
            raise
        finally:
            timer.cancel()

    async def _check_backend(self, conn: asyncpg.Connection, backend_pid: int) -> None:
        """A health ping that also proves the connection still talks to the backend that ran
        LISTEN (a transaction-mode pooler hands each statement to any server connection)."""
        try:
            try:
                async with asyncio.timeout(self.ping_timeout), self._statement:
                    now = await conn.fetchval("SELECT pg_backend_pid()")
            except TimeoutError:
                self._drop("the health ping")
                raise
        except (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError):
            now = "another"  # a statement prepared on one backend met another: the same proof
        if now != backend_pid:
            raise ListenMultiplexedError(
                f"the LISTEN connection moved from server backend {backend_pid} to {now}: a "
                "transaction-mode pooler multiplexes it and no notification can arrive; the "
                "listener stops (the worker keeps polling). Give it a DSN that reaches the "
                "server directly or a session-mode pool.")

    def _deliver(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        try:
            self.on_notification(channel, payload)
        except Exception:
            log.exception("notification handler failed for %s", channel)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):  # not wait_for (gh-86296, above)
                    await conn.close()
            if not conn.is_closed():
                conn.terminate()
