"""enqueue_runs batches never deadlock with each other or with a worker, and both callers get
their runs, interleaved by real sessions.

* Two batches [T1, T2] and [T2, T1] do not deadlock: every thread lock of a batch is taken in
  one sorted order first.
* A batch naming two busy threads and the worker renewing or completing their active runs lock
  those runs in one order (slots then runs, each in run_id order).
* Batches that name the same keys in contradicting ways (the same run_id with two idempotency
  keys) can still meet in a deadlock inside their INSERTs; the batch PostgreSQL picks as the
  victim runs again by itself, so both callers get their runs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from helpers import DEPLOYMENT
from interleave import Session, assert_waits_for, finished


class TestBatchesOfThreadsCannotDeadlock:
    async def test_two_batches_naming_two_threads_in_opposite_orders(self, sessions, connect):
        first, second, db = sessions
        holder = Session(await connect())
        # Hold T1's thread lock, so the first batch stops inside its locking and the second
        # arrives while it waits: on main the second then held T2 and waited for T1, while the
        # first held T1 and waited for T2.
        await holder.begin()
        await holder.call("SELECT zeroth._lock_thread('default', '', 'T1')")
        batch = """SELECT run_id, status::text FROM zeroth.enqueue_runs(deployment_ref => $1,
                       runs => $2::text::jsonb) ORDER BY ordinality"""
        items = [{"thread_id": "T1"}, {"thread_id": "T2"}]
        a = first.spawn(batch, DEPLOYMENT, json.dumps(items), rows=True)
        await assert_waits_for(db, first, holder, a)
        b = second.spawn(batch, DEPLOYMENT, json.dumps(items[::-1]), rows=True)
        await wait_blocked(db, second)
        await holder.commit()

        outcomes = [await finished(a), await finished(b)]
        assert [o.sqlstate for o in outcomes] == [None, None]
        statuses = sorted(r["status"] for o in outcomes for r in o.value)
        assert statuses == ["pending", "pending", "waiting", "waiting"]  # one active per thread


class TestABatchAndTheWorkerLockActiveRunsInOneOrder:
    """renew_leases and complete_runs lock a worker's runs in run_id order; a batch naming two
    busy threads against the order of their active runs' ids must not deadlock with the worker
    holding both (as it would admitting its thread items in item order, each locking its
    thread's active run and slot as it went). The batch locks every active run of its threads
    first, slots then runs, each in run_id order. A third session only fixes the interleaving:
    it holds one row for a moment, as a call in flight would."""

    A1, A2 = uuid.UUID(int=1), uuid.UUID(int=2)
    BATCH = """SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,
                   runs => '[{"thread_id": "T2"}, {"thread_id": "T1"}]')"""

    async def busy_threads(self, db: Any, max_concurrency: int | None) -> dict[Any, int]:
        for run_id, thread in ((self.A1, "T1"), (self.A2, "T2")):
            await db.execute("SELECT zeroth.enqueue_run(deployment_ref => $1, run_id => $2, "
                             "thread_id => $3)", DEPLOYMENT, run_id, thread)
        rows = await db.fetch(
            """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
                   worker_id => 'W', max_concurrency => $2, batch_size => 2)
                WHERE run_id IS NOT NULL""", DEPLOYMENT, max_concurrency)
        assert {row["run_id"] for row in rows} == {self.A1, self.A2}
        return {row["run_id"]: row["lease_generation"] for row in rows}

    async def settle(self, db: Any, session: Session, task: Any) -> None:
        """Until the task finished or waits for a lock (either is fine here)."""
        for _ in range(400):
            if task.done() or await db.fetchval(
                    "SELECT cardinality(pg_blocking_pids($1)) > 0", session.pid):
                return
            await asyncio.sleep(0.005)

    async def test_against_renew_leases(self, sessions, connect):
        producer, worker, db = sessions
        generations = await self.busy_threads(db, max_concurrency=10)
        holder = Session(await connect())
        await holder.begin()
        await holder.call("SELECT 1 FROM zeroth.admission_slots WHERE run_id = $1 FOR UPDATE",
                          self.A1)
        batch = producer.spawn(self.BATCH, DEPLOYMENT)
        await assert_waits_for(db, producer, holder, batch)
        renewal = worker.spawn(
            """SELECT count(*) FILTER (WHERE renewed) FROM zeroth.renew_leases(worker_id => 'W',
                   run_ids => $1, generations => $2)""",
            [self.A1, self.A2], [generations[self.A1], generations[self.A2]])
        await self.settle(db, worker, renewal)
        await holder.commit()

        outcomes = [await finished(batch), await finished(renewal)]
        assert [o.sqlstate for o in outcomes] == [None, None], outcomes
        assert [o.value for o in outcomes] == [2, 2]

    async def test_against_complete_runs(self, sessions, connect):
        producer, worker, db = sessions
        generations = await self.busy_threads(db, max_concurrency=None)
        holder = Session(await connect())
        await holder.begin()
        await holder.call("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", self.A1)
        completion = worker.spawn(
            """SELECT count(*) FILTER (WHERE completed) FROM zeroth.complete_runs(worker_id => 'W',
                   run_ids => $1, generations => $2)""",
            [self.A1, self.A2], [generations[self.A1], generations[self.A2]])
        await assert_waits_for(db, worker, holder, completion)
        batch = producer.spawn(self.BATCH, DEPLOYMENT)
        await self.settle(db, producer, batch)
        await holder.commit()

        outcomes = [await finished(completion), await finished(batch)]
        assert [o.sqlstate for o in outcomes] == [None, None], outcomes
        assert [o.value for o in outcomes] == [2, 2]


class TestBatchesThatContradictEachOtherStillBothLand:
    async def test_two_batches_naming_two_run_ids_with_crossed_keys(self, sessions, connect):
        """b1 = [(Y, 'a'), (X, 'c')], b2 = [(X, 'a2'), (Y, 'c2')] insert Y then X and X then Y:
        each waits for the other's uncommitted primary key, PostgreSQL kills one with 40P01, and
        that batch runs again by itself: both land. A third session makes the interleaving
        certain: it holds an uncommitted run Z that b1 also names, so b1 has inserted Y and waits
        on Z when b2 inserts X and waits on b1's Y; then Z commits, b1 reaches X, and the cycle
        closes."""
        first, second, db = sessions
        holder = Session(await connect())
        x, y, z = (uuid.UUID(int=n) for n in (0xA, 0xB, 0xC))
        batch = """SELECT ordinality, run_id, created FROM zeroth.enqueue_runs(deployment_ref => $1,
                       runs => $2::text::jsonb) ORDER BY ordinality"""
        await holder.begin()
        await holder.call(batch, DEPLOYMENT, json.dumps(
            [{"run_id": str(z), "idempotency_key": "zz"}]))
        a = first.spawn(batch, DEPLOYMENT, json.dumps([
            {"run_id": str(y), "idempotency_key": "a"}, {"run_id": str(z), "idempotency_key": "b"},
            {"run_id": str(x), "idempotency_key": "c"}]), rows=True)
        await assert_waits_for(db, first, holder, a)
        b = second.spawn(batch, DEPLOYMENT, json.dumps([
            {"run_id": str(x), "idempotency_key": "a2"},
            {"run_id": str(y), "idempotency_key": "c2"}]), rows=True)
        await wait_blocked(db, second)
        await holder.commit()

        outcomes = [await finished(a), await finished(b)]
        assert [o.sqlstate for o in outcomes] == [None, None], outcomes
        # Each run id exists once, with the key of whichever batch inserted it; both batches
        # report every run id they named.
        keys = dict(await db.fetch(
            "SELECT r.run_id, r.idempotency_key FROM zeroth.runs r WHERE r.run_id = ANY ($1)",
            [x, y, z]))
        assert set(keys) == {x, y, z}
        assert [r["run_id"] for r in outcomes[0].value] == [y, z, x]
        assert [r["run_id"] for r in outcomes[1].value] == [x, y]
        created = [r["created"] for o in outcomes for r in o.value]
        assert created.count(True) == 2  # X and Y once each; Z was the holder's

    @pytest.mark.parametrize(("items", "subtransaction"), [
        ([{}, {}], False), ([{"idempotency_key": "k"}, {}], True)], ids=["no-keys", "keys"])
    async def test_only_a_batch_with_keys_pays_for_the_retry(self, connect, items,
                                                             subtransaction):
        """The retry costs a subtransaction; batches that name no key cannot deadlock this way
        and take none (their rows carry the top-level transaction id)."""
        conn = await connect()
        async with conn.transaction():
            await conn.fetch("SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, "
                             "runs => $2::text::jsonb)", DEPLOYMENT, json.dumps(items))
            top = await conn.fetchval("SELECT pg_current_xact_id()::text")
            xmins = {row["xmin"] for row in await conn.fetch(
                "SELECT r.xmin::text AS xmin FROM zeroth.runs r WHERE r.deployment_ref = $1",
                DEPLOYMENT)}
        assert len(xmins) == 1
        assert (xmins != {top}) is subtransaction


async def wait_blocked(db: Any, session: Session) -> None:
    for _ in range(1000):
        if await db.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", session.pid):
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the second batch never waited")
