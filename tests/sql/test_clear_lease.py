"""zeroth.clear_lease: the admin's unfenced lease removal.

Pending: the lease is cleared. Running: the holder is kept and the lease expired in place, so
claim_orphaned recovers the run (clearing it would strand it, F-02). Frees the run's slots.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, claim, enqueue, listen, make_run, run_row, wakeup_key

CLEAR = """SELECT zeroth_test.clear_lease(run_id => $1, tenant_id => $2, workspace_id => $3,
               now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, max_concurrency => $3,
                        now_override => $4)
                     WHERE run_id IS NOT NULL"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)
MICROSECOND = timedelta(microseconds=1)


async def clear(conn, run_id, *, tenant_id=None, workspace_id=None, now=NOW):
    return await conn.fetchval(CLEAR, run_id, tenant_id, workspace_id, now)



async def assert_raises(conn, sqlstate, *args, **kwargs):
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await clear(conn, *args, **kwargs)
    assert info.value.sqlstate == sqlstate


class TestClearLeaseOfPendingRun:
    async def test_clear_removes_the_lease_of_a_claimed_pending_run(self, conn):
        lease = await make_run(conn, "claimed")

        assert await clear(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["lease_generation"] == 1
        assert row["updated_at"] == NOW

    async def test_cleared_pending_run_is_claimable_at_once_with_a_new_generation(self, conn):
        lease = await make_run(conn, "claimed")
        await clear(conn, lease.run_id)

        rows = await claim(conn, worker_id=OTHER, now=at(11))

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

class TestClearLeaseOfRunningRun:
    async def test_clear_keeps_the_holder_and_expires_the_lease_in_place(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await clear(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "running"
        assert row["lease_worker_id"] == WORKER
        assert row["lease_acquired_at"] == before["lease_acquired_at"]
        assert row["lease_expires_at"] == NOW - MICROSECOND
        assert row["lease_generation"] == 1

    async def test_clear_never_strands_a_running_run(self, conn):
        lease = await make_run(conn, "running")

        await clear(conn, lease.run_id)

        stranded = await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.status = 'running'"
            " AND r.lease_worker_id IS NULL")
        assert stranded == 0
        rows = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, None, NOW)
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

    async def test_clear_of_an_expired_running_lease_keeps_the_earlier_expiry(self, conn):
        lease = await make_run(conn, "running")

        assert await clear(conn, lease.run_id, now=at(120)) is True

        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(60)


class TestClearLeaseWithoutALease:
    @pytest.mark.parametrize("status", ["pending", "waiting", "completed", "failed", "cancelled"])
    async def test_clear_of_a_run_without_a_lease_returns_false(self, conn, status):
        lease = await make_run(conn, status)
        before = await run_row(conn, lease.run_id)

        assert await clear(conn, lease.run_id) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_second_clear_of_a_pending_run_returns_false(self, conn):
        lease = await make_run(conn, "claimed")
        assert await clear(conn, lease.run_id) is True
        before = await run_row(conn, lease.run_id)

        assert await clear(conn, lease.run_id, now=at(20)) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)


class TestClearLeaseOfUnknownRun:
    async def test_unknown_run_raises_zp001(self, conn):
        await assert_raises(conn, "ZP001", uuid.uuid4())

    async def test_run_in_another_scope_raises_zp001_and_is_untouched(self, conn):
        lease = await make_run(conn, "claimed", tenant_id="acme", workspace_id="ws-1")
        before = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")

        await assert_raises(conn, "ZP001", lease.run_id)
        await assert_raises(conn, "ZP001", lease.run_id, tenant_id="acme")
        await assert_raises(conn, "ZP001", lease.run_id, tenant_id="other", workspace_id="ws-1")
        await assert_raises(conn, "ZP001", lease.run_id, workspace_id="ws-1")

        after = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")
        assert dict(after) == dict(before)


class TestClearLeaseFreesSlots:
    async def test_clear_of_a_pending_run_frees_its_slot(self, conn):
        lease = await make_run(conn, "claimed", max_concurrency=1)
        other_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await clear(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert len(rows) == 1
        assert rows[0]["run_id"] in {lease.run_id, other_run}

    async def test_clear_of_a_running_run_frees_its_slot_for_recovery(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)

        await clear(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        assert (await run_row(conn, lease.run_id))["admission_slot"] is None
        rows = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, 1, NOW)
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

    async def test_clear_leaves_other_runs_slots_alone(self, conn):
        lease = await make_run(conn, "running", max_concurrency=2)
        other = await make_run(conn, "running", max_concurrency=2, worker_id=OTHER)

        await clear(conn, lease.run_id)

        held = await conn.fetch(
            "SELECT s.run_id, s.lease_worker_id FROM zeroth_test.slot_leases s"
            " WHERE s.run_id IS NOT NULL")
        assert [tuple(r) for r in held] == [(other.run_id, OTHER)]


class TestClearLeaseNotifiesWakeup:
    async def test_clear_notifies_the_runs_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", tenant_id="acme")
        queue = await listen(listener, "zeroth_wakeup", ((DEPLOYMENT, "acme", None),))

        assert await clear(actor, lease.run_id, tenant_id="acme") is True

        payload = await asyncio.wait_for(queue.get(), timeout=10)
        assert payload == await wakeup_key(actor, DEPLOYMENT, "acme", None)


class TestClearLeaseRejectsBadArguments:
    async def test_null_run_id_raises_zp008(self, conn):
        lease = await make_run(conn, "claimed")
        before = await run_row(conn, lease.run_id)

        await assert_raises(conn, "ZP008", None)

        assert dict(await run_row(conn, lease.run_id)) == dict(before)
