"""16 sessions enqueue with the same idempotency key at once: one run, one creator.

Every caller must get the same run_id back; exactly one sees created = true; the table holds one
row for the key. Covered three ways: a free-for-all, a pile-up behind an open transaction that
commits, and the same pile-up when the first creator rolls back (one of the waiters must then
create the run).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

SESSIONS = 16
DEPLOYMENT = "idem"

ENQUEUE = """SELECT e.run_id, e.created, e.status::text FROM zeroth.enqueue_run(
                 deployment_ref => $1, idempotency_key => $2, payload => $3::text::jsonb) e"""


async def rows_for_key(connection: asyncpg.Connection, key: str) -> list[asyncpg.Record]:
    return await connection.fetch(  # type: ignore[no-any-return]
        "SELECT r.run_id, r.payload FROM zeroth.runs r WHERE r.idempotency_key = $1", key)


async def wait_until_blocked(monitor: asyncpg.Connection, pids: list[int]) -> None:
    """Poll until every pid is waiting on a lock (the open transaction's index entry)."""
    for _ in range(2000):
        waiting = await monitor.fetchval(
            """SELECT count(*) FROM pg_stat_activity a
                WHERE a.pid = ANY ($1::int[]) AND a.wait_event_type = 'Lock'""", pids)
        if waiting == len(pids):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the enqueuers never queued behind the open transaction")


class TestSameKeyConcurrently:
    async def test_sixteen_concurrent_enqueues_create_exactly_one_run(
            self, connect: Any) -> None:
        sessions = list(await asyncio.gather(*(connect() for _ in range(SESSIONS))))
        for round_no in range(25):
            key = f"key-{round_no}"
            results = await asyncio.gather(*(
                session.fetchrow(ENQUEUE, DEPLOYMENT, key, f'{{"caller": {i}}}')
                for i, session in enumerate(sessions)))
            assert [row["created"] for row in results].count(True) == 1, round_no
            assert len({row["run_id"] for row in results}) == 1, round_no
            assert {row["status"] for row in results} == {"pending"}
            stored = await rows_for_key(sessions[0], key)
            assert len(stored) == 1
            assert stored[0]["run_id"] == results[0]["run_id"]
            # The stored run is the creator's, not a later caller's payload.
            creator = next(i for i, row in enumerate(results) if row["created"])
            assert stored[0]["payload"] == f'{{"caller": {creator}}}'


class TestSameKeyBehindAnOpenTransaction:
    async def test_waiters_return_the_committed_run_without_creating_another(
            self, connect: Any) -> None:
        first = await connect()
        others = list(await asyncio.gather(*(connect() for _ in range(SESSIONS - 1))))
        monitor = await connect()
        async with first.transaction():
            mine = await first.fetchrow(ENQUEUE, DEPLOYMENT, "held", '{"caller": 0}')
            assert mine["created"]
            pending = [asyncio.ensure_future(
                session.fetchrow(ENQUEUE, DEPLOYMENT, "held", f'{{"caller": {i + 1}}}'))
                for i, session in enumerate(others)]
            await wait_until_blocked(monitor, [s.get_server_pid() for s in others])
        results = await asyncio.gather(*pending)
        assert [row["created"] for row in results] == [False] * (SESSIONS - 1)
        assert {row["run_id"] for row in results} == {mine["run_id"]}
        stored = await rows_for_key(monitor, "held")
        assert [row["run_id"] for row in stored] == [mine["run_id"]]

    async def test_when_the_first_creator_rolls_back_exactly_one_waiter_creates_the_run(
            self, connect: Any) -> None:
        first = await connect()
        others = list(await asyncio.gather(*(connect() for _ in range(SESSIONS - 1))))
        monitor = await connect()
        transaction = first.transaction()
        await transaction.start()
        doomed = await first.fetchrow(ENQUEUE, DEPLOYMENT, "rolled-back", '{"caller": 0}')
        assert doomed["created"]
        pending = [asyncio.ensure_future(
            session.fetchrow(ENQUEUE, DEPLOYMENT, "rolled-back", f'{{"caller": {i + 1}}}'))
            for i, session in enumerate(others)]
        await wait_until_blocked(monitor, [s.get_server_pid() for s in others])
        await transaction.rollback()
        results = await asyncio.gather(*pending)
        assert [row["created"] for row in results].count(True) == 1
        assert len({row["run_id"] for row in results}) == 1
        assert results[0]["run_id"] != doomed["run_id"]
        stored = await rows_for_key(monitor, "rolled-back")
        assert [row["run_id"] for row in stored] == [results[0]["run_id"]]
