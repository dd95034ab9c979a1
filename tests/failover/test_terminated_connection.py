"""A pooled connection whose server ended it while it sat idle (a switchover's fast shutdown,
``pg_terminate_backend``) and that asyncpg has not yet seen close.

The server sends such a connection a FATAL ErrorResponse (57P01) and then closes it. asyncpg
reads the error while it has no query out, cannot place it, and puts the protocol in its
"error consume" state (2); it marks the connection closed only when it reads the end of the
stream, an event-loop turn or more later. A query started on it in between fails with
``InternalClientError: cannot switch to state 12; another operation (2) is in progress``
(state 11 for a statement not yet prepared) — the message seen in a worker's log at a Patroni
switchover (issue 35). No two operations of zeroth_pg overlap there: asyncpg refuses the
statement before it writes anything (``_set_state`` comes first), so nothing of the call reached
a server, and ``pooled_call`` makes it again on another connection instead of failing it.

Here a proxy between the pool and the server holds back the end of the server's stream after
forwarding the error, so the window a switchover opens for a turn of the event loop stays open
until the test closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from failover_support import eventually
from tcp_proxy import TcpProxy, server_target, uri_through

import zeroth_pg
from zeroth_pg.client import LeaseManager

DEPLOYMENT = "terminated-connection"


class _LateEndProxy(TcpProxy):
    """A TCP proxy to the test's server that forwards every byte but holds back the end of the
    server's side of a connection (its FIN) until ``let_end()``."""

    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        self.server_ended = asyncio.Event()
        self.server_ends = 0
        self._ends = asyncio.Event()

    def let_end(self) -> None:
        self._ends.set()

    async def _ended(self, dst: asyncio.StreamWriter, *, from_server: bool) -> None:
        if from_server:
            self.server_ends += 1
            self.server_ended.set()
            await self._ends.wait()
        dst.close()

    async def close(self) -> None:
        self.let_end()
        await super().close()


@contextlib.asynccontextmanager
async def _late_end_proxy(database_dsn: str) -> AsyncIterator[tuple[str, _LateEndProxy]]:
    target = server_target(database_dsn)
    proxy = _LateEndProxy(target)
    await proxy.start()
    try:
        yield uri_through(target, [proxy]), proxy
    finally:
        await proxy.close()


async def _runs(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1", DEPLOYMENT))


async def test_a_call_on_a_connection_its_server_ended_is_made_on_another_one(
        database_dsn: str, pool: asyncpg.Pool) -> None:
    async with _late_end_proxy(database_dsn) as (proxy_dsn, proxy):
        # One connection, so the call after the termination can only get the ended one.
        worker_pool = await zeroth_pg.create_pool(proxy_dsn, min_size=1, max_size=1)
        try:
            lm = LeaseManager(worker_pool, call_timeout=60.0)
            await lm.enqueue_run(DEPLOYMENT, {"n": 1})
            backend = await worker_pool.fetchval("SELECT pg_backend_pid()")
            assert await pool.fetchval("SELECT pg_terminate_backend($1)", backend)
            # The proxy forwarded the server's FATAL and saw its end, which it holds back.
            await eventually(_set(proxy.server_ended), within=120,
                             what="the server to end the pooled connection")
            # One turn of the event loop reads the error: the connection is "error consume".
            await asyncio.sleep(0.1)
            # Before, this raised ConnectionLostError("cannot switch to state 11; another
            # operation (2) is in progress"), and the pool's connections were all expired.
            await lm.enqueue_run(DEPLOYMENT, {"n": 2})
            assert await _runs(pool) == 2  # made once: the refused try sent nothing
        finally:
            proxy.let_end()
            worker_pool.terminate()


def _set(event: asyncio.Event) -> Any:
    async def check() -> bool:
        return event.is_set()
    return check


async def test_a_call_goes_past_every_connection_a_switchover_ended(
        database_dsn: str, pool: asyncpg.Pool) -> None:
    """A switchover's shutdown ends every idle connection of the pool at once: the call is
    refused on each that the pool hands out, and made on the one opened afresh."""
    async with _late_end_proxy(database_dsn) as (proxy_dsn, proxy):
        worker_pool = await zeroth_pg.create_pool(proxy_dsn, min_size=3, max_size=3)
        try:
            lm = LeaseManager(worker_pool, call_timeout=60.0)
            held = [await worker_pool.acquire() for _ in range(3)]
            backends = [await conn.fetchval("SELECT pg_backend_pid()") for conn in held]
            for conn in held:
                await worker_pool.release(conn)
            assert await pool.fetchval(
                "SELECT bool_and(pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid",
                backends)
            await eventually(lambda: _ended(proxy, 3), within=120,
                             what="the server to end every pooled connection")
            await asyncio.sleep(0.1)  # a turn of the event loop reads each FATAL
            await lm.enqueue_run(DEPLOYMENT, {"n": 1})
            assert await _runs(pool) == 1
        finally:
            proxy.let_end()
            worker_pool.terminate()


async def _ended(proxy: _LateEndProxy, count: int) -> bool:
    return proxy.server_ends >= count
