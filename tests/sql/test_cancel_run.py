"""zeroth.cancel_run: the live lease holder ends its pending or running run as cancelled.

Fenced by (worker_id, generation, live lease); clears the lease, frees the slot, and keeps a
cancel_action an earlier request_cancel recorded.
"""

from __future__ import annotations

import pytest
from helpers import (
    DEPLOYMENT,
    WORKER,
    at,
    claim,
    enqueue,
    listen,
    make_run,
    next_payload,
    run_row,
    wakeup_key,
)

CANCEL = """SELECT zeroth_test.cancel_run(run_id => $1, worker_id => $2, generation => $3,
                tenant_id => $4, workspace_id => $5, now_override => $6)"""
REQUEST_CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, action => $2,
                        now_override => $3)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)


async def cancel(conn, run_id, worker_id=WORKER, generation=1, *, tenant_id=None,
                 workspace_id=None, now=NOW):
    return await conn.fetchval(CANCEL, run_id, worker_id, generation, tenant_id, workspace_id,
                               now)




class TestHolderCancels:
    @pytest.mark.parametrize("status", ["claimed", "running"])
    async def test_holder_cancels_its_run_and_the_lease_is_cleared(self, conn, status):
        lease = await make_run(conn, status)

        assert await cancel(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "cancelled"
        assert row["finished_at"] == NOW
        assert row["cancel_action"] == "cancel"
        assert row["cancel_requested_at"] == NOW
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["recovery_checkpoint_id"] is None
        assert row["lease_generation"] == 1

    async def test_cancelled_run_is_claimed_by_nobody(self, conn):
        lease = await make_run(conn, "running")
        await cancel(conn, lease.run_id)

        assert await claim(conn, worker_id=OTHER, now=at(600)) == []
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(600)) == []

    async def test_holder_keeps_an_earlier_requested_cancel_action(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, "interrupt", at(5)) == (
            "cancel_requested")

        assert await cancel(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["cancel_action"], row["cancel_requested_at"]) == (
            "cancelled", "interrupt", at(5))
        assert row["finished_at"] == NOW

    async def test_recovered_holder_cancels_with_its_own_generation(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(61))

        assert await cancel(conn, lease.run_id, OTHER, 2, now=at(70)) is True

        assert (await run_row(conn, lease.run_id))["status"] == "cancelled"


class TestCancelFreesTheSlot:
    @pytest.mark.parametrize("status", ["claimed", "running"])
    async def test_cancel_frees_the_slot_for_the_next_run(self, conn, status):
        lease = await make_run(conn, status, max_concurrency=1)
        other_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await cancel(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert [r["run_id"] for r in rows] == [other_run]


class TestCancelNotifiesWhenASlotIsFreed:
    async def test_cancel_that_frees_a_slot_notifies_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", max_concurrency=1)
        queue = await listen(listener, "zeroth_wakeup")

        assert await cancel(actor, lease.run_id) is True

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "default", None)

    async def test_cancel_without_a_slot_sends_no_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running")
        queue = await listen(listener, "zeroth_wakeup")

        assert await cancel(actor, lease.run_id) is True
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        # Notifications arrive in commit order: nothing came before the sentinel.
        assert await next_payload(queue) == "sentinel"


