"""zeroth.request_cancel: the admin or user cancel.

cancelled (pending, waiting, or running whose lease expired: terminal at once, lease cleared, the
old holder fenced out) | cancel_requested (running with a live lease: durable flag, first action
wins, NOTIFY zeroth_control) | not_cancellable (terminal) | unknown (no such run in scope).
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from helpers import (
    DEPLOYMENT,
    WORKER,
    announce_idle,
    at,
    claim,
    control_key,
    enqueue,
    make_run,
    run_row,
    wakeup_key,
)

REQUEST_CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, tenant_id => $2,
                        workspace_id => $3, action => $4, now_override => $5)"""
START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
COMMIT = """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                columns => '{"output": {"done": true}}', now_override => $4)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"done": true}', now_override => $4)"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
RENEW_MANY = """SELECT run_id, renewed, cancel_requested FROM zeroth_test.renew_leases(
                    worker_id => $1, run_ids => $2, generations => $3, now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1,
                        worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)


async def request_cancel(conn, run_id, action="cancel", *, tenant_id=None, workspace_id=None,
                         now=NOW):
    return await conn.fetchval(REQUEST_CANCEL, run_id, tenant_id, workspace_id, action, now)


def assert_cancelled_at(row, when, action="cancel"):
    assert row["status"] == "cancelled"
    assert row["finished_at"] == when
    assert row["cancel_action"] == action
    assert row["cancel_requested_at"] == when
    assert row["lease_worker_id"] is None
    assert row["lease_acquired_at"] is None
    assert row["lease_expires_at"] is None
    assert row["admission_slot"] is None
    assert row["recovery_checkpoint_id"] is None


class TestImmediateCancel:
    async def test_unclaimed_pending_run_is_cancelled(self, conn):
        lease = await make_run(conn, "pending")

        assert await request_cancel(conn, lease.run_id) == "cancelled"

        assert_cancelled_at(await run_row(conn, lease.run_id), NOW)

    @pytest.mark.parametrize("action", ["interrupt", "rollback"])
    async def test_immediate_cancel_records_the_requested_action(self, conn, action):
        lease = await make_run(conn, "pending")

        assert await request_cancel(conn, lease.run_id, action) == "cancelled"

        assert_cancelled_at(await run_row(conn, lease.run_id), NOW, action)

    async def test_cancelled_pending_run_is_never_claimed(self, conn):
        lease = await make_run(conn, "pending")
        await request_cancel(conn, lease.run_id)

        assert await claim(conn, worker_id=OTHER, now=at(600)) == []

    async def test_waiting_run_is_cancelled_and_its_wait_reason_cleared(self, conn):
        lease = await make_run(conn, "waiting")
        assert (await run_row(conn, lease.run_id))["wait_reason"] == "approval"

        assert await request_cancel(conn, lease.run_id) == "cancelled"

        row = await run_row(conn, lease.run_id)
        assert_cancelled_at(row, NOW)
        assert row["wait_reason"] is None


class TestCancelFencesTheClaimedPendingWorker:
    async def test_admin_cancel_atomically_fences_pending_worker(self, conn):
        lease = await make_run(conn, "claimed")

        assert await request_cancel(conn, lease.run_id) == "cancelled"

        cancelled = await run_row(conn, lease.run_id)
        assert_cancelled_at(cancelled, NOW)
        assert cancelled["lease_generation"] == 1
        # Every later write of the old holder is refused, so the run is never driven.
        assert await conn.fetchval(START, lease.run_id, WORKER, 1, at(11)) is False
        assert await conn.fetchval(COMMIT, lease.run_id, WORKER, 1, at(11)) is False
        assert await conn.fetchval(COMPLETE, lease.run_id, WORKER, 1, at(11)) is False
        assert await conn.fetchval(RENEW, lease.run_id, WORKER, 1, at(11)) is False
        after = await run_row(conn, lease.run_id)
        assert dict(after) == dict(cancelled)
        assert after["attempts"] == 0
        assert after["started_at"] is None

    async def test_cancel_of_a_claimed_run_frees_its_slot(self, conn):
        lease = await make_run(conn, "claimed", max_concurrency=1)
        other_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await request_cancel(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert [r["run_id"] for r in rows] == [other_run]


class TestCancelOfRunningRunWithLiveLease:
    async def test_live_running_run_gets_a_cancel_request_and_keeps_running(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await request_cancel(conn, lease.run_id) == "cancel_requested"

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "running"
        assert row["cancel_requested_at"] == NOW
        assert row["cancel_action"] == "cancel"
        assert row["finished_at"] is None
        lease_columns = ("lease_worker_id", "lease_acquired_at", "lease_expires_at",
                         "lease_generation", "admission_slot")
        assert [row[c] for c in lease_columns] == [before[c] for c in lease_columns]

    async def test_cancel_request_keeps_the_holders_slot(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)

        await request_cancel(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (lease.run_id, WORKER, 1)

    async def test_first_requested_action_wins(self, conn):
        lease = await make_run(conn, "running")

        assert await request_cancel(conn, lease.run_id, "interrupt", now=at(5)) == (
            "cancel_requested")
        assert await request_cancel(conn, lease.run_id, "cancel", now=at(9)) == (
            "cancel_requested")

        row = await run_row(conn, lease.run_id)
        assert (row["cancel_action"], row["cancel_requested_at"]) == ("interrupt", at(5))

    async def test_renewals_report_the_cancel_request_to_the_holder(self, conn):
        lease = await make_run(conn, "running")
        untouched = await make_run(conn, "running")
        await request_cancel(conn, lease.run_id)

        rows = await conn.fetch(RENEW_MANY, WORKER, [lease.run_id, untouched.run_id], [1, 1],
                                at(20))

        assert [tuple(r) for r in rows] == [(lease.run_id, True, True),
                                            (untouched.run_id, True, False)]

    async def test_holder_can_still_complete_after_a_cancel_request(self, conn):
        # A request is advisory: the live holder decides how the run ends.
        lease = await make_run(conn, "running")
        await request_cancel(conn, lease.run_id)

        assert await conn.fetchval(COMPLETE, lease.run_id, WORKER, 1, at(11)) is True

        assert (await run_row(conn, lease.run_id))["status"] == "completed"

    async def test_cancel_request_notifies_the_owner_on_zeroth_control(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running")
        queue: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_control", lambda *args: queue.put_nowait(args[3]))

        assert await request_cancel(actor, lease.run_id) == "cancel_requested"

        payload = await asyncio.wait_for(queue.get(), timeout=10)
        assert payload == await control_key(actor, WORKER)
        assert str(lease.run_id) not in payload
        assert WORKER not in payload


class TestCancelOfRunningRunWithExpiredLease:
    async def test_expired_running_run_is_cancelled_at_once(self, conn):
        lease = await make_run(conn, "running")

        assert await request_cancel(conn, lease.run_id, now=at(61)) == "cancelled"

        assert_cancelled_at(await run_row(conn, lease.run_id), at(61))

    async def test_old_holder_is_fenced_out_and_nobody_recovers_the_run(self, conn):
        lease = await make_run(conn, "running")
        await request_cancel(conn, lease.run_id, now=at(61))
        cancelled = await run_row(conn, lease.run_id)

        assert await conn.fetchval(COMPLETE, lease.run_id, WORKER, 1, at(62)) is False
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(62)) == []

        assert dict(await run_row(conn, lease.run_id)) == dict(cancelled)

    async def test_cancel_of_an_expired_running_run_frees_its_slot(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)

        await request_cancel(conn, lease.run_id, now=at(61))

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)

    async def test_earlier_request_action_is_kept_when_the_cancel_lands(self, conn):
        lease = await make_run(conn, "running")
        await request_cancel(conn, lease.run_id, "rollback", now=at(5))

        assert await request_cancel(conn, lease.run_id, "cancel", now=at(61)) == "cancelled"

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["cancel_action"], row["cancel_requested_at"]) == (
            "cancelled", "rollback", at(5))
        assert row["finished_at"] == at(61)


class TestCancelOfTerminalOrUnknownRun:
    @pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
    async def test_terminal_run_is_not_cancellable_and_unchanged(self, conn, status):
        lease = await make_run(conn, status)
        before = await run_row(conn, lease.run_id)

        assert await request_cancel(conn, lease.run_id, "interrupt") == "not_cancellable"

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_unknown_run_is_reported_unknown(self, conn):
        assert await request_cancel(conn, uuid.uuid4()) == "unknown"

    async def test_run_in_another_scope_is_unknown_and_unchanged(self, conn):
        lease = await make_run(conn, "pending", tenant_id="acme", workspace_id="ws-1")
        before = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")

        assert await request_cancel(conn, lease.run_id) == "unknown"
        assert await request_cancel(conn, lease.run_id, tenant_id="acme") == "unknown"
        assert await request_cancel(conn, lease.run_id, workspace_id="ws-1") == "unknown"

        after = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")
        assert dict(after) == dict(before)


class TestRequestCancelRejectsBadArguments:
    @pytest.mark.parametrize(("drop_run_id", "action"),
                             [(True, "cancel"), (False, "stop"), (False, "CANCEL"), (False, None)],
                             ids=["run_id_null", "unknown_action", "uppercase_action",
                                  "action_null"])
    async def test_bad_argument_raises_zp008_and_changes_nothing(
            self, conn, drop_run_id, action):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await request_cancel(conn, None if drop_run_id else lease.run_id, action)

        assert info.value.sqlstate == "ZP008"
        assert dict(await run_row(conn, lease.run_id)) == dict(before)


class TestImmediateCancelWakesWorkersWhenItFreesASlot:
    async def test_cancel_of_a_claimed_run_under_a_limit_notifies_zeroth_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "claimed", max_concurrency=1)
        queue: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_wakeup", lambda *args: queue.put_nowait(args[3]))
        await announce_idle(listener)

        assert await request_cancel(actor, lease.run_id) == "cancelled"
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        payload = await asyncio.wait_for(queue.get(), timeout=10)
        assert payload == await wakeup_key(actor, DEPLOYMENT, "default", None)

    async def test_cancel_of_an_unlimited_pending_run_sends_no_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "pending")
        queue: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_wakeup", lambda *args: queue.put_nowait(args[3]))
        await announce_idle(listener)

        assert await request_cancel(actor, lease.run_id) == "cancelled"
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        assert await asyncio.wait_for(queue.get(), timeout=10) == "sentinel"
