"""zeroth.expire_recovery_lease: make owned running work reclaimable at once, losing nothing.

For exactly (worker_id, generation) of a running run: lease_expires_at := now - 1 µs, holder and
recovery checkpoint kept, slot freed (used when the setup of a recovered run fails, F-02).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from helpers import DEPLOYMENT, WORKER, at, listen, make_run, run_row, wakeup_key

EXPIRE = """SELECT zeroth_test.expire_recovery_lease(run_id => $1, worker_id => $2,
                generation => $3,
                tenant_id => $4, workspace_id => $5, now_override => $6)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation, recovery_checkpoint_id, checkpoint_data
                      FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
                          max_concurrency => $3, now_override => $4)
                     WHERE run_id IS NOT NULL"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => $4::text::jsonb, now_override => $5)"""
COMMIT = """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                columns => '{"progress": {"step": 9}}', now_override => $4)"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
RECOVERED_AT = at(61)
NOW = at(70)
MICROSECOND = timedelta(microseconds=1)


async def expire(conn, run_id, worker_id=OTHER, generation=2, *, tenant_id=None,
                 workspace_id=None, now=NOW):
    return await conn.fetchval(EXPIRE, run_id, worker_id, generation, tenant_id, workspace_id,
                               now)


async def claim_orphaned(conn, worker_id, *, max_concurrency=None, now=NOW):
    return await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, worker_id, max_concurrency, now)


async def recovered_run(conn, *, max_concurrency=None):
    """A running run with a checkpoint, recovered by OTHER as generation 2 at RECOVERED_AT."""
    lease = await make_run(conn, "running", max_concurrency=max_concurrency)
    checkpoint = await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, '{"step": 1}',
                                     at(1))
    rows = await claim_orphaned(conn, OTHER, max_concurrency=max_concurrency, now=RECOVERED_AT)
    assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]
    return lease.run_id, checkpoint



class TestExpireRunningLease:
    async def test_expire_sets_the_lease_just_before_now_and_keeps_the_holder(self, conn):
        run_id, _ = await recovered_run(conn)
        before = await run_row(conn, run_id)

        assert await expire(conn, run_id) is True

        row = await run_row(conn, run_id)
        assert row["status"] == "running"
        assert row["lease_expires_at"] == NOW - MICROSECOND
        assert row["lease_worker_id"] == OTHER
        assert row["lease_acquired_at"] == before["lease_acquired_at"]
        assert row["lease_generation"] == 2
        assert row["attempts"] == before["attempts"]

    async def test_expire_keeps_the_recovery_checkpoint(self, conn):
        run_id, checkpoint = await recovered_run(conn)
        assert (await run_row(conn, run_id))["recovery_checkpoint_id"] == checkpoint

        await expire(conn, run_id)

        assert (await run_row(conn, run_id))["recovery_checkpoint_id"] == checkpoint

    async def test_expired_run_is_claimable_at_once_by_claim_orphaned(self, conn):
        run_id, checkpoint = await recovered_run(conn)
        await expire(conn, run_id)

        rows = await claim_orphaned(conn, "worker-c", now=NOW)

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(run_id, 3)]
        assert rows[0]["recovery_checkpoint_id"] == checkpoint
        assert json.loads(rows[0]["checkpoint_data"]) == {"step": 1}

    async def test_expired_holder_is_fenced_out(self, conn):
        run_id, _ = await recovered_run(conn)
        await expire(conn, run_id)
        before = await run_row(conn, run_id)

        assert await conn.fetchval(COMMIT, run_id, OTHER, 2, NOW) is False

        assert dict(await run_row(conn, run_id)) == dict(before)

    async def test_expire_of_a_first_generation_running_run(self, conn):
        lease = await make_run(conn, "running")

        assert await expire(conn, lease.run_id, WORKER, 1, now=at(10)) is True

        rows = await claim_orphaned(conn, OTHER, now=at(10))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

class TestExpireFreesTheSlot:
    async def test_expire_frees_the_slot_and_the_run_is_reclaimed_under_the_limit(self, conn):
        run_id, _ = await recovered_run(conn, max_concurrency=1)
        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (run_id, OTHER, 2)

        await expire(conn, run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        assert (await run_row(conn, run_id))["admission_slot"] is None
        rows = await claim_orphaned(conn, "worker-c", max_concurrency=1, now=NOW)
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(run_id, 3)]
        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (run_id, "worker-c", 3)

class TestExpireNotifiesWakeup:
    async def test_expire_notifies_the_runs_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running")
        queue = await listen(listener, "zeroth_wakeup")

        assert await expire(actor, lease.run_id, WORKER, 1, now=at(10)) is True

        payload = await asyncio.wait_for(queue.get(), timeout=10)
        assert payload == await wakeup_key(actor, DEPLOYMENT, "default", None)


