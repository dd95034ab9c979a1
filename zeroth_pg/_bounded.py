"""A time bound on one call through a pool: what keeps a worker off a hung server (issue 35).

A server that stops answering without closing its connections (a primary frozen by SIGSTOP, a
paused VM, a network partition that drops packets) leaves every call on those connections
waiting: the kernel keeps the TCP connection open, asyncpg raises nothing, and a worker's claim
loop and completion loop wait on it until the server comes back, while a failover manager has
long promoted another node (a Patroni cluster whose primary node was stopped: the first claim
on the promoted node came 2.3-3.0 s after the promotion, only once the harness resumed the old
one; docs/dba-guide.md, "High availability").

:func:`pooled_call` gives one call (the wait for a pooled connection included) ``seconds`` to
answer. One that does not gets its connection **terminated** — never handed back to the pool,
and never cancelled with asyncpg's cancel request, which goes out on a new connection to the
same hung server (and, dropped half-way, crashed PgBouncer 1.18: :mod:`zeroth_pg._connect`) —
and the pool's other connections expired (:meth:`asyncpg.Pool.expire_connections`: each is
replaced at its next acquire, so the next calls do not try the pool's other connections to the
same server one bound at a time), and :class:`~zeroth_pg.errors.CallTimeoutError` (a
``ConnectionLostError``: retryable) is raised. The next call connects afresh through the DSN:
with a multi-host DSN, through the writable-server check of :mod:`zeroth_pg._connect`, which
finds the promoted node. Whether the call committed is unknown, as for any lost connection: a
completion is not reported as landed (a repeat is refused by the fence if the first landed),
and runs a timed-out claim may have leased are recovered by the orphan sweep once their lease
runs out. A cancellation from outside (a renewal's own deadline) is asyncpg's to handle, as
without the bound.

A call that asyncpg refuses before it writes anything — ``InternalClientError: cannot switch to
state 12; another operation (2) is in progress`` — is made again on another connection, within
the same bound. That is a connection the server ended while it sat idle (a switchover's fast
shutdown, ``pg_terminate_backend``): asyncpg read the server's FATAL with no query out, put the
protocol in its "error consume" state (2), and marks the connection closed only when it reads
the end of the stream, a turn of the event loop or more later. Nothing of the call reached a
server (asyncpg sets its state before it writes), so the repeat is safe for every call; the
refused connection is terminated, and the pool opens a new one through the DSN
(tests/failover/test_terminated_connection.py). Before, the call failed as a lost connection (a
claim pass, a sweep or a completion batch logged as failed at a Patroni switchover) and the
release's reset, failing on that connection, expired every connection of the pool.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from zeroth_pg._connect import released_as_found
from zeroth_pg.errors import CallTimeoutError, ConnectionLostError

__all__ = ["pooled_call"]

log = logging.getLogger("zeroth_pg.client")

T = TypeVar("T")

#: The least time a connection's reset gets when it goes back to the pool (asyncpg terminates a
#: connection whose reset does not answer in time).
_RESET_BOUND_S = 1.0

#: asyncpg's refusal of a statement on a connection whose protocol is not idle, raised before it
#: writes anything (``CoreProtocol._set_state``): the module docstring.
_REFUSED_UNSENT = re.compile(r"cannot switch to state \d+; ")


class _RefusedUnsent(Exception):
    """The call was refused by asyncpg before anything was written; its connection is gone."""


async def pooled_call(pool: asyncpg.Pool, seconds: float | None,
                      call: Callable[[asyncpg.Connection], Awaitable[T]],
                      what: Callable[[], str], *, leaves_session_state: bool = False) -> T:
    """``await call(conn)`` on a connection of ``pool``; ``seconds`` (None: unbounded) bounds
    it, the acquire included: past it the connection is terminated, the pool's others expired,
    and CallTimeoutError raised (module docstring). ``what()`` names the call in messages.

    ``call`` is one statement of zeroth_pg's SQL API. A connection it answered on is given back
    without the pool's reset query (:func:`zeroth_pg._connect.released_as_found`): a round trip
    and five statements per call, and the reset's RESET ALL also dropped the session's claim
    floors (sql/functions/internal/claim_floor.sql) after every call. ``leaves_session_state``:
    ``call`` is one that leaves session state behind on purpose (announce_idle's session advisory
    locks, which are not even let go by a rollback): its connection is reset in full, as for
    any other use, so a pooled connection never keeps a scope's wakeup gate.

    The bound on the call itself is a timer that terminates the connection, not a
    cancellation: asyncpg answers a cancelled query with a cancel request on a new connection
    to the same (hung) server. A timer costs one scheduled callback per call, where a task and a
    shield around every call cost the worker's hot path a measurable share of its CPU."""
    loop = asyncio.get_running_loop()
    deadline = None if seconds is None else loop.time() + seconds
    # A pool of n connections can hand out at most n that the server ended: the n + 1st try is
    # on a connection opened afresh.
    refusal: BaseException | None = None
    for _ in range(pool.get_max_size() + 1):
        try:
            return await _one_try(pool, deadline, seconds, call, what, leaves_session_state)
        except _RefusedUnsent as refused:
            refusal = refused.__cause__
            log.info("%s: its connection had been ended by the server (%s); made again on "
                     "another connection", what(), refusal)
    raise ConnectionLostError(f"{what()}: every connection of the pool had been ended by the "
                              f"server ({refusal})") from refusal


async def _one_try(pool: asyncpg.Pool, deadline: float | None, seconds: float | None,
                   call: Callable[[asyncpg.Connection], Awaitable[T]],
                   what: Callable[[], str], leaves_session_state: bool) -> T:
    """One acquire and one call: :func:`pooled_call` without the repeat of a call that asyncpg
    refused unsent (raised as _RefusedUnsent, its connection terminated)."""
    loop = asyncio.get_running_loop()
    try:
        if deadline is None:
            conn = await pool.acquire()
        else:
            async with asyncio.timeout_at(deadline):
                conn = await pool.acquire()
    except TimeoutError:
        # Not expired here: every connection may only be busy (a pool smaller than the calls
        # in flight), and the calls that hold them on a hung server are cut by their own
        # timers, which expire the pool then.
        raise CallTimeoutError(f"{what()}: no connection of the pool within {seconds:g} s "
                               "(every connection busy, or every server unreachable or not "
                               "answering)") from None
    cut = _Cut(conn)
    timer = None if deadline is None else loop.call_at(deadline, cut)
    as_found = False
    try:
        result = await call(conn)
        as_found = not leaves_session_state
        return result
    except Exception as exc:
        if not cut.done:
            _raise_if_cache_lost(conn, exc, what)
            if (isinstance(exc, asyncpg.InternalClientError)
                    and _REFUSED_UNSENT.match(str(exc)) is not None):
                conn.terminate()
                raise _RefusedUnsent() from exc
            # Refused by the server: its statement, rolled back, left nothing behind.
            as_found = isinstance(exc, asyncpg.PostgresError) and not leaves_session_state
            raise
        # The timer terminated the connection under the call: asyncpg raised a lost
        # connection; say why.
        await _expire(pool)
        log.warning("%s got no answer within %g s: its connection was terminated and the "
                    "pool's connections are replaced (a hung or partitioned server?)",
                    what(), seconds)
        raise CallTimeoutError(
            f"{what()}: no answer within {seconds:g} s; its connection was terminated "
            "(whether it committed is unknown)") from None
    finally:
        if timer is not None:
            timer.cancel()
        # A reset has a bound of its own: a call that answered late has little of its own
        # left, and a reset cut short terminates a healthy connection. A release as found
        # sends nothing to wait for.
        await _release(pool, conn, None if as_found or deadline is None
                       else max(_RESET_BOUND_S, deadline - loop.time()), as_found)


def _raise_if_cache_lost(conn: Any, exc: Exception, what: Callable[[], str]) -> None:
    """A call refused with 26000 (a prepared statement that does not exist): zeroth_pg's SQL
    names none, so asyncpg's cached statement is gone from the session — code that shared the
    connection ran DEALLOCATE ALL or DISCARD ALL, which asyncpg's reset does not notice — and
    every later call on it would be refused the same way. Nothing of this one ran: the
    connection is terminated (the pool opens a new one) and a retryable ConnectionLostError
    raised. Only for a statement of asyncpg's naming (``__asyncpg_stmt_…``): a 26000 raised
    inside the call (a DBA's trigger) is the server's answer, as any other refusal."""
    if (isinstance(exc, asyncpg.exceptions.InvalidSQLStatementNameError)
            and "__asyncpg_" in str(exc)):
        conn.terminate()
        log.warning("%s: asyncpg's prepared statement was gone from its session (a DEALLOCATE "
                    "ALL or DISCARD ALL on a pooled connection?); the connection is replaced",
                    what())
        raise ConnectionLostError(
            f"{what()}: the session lost asyncpg's prepared statements ({exc}); nothing ran, "
            "the connection is replaced: retry") from exc


class _Cut:
    """The timer's callback: terminate the connection of a call past its bound."""

    __slots__ = ("conn", "done")

    def __init__(self, conn: Any) -> None:
        self.conn, self.done = conn, False

    def __call__(self) -> None:
        self.done = True
        self.conn.terminate()


async def _release(pool: asyncpg.Pool, conn: Any, seconds: float | None,
                   as_found: bool) -> None:
    """Give ``conn`` back, its reset (when it needs one: ``as_found`` False) bounded too: a
    server that froze after answering holds the reset query (asyncpg then terminates the
    connection). A failure here concerns the connection only, never the call's answer."""
    try:
        if as_found:
            with released_as_found():
                await pool.release(conn, timeout=seconds)
        else:
            await pool.release(conn, timeout=seconds)
    except Exception as exc:  # asyncpg terminated it: the pool opens a new one
        log.debug("releasing a connection failed (%s: %s)", type(exc).__name__, exc)
        await _expire(pool)


async def _expire(pool: asyncpg.Pool) -> None:
    with_expire = getattr(pool, "expire_connections", None)
    if with_expire is not None:
        await with_expire()
