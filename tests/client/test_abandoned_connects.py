"""A connection attempt that zeroth_pg abandons half-way leaves nothing for asyncio to report.

During a failover zeroth_pg gives up connection attempts in flight: a pass over a multi-host
DSN drops the other hosts' attempts once one host takes writes (zeroth_pg/_connect.py), and a
call's bound gives up a pool acquire that is opening a connection (zeroth_pg/_bounded.py).
asyncpg (0.32) opens a TCP connection with ``sslmode=prefer`` (the default) through a
throw-away protocol whose future carries the server's answer to the SSL request. Cancelled
after the TCP connection is made but before ``loop.create_connection`` returned, nobody awaits
that future: the transport's close sets it to ``ConnectionError("unexpected connection_lost()
call")`` and asyncio logs "Future exception was never retrieved" at ERROR when it is collected —
0 to 5 times per worker process in every HA test (issue 35, docs/dba-guide.md).

The window is one or two turns of the event loop, so each test cancels an attempt after every
number of turns from 0 to well past a loopback connection's, through a TCP proxy in front of
the test's server (the embedded server listens on a Unix socket; the SSL request goes over TCP
only), and asserts that the loop's exception handler heard of nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
from tcp_proxy import TcpProxy, server_target, uri_through

import zeroth_pg

#: Turns of the event loop before the cancellation: 0 to this many (a loopback connection is made
#: within a few; the SSL request answered a few more later).
TURNS = 40


@contextlib.asynccontextmanager
async def _tcp_dsn(database_dsn: str, hosts: int = 1) -> AsyncIterator[str]:
    """A URI reaching the test's database over TCP through ``hosts`` proxies (a multi-host
    DSN with ``target_session_attrs=read-write`` when more than one)."""
    target = server_target(database_dsn)
    proxies = [TcpProxy(target) for _ in range(hosts)]
    for proxy in proxies:
        await proxy.start()
    extra = "?target_session_attrs=read-write" if hosts > 1 else ""
    try:
        yield uri_through(target, proxies, extra)
    finally:
        for proxy in proxies:
            await proxy.close()


async def _reported_while_abandoning(open_one: Callable[[], Awaitable[Any]]) -> list[str]:
    """Start ``open_one()`` and cancel it after 0, 1, … :data:`TURNS` turns of the event loop
    (a connection it returned anyway is closed); what the loop's exception handler was given
    meanwhile, after every abandoned object was collected."""
    loop = asyncio.get_running_loop()
    reported: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(
        lambda _loop, context: reported.append(
            f"{context.get('message')}: {context.get('exception')!r}"))
    try:
        for turns in range(TURNS + 1):
            task = asyncio.ensure_future(open_one())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            try:
                conn = await task
            except asyncio.CancelledError:
                pass
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                pass
            else:
                await conn.close()
        # Whatever was abandoned finishes (its connection closed) and is collected: a future
        # whose exception nobody retrieved is reported when it is.
        await asyncio.sleep(0.5)
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    return reported


async def test_a_connect_abandoned_at_any_point_leaves_no_unretrieved_future(
        database_dsn: str) -> None:
    async with _tcp_dsn(database_dsn) as dsn:
        reported = await _reported_while_abandoning(lambda: zeroth_pg.connect(dsn))
    assert reported == []


async def test_a_pass_over_hosts_abandoned_at_any_point_leaves_no_unretrieved_future(
        database_dsn: str) -> None:
    # Two hosts with target_session_attrs=read-write: the checked connect of _connect.py, whose
    # pass abandons every attempt still in flight when it is cancelled (or has found a host).
    async with _tcp_dsn(database_dsn, hosts=2) as dsn:
        reported = await _reported_while_abandoning(lambda: zeroth_pg.connect(dsn))
    assert reported == []


async def test_a_pool_acquire_abandoned_at_any_point_leaves_no_unretrieved_future(
        database_dsn: str) -> None:
    # A call's bound gives up an acquire that is opening the pool's connection.
    async with _tcp_dsn(database_dsn, hosts=2) as dsn:
        pool = await zeroth_pg.create_pool(dsn, min_size=0, max_size=1)
        try:
            async def acquire_one() -> Any:
                conn = await pool.acquire()
                await pool.release(conn)
                await pool.expire_connections()
                raise asyncio.CancelledError  # nothing to close: the pool owns it

            reported = await _reported_while_abandoning(acquire_one)
        finally:
            await pool.close()
    assert reported == []
