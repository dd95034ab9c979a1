"""Scripted interleavings of real sessions: hold a transaction open in one, act in another.

A :class:`Session` is one connection that can keep its transaction open while another session
calls a conflicting function in the background; :func:`assert_waits_for` and
:func:`finishes_without_waiting` tell "blocked on the holder's lock" from "went through" by
polling ``pg_blocking_pids`` (the holder keeps its locks until the test ends it, so a waiting call
is always seen waiting).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg

# Generous failure bound for "B is blocked" / "B finished"; never a measured duration.
DEADLINE = 5.0


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one call returned (a value or rows), or the SQLSTATE it raised."""

    value: Any = None
    sqlstate: str | None = None


class Session:
    """One connection that can hold a transaction open while another session acts."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.pid: int = conn.get_server_pid()
        self.tasks: list[asyncio.Task[Outcome]] = []
        self._tx: Any = None

    async def begin(self) -> None:
        self._tx = self.conn.transaction()
        await self._tx.start()

    async def commit(self) -> None:
        await self._tx.commit()

    async def rollback(self) -> None:
        await self._tx.rollback()

    async def call(self, query: str, *args: Any) -> Outcome:
        try:
            return Outcome(value=await self.conn.fetchval(query, *args))
        except asyncpg.PostgresError as exc:
            return Outcome(sqlstate=exc.sqlstate)

    async def rows(self, query: str, *args: Any) -> Outcome:
        try:
            return Outcome(value=[dict(row) for row in await self.conn.fetch(query, *args)])
        except asyncpg.PostgresError as exc:
            return Outcome(sqlstate=exc.sqlstate)

    def spawn(self, query: str, *args: Any, rows: bool = False) -> asyncio.Task[Outcome]:
        """Run the call in the background (it may block on a lock)."""
        task = asyncio.ensure_future(self.rows(query, *args) if rows else self.call(query, *args))
        self.tasks.append(task)
        return task


async def blockers(db: asyncpg.Connection, waiter: Session) -> list[int]:
    return list(await db.fetchval("SELECT pg_blocking_pids($1)", waiter.pid))


async def assert_waits_for(db: asyncpg.Connection, waiter: Session, holder: Session,
                           task: asyncio.Task[Outcome]) -> None:
    """The waiter's call is blocked on a lock that the holder's open transaction holds."""
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while holder.pid not in await blockers(db, waiter):
        assert not task.done(), f"expected to wait for the open transaction, got {task.result()}"
        assert asyncio.get_running_loop().time() < deadline, "the call never blocked"
        await asyncio.sleep(0.005)


async def finishes_without_waiting(db: asyncpg.Connection, waiter: Session,
                                   task: asyncio.Task[Outcome]) -> Outcome:
    """The call completes and is never seen waiting on a lock (the open transaction holds its
    locks until the test ends it, so a waiting call would be seen waiting)."""
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while not task.done():
        held_by = await blockers(db, waiter)
        assert not held_by, f"the call waited on a lock held by {held_by}"
        assert asyncio.get_running_loop().time() < deadline, "the call never finished"
        await asyncio.sleep(0.002)
    return task.result()


async def finished(task: asyncio.Task[Outcome]) -> Outcome:
    return await asyncio.wait_for(task, timeout=DEADLINE)


def only(outcome: Outcome) -> dict[str, Any]:
    assert outcome.sqlstate is None, outcome
    assert len(outcome.value) == 1, outcome.value
    return outcome.value[0]  # type: ignore[no-any-return]
