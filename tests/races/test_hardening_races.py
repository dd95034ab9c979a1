"""Interleavings of real sessions around slots, batch thread locks and admission retries.

* A renewal refused because another session re-leased the run into another slot in between
  leaves no zombie slot counting against K for a whole lease: a slot holds no copy of the
  lease, it names (run, generation), so a slot whose run moved on is free however the renewal
  ended.
* Two enqueue_runs batches [T1, T2] and [T2, T1] do not deadlock: every thread lock of a batch
  is taken in one sorted order first.
  Batches that name the same keys in contradicting ways (the same run_id with two idempotency
  keys) can still meet in a deadlock inside their INSERTs; the batch PostgreSQL picks as the
  victim now runs again by itself, so both callers get their runs.
* Concurrent retries of one admission (same idempotency key or run_id, different payloads) are
  each ``reused``, never ``busy`` for their own run.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from helpers import DEPLOYMENT, at, enqueue, make_run, run_row
from interleave import Session, assert_waits_for, finished

K = 2
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => 'worker-a', generation => 1,
               now_override => $2)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => 'worker-c', max_concurrency => $2,
                        now_override => $3) WHERE run_id IS NOT NULL"""
CLAIM = """SELECT run_id, concurrency_saturated, active_count FROM zeroth_test.claim_pending(
               deployment_ref => $1, worker_id => 'worker-d', max_concurrency => $2,
               now_override => $3)"""
LIVE_SLOTS = """SELECT count(*) FROM zeroth_test.slot_leases s
                 WHERE s.deployment_ref = $1 AND s.lease_expires_at >= $2"""


class TestRefusedRenewalLeavesNoZombieSlot:
    async def test_renewal_refused_after_a_re_lease_into_another_slot(self, sessions):
        renewer, rescuer, db = sessions
        lease = await make_run(db, "running", max_concurrency=K)  # slot 1, generation 1, to 60
        # The rescuer holds the run row, so the renewal (which sampled 59, inside its lease)
        # cannot finish before the re-lease: on main it had already renewed its slot row.
        await rescuer.begin()
        await rescuer.call("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", lease.run_id)
        renewal = renewer.spawn(RENEW, lease.run_id, at(59))
        await assert_waits_for(db, renewer, rescuer, renewal)
        taken = (await rescuer.rows(CLAIM_ORPHANED, DEPLOYMENT, K, at(61))).value
        assert [(r["run_id"], r["lease_generation"]) for r in taken] == [(lease.run_id, 2)]
        await rescuer.commit()

        assert (await finished(renewal)).value is False
        # One live lease in the scope: a second run is admitted under K = 2.
        assert await db.fetchval(LIVE_SLOTS, DEPLOYMENT, at(62)) == 1
        waiting = await enqueue(db, now=at(62))
        rows = await db.fetch(CLAIM, DEPLOYMENT, K, at(62))
        assert [(r["run_id"], r["concurrency_saturated"], r["active_count"]) for r in rows] == [
            (waiting, False, 1)]
        row = await run_row(db, lease.run_id)
        assert (row["lease_worker_id"], row["lease_generation"]) == ("worker-c", 2)


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
    """Red-team finding F3 (after 0008): a batch admitted its thread items in item order, each
    locking its thread's active run (and slot) as it went, while renew_leases and complete_runs
    lock a worker's runs in run_id order. A batch naming two busy threads against the order of
    their active runs' ids deadlocked with the worker holding both. The batch now locks every
    active run of its threads first, slots then runs, each in run_id order. A third session only
    fixes the interleaving: it holds one row for a moment, as a call in flight would."""

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
        """Red-team finding (after issue 11): b1 = [(Y, 'a'), (X, 'c')], b2 = [(X, 'a2'),
        (Y, 'c2')] insert Y then X and X then Y: each waits for the other's uncommitted primary
        key, PostgreSQL kills one with 40P01. A third session makes the interleaving certain: it
        holds an uncommitted run Z that b1 also names, so b1 has inserted Y and waits on Z when
        b2 inserts X and waits on b1's Y; then Z commits, b1 reaches X, and the cycle closes."""
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


class TestConcurrentRetriesOfOneAdmission:
    async def test_twelve_retries_with_one_key_all_get_the_one_run(self, connect):
        sessions = [await connect() for _ in range(12)]

        async def admit(conn: Any, n: int) -> Any:
            return await conn.fetchrow(
                """SELECT outcome, run_id FROM zeroth.admit_run(deployment_ref => $1,
                       thread_id => 'retried', strategy => 'reject', idempotency_key => 'req-1',
                       payload => $2::text::jsonb)""", DEPLOYMENT, json.dumps({"body": n}))

        results = await asyncio.gather(*(admit(c, n) for n, c in enumerate(sessions)))

        assert sorted(r["outcome"] for r in results) == ["admitted"] + ["reused"] * 11
        assert len({r["run_id"] for r in results}) == 1
        db = sessions[0]
        assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 1

    async def test_twelve_retries_with_one_run_id_all_get_the_one_run(self, connect):
        sessions = [await connect() for _ in range(12)]
        run_id = "6f1c1b0e-7d2a-4f7e-9c57-1e0cfb2b2a10"

        async def admit(conn: Any) -> Any:
            return await conn.fetchrow(
                """SELECT outcome, run_id FROM zeroth.admit_run(deployment_ref => $1,
                       thread_id => 'retried', strategy => 'reject', run_id => $2::uuid)""",
                DEPLOYMENT, run_id)

        results = await asyncio.gather(*(admit(c) for c in sessions))

        assert sorted(r["outcome"] for r in results) == ["admitted"] + ["reused"] * 11
        assert {str(r["run_id"]) for r in results} == {run_id}
