"""zeroth.cancel_run: the live lease holder ends its pending or running run as cancelled.

Fenced by (worker_id, generation, live lease); clears the lease, frees the slot, and keeps a
cancel_action an earlier request_cancel recorded.
"""

from __future__ import annotations

import asyncpg
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


class TestCancelIsFenced:
    @pytest.mark.parametrize(("worker_id", "generation"), [(OTHER, 1), (WORKER, 0), (WORKER, 2)])
    async def test_cancel_by_anyone_but_the_holder_is_refused(self, conn, worker_id, generation):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await cancel(conn, lease.run_id, worker_id, generation) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_cancel_with_an_expired_lease_is_refused(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await cancel(conn, lease.run_id, now=at(61)) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_stale_generation_cannot_cancel_new_same_worker_lease(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, WORKER, at(61))
        before = await run_row(conn, lease.run_id)

        assert await cancel(conn, lease.run_id, WORKER, 1, now=at(62)) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_displaced_holder_cannot_cancel_and_its_slot_stays_with_the_new_holder(
            self, conn):
        lease = await make_run(conn, "claimed", max_concurrency=1)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(61))
        assert [r["lease_generation"] for r in rows] == [2]

        assert await cancel(conn, lease.run_id, WORKER, 1, now=at(62)) is False

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (lease.run_id, OTHER, 2)

    @pytest.mark.parametrize("status", ["pending", "waiting", "completed", "failed", "cancelled"])
    async def test_cancel_of_a_run_without_a_live_lease_is_refused(self, conn, status):
        lease = await make_run(conn, status)
        before = await run_row(conn, lease.run_id)

        assert await cancel(conn, lease.run_id, WORKER, lease.generation) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_cancel_in_another_scope_is_refused(self, conn):
        lease = await make_run(conn, "running", tenant_id="acme")
        before = await run_row(conn, lease.run_id, tenant_id="acme")

        assert await cancel(conn, lease.run_id) is False
        assert await cancel(conn, lease.run_id, tenant_id="acme", workspace_id="ws") is False

        assert dict(await run_row(conn, lease.run_id, tenant_id="acme")) == dict(before)


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


class TestCancelRejectsBadArguments:
    @pytest.mark.parametrize(
        ("drop_run_id", "worker_id", "generation"),
        [(True, WORKER, 1), (False, None, 1), (False, "", 1), (False, "w" * 201, 1),
         (False, WORKER, None)],
        ids=["run_id_null", "worker_null", "worker_empty", "worker_too_long", "generation_null"])
    async def test_bad_argument_raises_zp008_and_changes_nothing(
            self, conn, drop_run_id, worker_id, generation):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await cancel(conn, None if drop_run_id else lease.run_id, worker_id, generation)

        assert info.value.sqlstate == "ZP008"
        assert dict(await run_row(conn, lease.run_id)) == dict(before)
