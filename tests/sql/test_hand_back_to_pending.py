"""zeroth.hand_back_to_pending: running → pending for exactly (worker_id, generation).

Used on graceful shutdown and contention: the live lease only, the attempt is given back for the
first max_attempts hand-backs (then counted, and dead-lettered when none is left), checkpoints
are kept for the next owner, and an admin cancel that got there first wins.
"""

from __future__ import annotations

import json

import pytest
from helpers import (
    DEPLOYMENT,
    WORKER,
    at,
    claim,
    listen,
    make_run,
    next_payload,
    run_row,
    wakeup_key,
)

HAND_BACK = """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3,
                   tenant_id => $4, workspace_id => $5, now_override => $6)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => $4::text::jsonb, now_override => $5)"""
REQUEST_CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, action => $2,
                        now_override => $3)"""
START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)


async def hand_back(conn, run_id, worker_id=WORKER, generation=1, *, tenant_id=None,
                    workspace_id=None, now=NOW):
    return await conn.fetchval(HAND_BACK, run_id, worker_id, generation, tenant_id,
                               workspace_id, now)




class TestHandBackOfRunningRun:
    async def test_hand_back_makes_the_run_pending_without_a_lease(self, conn):
        lease = await make_run(conn, "running")

        assert await hand_back(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["recovery_checkpoint_id"] is None
        assert row["updated_at"] == NOW

    async def test_hand_back_gives_the_attempt_back(self, conn):
        lease = await make_run(conn, "running")
        assert (await run_row(conn, lease.run_id))["attempts"] == 1

        await hand_back(conn, lease.run_id)

        assert (await run_row(conn, lease.run_id))["attempts"] == 0

    async def test_hand_back_does_not_bump_the_generation_and_next_claim_does(self, conn):
        lease = await make_run(conn, "running")
        await hand_back(conn, lease.run_id)
        assert (await run_row(conn, lease.run_id))["lease_generation"] == 1

        rows = await claim(conn, worker_id=OTHER, now=at(11))

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]
        assert rows[0]["attempts"] == 0

    async def test_hand_back_keeps_checkpoints_and_next_claim_resumes_from_the_latest(self, conn):
        lease = await make_run(conn, "running")
        await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, '{"step": 1}', at(1))
        latest = await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, '{"step": 2}',
                                     at(2))

        await hand_back(conn, lease.run_id)

        kept = await conn.fetchval(
            "SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = $1", lease.run_id)
        assert kept == 2
        rows = await claim(conn, worker_id=OTHER, now=at(11))
        assert rows[0]["recovery_checkpoint_id"] == latest
        assert json.loads(rows[0]["checkpoint_data"]) == {"step": 2}

    async def test_hand_back_of_a_recovered_run_clears_its_recovery_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        checkpoint = await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, '{"step": 1}',
                                         at(1))
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(61))
        row = await run_row(conn, lease.run_id)
        # The recovery counted the attempt that died with the first worker.
        assert (row["recovery_checkpoint_id"], row["attempts"]) == (checkpoint, 2)

        assert await hand_back(conn, lease.run_id, OTHER, 2, now=at(70)) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["recovery_checkpoint_id"], row["attempts"]) == (
            "pending", None, 1)

    async def test_attempt_is_counted_again_when_the_next_owner_starts(self, conn):
        lease = await make_run(conn, "running")
        await hand_back(conn, lease.run_id)
        rows = await claim(conn, worker_id=OTHER, now=at(11))

        assert await conn.fetchval(START, lease.run_id, OTHER, rows[0]["lease_generation"],
                                   at(12)) is True

        assert (await run_row(conn, lease.run_id))["attempts"] == 1


CLAIM_AND_START = """SELECT run_id, lease_generation, attempts FROM zeroth_test.claim_and_start(
                         deployment_ref => $1, worker_id => $2, now_override => $3)
                      WHERE run_id IS NOT NULL"""
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"


class TestHandBacksAreBounded:
    """A handler that always outlives the worker's shutdown (or sends its own worker SIGTERM)
    is not handed back, attempt refunded, for ever."""

    @pytest.mark.parametrize("max_attempts", [1, 2, 3])
    async def test_after_max_attempts_free_hand_backs_the_attempts_count_then_dead_letter(
            self, conn, max_attempts):
        run_id = (await make_run(conn, "pending", max_attempts=max_attempts)).run_id
        seen = []
        for n in range(1, 2 * max_attempts + 1):
            (row,) = await conn.fetch(CLAIM_AND_START, DEPLOYMENT, WORKER, at(100 * n))
            assert row["run_id"] == run_id, n
            seen.append(row["attempts"])
            assert await hand_back(conn, run_id, WORKER, row["lease_generation"],
                                   now=at(100 * n + 1)) is True
            after = await run_row(conn, run_id)
            assert after["hand_backs"] == n
            assert after["attempts"] <= after["max_attempts"]
        # Free: attempt 1 every time; then counted up to max_attempts.
        assert seen == [1] * max_attempts + list(range(1, max_attempts + 1))
        row = await run_row(conn, run_id)
        error = json.loads(row["error"])
        assert (row["status"], row["attempts"], error["stop_reason"]) == (
            "failed", max_attempts, "attempts_exhausted")
        assert error["message"].startswith(f"handed back {2 * max_attempts} times")
        assert row["dead_lettered_at"] is not None
        assert row["finished_at"] is not None
        assert row["lease_worker_id"] is None
        assert await conn.fetch(CLAIM_AND_START, DEPLOYMENT, OTHER, at(10_000)) == []

    async def test_a_redrive_gives_the_run_its_free_hand_backs_again(self, conn):
        run_id = (await make_run(conn, "pending", max_attempts=1)).run_id
        for n in (1, 2):
            (row,) = await conn.fetch(CLAIM_AND_START, DEPLOYMENT, WORKER, at(100 * n))
            await hand_back(conn, run_id, WORKER, row["lease_generation"], now=at(100 * n + 1))
        assert (await run_row(conn, run_id))["status"] == "failed"

        assert await conn.fetchval(REDRIVE, run_id, at(300)) is True

        row = await run_row(conn, run_id)
        assert (row["status"], row["attempts"], row["hand_backs"]) == ("pending", 0, 0)
        (claimed,) = await conn.fetch(CLAIM_AND_START, DEPLOYMENT, WORKER, at(301))
        assert await hand_back(conn, run_id, WORKER, claimed["lease_generation"],
                               now=at(302)) is True
        row = await run_row(conn, run_id)
        assert (row["status"], row["attempts"], row["hand_backs"]) == ("pending", 0, 1)


class TestAdminCancelWinsOverHandBack:
    async def test_admin_cancel_wins_over_stale_shutdown_hand_back(self, conn):
        lease = await make_run(conn, "running")
        # The shutting-down worker's lease has lapsed; the admin cancel lands first.
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, "cancel", at(61)) == "cancelled"
        before = await run_row(conn, lease.run_id)

        assert await hand_back(conn, lease.run_id, now=at(62)) is False

        after = await run_row(conn, lease.run_id)
        assert dict(after) == dict(before)
        assert after["status"] == "cancelled"
        assert after["lease_worker_id"] is None

    async def test_requested_cancel_survives_a_hand_back_to_the_next_claim(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, "cancel", at(5)) == (
            "cancel_requested")

        assert await hand_back(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert (row["cancel_action"], row["cancel_requested_at"]) == ("cancel", at(5))
        rows = await claim(conn, worker_id=OTHER, now=at(11))
        assert rows[0]["cancel_requested"] is True


class TestHandBackFreesTheSlot:
    async def test_hand_back_frees_the_slot_for_another_claim(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (lease.run_id, WORKER, 1)

        await hand_back(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]


class TestHandBackNotifiesWakeup:
    async def test_hand_back_notifies_the_runs_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", tenant_id="acme", workspace_id="ws-1")
        queue = await listen(listener, "zeroth_wakeup", ((DEPLOYMENT, "acme", "ws-1"),))

        assert await hand_back(actor, lease.run_id, tenant_id="acme", workspace_id="ws-1") is True

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "acme", "ws-1")

    async def test_refused_hand_back_sends_no_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "claimed")
        queue = await listen(listener, "zeroth_wakeup")

        assert await hand_back(actor, lease.run_id) is False
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        # Notifications arrive in commit order: nothing came before the sentinel.
        assert await next_payload(queue) == "sentinel"


