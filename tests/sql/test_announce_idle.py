"""zeroth.announce_idle / zeroth.announce_busy and the wakeup gate they drive.

Writers NOTIFY zeroth_wakeup only while a waiting worker holds their stripe of the scope's gate
(sql/functions/internal/notify.sql). What must hold: a waiting worker is notified; a writer that
skipped its NOTIFY keeps its stripe until it commits, so the worker's claim after it gains that
stripe finds the run; no call ever waits on a gate lock; bad input changes nothing. Committed
sessions on a fresh database (NOTIFY is delivered at commit).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, announce_idle, listen, wakeup_key

from zeroth_pg.worker._gate import WAKEUP_STRIPES

ALL = list(range(8))
NOTIFY_TIMEOUT = 10  # only guards against a hang


async def busy(conn: asyncpg.Connection, deployment_ref: str = DEPLOYMENT,
               tenant_id: str | None = None, workspace_id: str | None = None) -> int:
    return int(await conn.fetchval(
        "SELECT zeroth.announce_busy(deployment_ref => $1, tenant_id => $2, workspace_id => $3)",
        deployment_ref, tenant_id, workspace_id))


async def gate_key(conn: asyncpg.Connection, deployment_ref: str = DEPLOYMENT) -> int:
    return int(await conn.fetchval(
        "SELECT zeroth._wakeup_lock('default', NULL, $1)", deployment_ref))


async def gate_locks(conn: asyncpg.Connection, pid: int) -> list[tuple[int, str]]:
    """The advisory locks a backend holds on the default scope's gate: (stripe, mode)."""
    key = await gate_key(conn)
    rows = await conn.fetch(
        """SELECT objid::bigint - ($2::bigint & 4294967295) AS stripe, mode FROM pg_locks
            WHERE locktype = 'advisory' AND pid = $1 AND granted
              AND classid::bigint = ($2::bigint >> 32) & 4294967295 ORDER BY objid""",
        pid, key)
    return [(int(r["stripe"]), r["mode"]) for r in rows]


async def enqueue(conn: asyncpg.Connection) -> Any:
    return await conn.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)", DEPLOYMENT)


async def heard_before_sentinel(queue: asyncio.Queue[str], sender: asyncpg.Connection) -> list[str]:
    """Everything the listener got before a marker sent in a later transaction (commit order)."""
    await sender.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")
    heard = []
    while (payload := await asyncio.wait_for(queue.get(), NOTIFY_TIMEOUT)) != "sentinel":
        heard.append(payload)
    return heard


class TestAnnounce:
    async def test_takes_every_stripe_as_a_session_lock_and_returns_them(self, connect):
        worker, other = await connect(), await connect()
        assert await announce_idle(worker) == ALL
        assert await gate_locks(other, worker.get_server_pid()) == [
            (s, "ExclusiveLock") for s in ALL]

    async def test_the_python_stripe_count_is_the_sql_one(self, connect):
        conn = await connect()
        assert await conn.fetchval("SELECT zeroth._wakeup_stripes()") == WAKEUP_STRIPES

    async def test_a_second_call_takes_nothing_twice_and_busy_lets_everything_go(self, connect):
        # What is held is read from pg_locks, not from the caller's list of held stripes: session
        # locks are re-entrant, so a second call with an empty list must not take every stripe
        # again, leaving them all held after one announce_busy.
        worker, other = await connect(), await connect()
        await announce_idle(worker)
        assert await announce_idle(worker) == ALL
        assert await busy(worker) == 8
        assert await gate_locks(other, worker.get_server_pid()) == []
        assert await announce_idle(other) == ALL

    async def test_a_second_waiting_session_gets_what_is_left_without_waiting(self, connect):
        first, second = await connect(), await connect()
        await first.execute("SELECT pg_advisory_lock($1::bigint + 3)", await gate_key(first))
        assert await announce_idle(second) == [s for s in ALL if s != 3]
        # Stripe 3, which the first took itself, counts as held; the rest are the second's.
        assert await announce_idle(first) == [3]

    async def test_busy_with_nothing_held_lets_nothing_go(self, connect):
        worker = await connect()
        assert await busy(worker) == 0

    async def test_scopes_have_their_own_gates(self, connect):
        a, b = await connect(), await connect()
        assert await announce_idle(a, DEPLOYMENT, "t1", None) == ALL
        assert await announce_idle(b, DEPLOYMENT, "t2", None) == ALL
        assert await announce_idle(b, "other-deployment", "t1", "w") == ALL


class TestWritersNotifyOnlyWhileAWorkerWaits:
    async def test_no_waiting_worker_no_notify(self, connect):
        listener, writer = await connect(), await connect()
        queue: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_wakeup", lambda *a: queue.put_nowait(a[3]))
        await enqueue(writer)
        assert await heard_before_sentinel(queue, writer) == []

    async def test_a_waiting_worker_is_notified_until_it_is_busy(self, connect):
        listener, writer = await connect(), await connect()
        queue = await listen(listener, "zeroth_wakeup")  # announce_idle on the default scope
        await enqueue(writer)
        assert await heard_before_sentinel(queue, writer) == [await wakeup_key(writer)]
        assert await busy(listener) == 8
        await enqueue(writer)
        assert await heard_before_sentinel(queue, writer) == []

    async def test_every_stripe_notifies(self, connect):
        # Writers pick the stripe of their transaction id: a worker holding all hears them all.
        listener, writer = await connect(), await connect()
        queue = await listen(listener, "zeroth_wakeup")
        for _ in range(16):
            await enqueue(writer)
        assert len(await heard_before_sentinel(queue, writer)) == 16


class TestAWriterInFlight:
    """The interleaving the gate exists for: a writer whose try-lock found no waiting worker did
    not notify; the worker that starts waiting afterwards must still find its run."""

    async def test_keeps_its_stripe_until_commit_and_the_next_claim_finds_its_run(self, connect):
        writer, worker = await connect(), await connect()
        transaction = writer.transaction()
        await transaction.start()
        run_id = await enqueue(writer)
        stripe = await writer.fetchval("SELECT (pg_current_xact_id()::text::bigint % 8)::int")

        held = await announce_idle(worker)  # the worker's claim found nothing: it waits now
        assert held == [s for s in ALL if s != stripe]
        claimed = await worker.fetch(
            "SELECT run_id FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'w')"
            " WHERE run_id IS NOT NULL",
            DEPLOYMENT)
        assert claimed == []  # not committed yet

        await transaction.commit()
        assert await announce_idle(worker) == ALL  # gained: look once more
        claimed = await worker.fetch(
            "SELECT run_id FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => 'w')"
            " WHERE run_id IS NOT NULL",
            DEPLOYMENT)
        assert [r["run_id"] for r in claimed] == [run_id]

    async def test_a_rolled_back_writer_frees_its_stripe(self, connect):
        writer, worker = await connect(), await connect()
        transaction = writer.transaction()
        await transaction.start()
        await enqueue(writer)
        assert len(await announce_idle(worker)) == 7
        await transaction.rollback()
        assert await announce_idle(worker) == ALL

    async def test_writers_never_wait_on_each_other_or_on_a_waiting_worker(self, connect):
        worker = await connect()
        await announce_idle(worker)
        writers = [await connect() for _ in range(4)]
        transactions = [w.transaction() for w in writers]
        for w, t in zip(writers, transactions, strict=True):
            await t.start()
            await w.execute("SET LOCAL lock_timeout = '100ms'")
            await enqueue(w)  # would raise 55P03 if any waited
        for t in transactions:
            await t.commit()


class TestBadInput:
    async def test_workspace_without_tenant_raises_zp006(self, connect):
        worker = await connect()
        with pytest.raises(asyncpg.PostgresError) as caught:
            await announce_idle(worker, DEPLOYMENT, None, "w")
        assert caught.value.sqlstate == "ZP006"

    @pytest.mark.parametrize("deployment_ref", [None, "", "x" * 300])
    async def test_bad_deployment_raises_zp008(self, connect, deployment_ref):
        worker, other = await connect(), await connect()
        with pytest.raises(asyncpg.PostgresError) as caught:
            await announce_idle(worker, deployment_ref)
        assert caught.value.sqlstate == "ZP008"
        assert await gate_locks(other, worker.get_server_pid()) == []


class TestLockTable:
    async def test_a_transaction_into_many_scopes_keeps_at_most_64_gate_locks(self, connect):
        """Every scope a transaction enqueues into would keep one advisory lock (never a
        fast-path lock) until commit, and 15,000 scopes would run the server's lock table out of
        shared memory: after 64 the transaction notifies instead."""
        writer, other = await connect(), await connect()
        transaction = writer.transaction()
        await transaction.start()
        for n in range(200):
            await writer.fetchval(
                "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)", f"fan-{n}")
        held = await other.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1",
            writer.get_server_pid())
        await transaction.commit()
        assert held == 64
        assert await other.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref LIKE 'fan-%'") == 200

    async def test_a_hostile_count_only_makes_its_own_transaction_notify(self, connect):
        # Nobody waits for work: a writer would not notify. Garbage counts as none; a count of
        # 64 or more makes that one transaction notify anyway (its own cost), for both gates:
        # the scope's and the deployment's.
        writer, listener = await connect(), await connect()
        queue: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_wakeup", lambda *a: queue.put_nowait(a[3]))
        async with writer.transaction():
            await writer.execute("SET LOCAL zeroth.wakeup_gate_locks = 'not a number'")
            await enqueue(writer)
        async with writer.transaction():
            await writer.execute("SET LOCAL zeroth.wakeup_gate_locks = '999999'")
            await enqueue(writer)
        heard = await heard_before_sentinel(queue, writer)
        deployment_key = await writer.fetchval("SELECT zeroth.deployment_wakeup_key($1)",
                                               DEPLOYMENT)
        assert sorted(heard) == sorted([await wakeup_key(writer), deployment_key])


class TestKeys:
    async def test_the_gate_key_is_not_the_payload(self, connect):
        # A payload a stranger hears must not name a lock in pg_locks.
        conn = await connect()
        payload = await wakeup_key(conn)
        gate = await gate_key(conn)
        assert gate != int(payload[:16], 16) & ~7
        assert gate & 7 == 0
