"""zeroth.claim_for_takeover: take over one run whose owner's lease expired past a grace.

The run's own choice decides: not resumable → failed with a stop reason (deer-flow's terminal
takeover); resumable → requeued (pending, claimable again, checkpoints kept); a cancel was
requested → cancelled. Ports deer-flow's claim_for_takeover cases (seed spec §17, "Takeover").
"""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest
from helpers import at, claim, make_run, run_row
from thread_calls import (
    OTHER,
    OWNER,
    THREAD,
    active,
    admit,
    cancel_v2,
    fenced,
    own_running,
    take_over,
)

CLAIM_ORPHANED = """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => 'deploy-a',
                        worker_id => $1, now_override => $2) WHERE run_id IS NOT NULL"""
SLOT = """SELECT s.run_id FROM zeroth.admission_slots s WHERE s.deployment_ref = 'deploy-a'"""


class TestTerminalTakeover:
    async def test_claim_for_takeover_succeeds_with_expired_lease(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        rows = await take_over(conn, run_id, now=at(41), grace=10,
                               message="reclaimed by worker a: owner b stopped renewing")

        assert rows == [{"run_id": run_id, "thread_id": THREAD, "outcome": "failed",
                         "status": "failed", "previous_worker_id": OTHER,
                         "previous_generation": 1}]
        row = await run_row(conn, run_id)
        assert (row["status"], row["finished_at"], row["lease_worker_id"]) == (
            "failed", at(41), None)
        assert row["lease_generation"] == 1  # a takeover ends the run; it does not re-own it
        assert json.loads(row["error"]) == {
            "stop_reason": "orphan_recovered", "worker_id": OTHER, "lease_generation": 1,
            "message": "reclaimed by worker a: owner b stopped renewing"}

    async def test_default_message_names_the_owner(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        await take_over(conn, run_id, now=at(41), stop_reason="gateway_restart")

        error = json.loads((await run_row(conn, run_id))["error"])
        assert error["stop_reason"] == "gateway_restart"
        assert OTHER in error["message"]

    async def test_a_run_is_taken_over_exactly_once(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        assert len(await take_over(conn, run_id, now=at(41))) == 1
        assert await take_over(conn, run_id, now=at(42)) == []

    async def test_pending_owned_run_whose_owner_died_before_starting(self, conn):
        admitted = await admit(conn, worker_id=OTHER, lease_seconds=30)

        rows = await take_over(conn, admitted["run_id"], now=at(41))

        assert [(r["outcome"], r["status"]) for r in rows] == [("failed", "failed")]

    async def test_cancel_requested_before_the_owner_died_ends_cancelled(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        await cancel_v2(conn, run_id, "rollback", now=at(5))

        rows = await take_over(conn, run_id, now=at(41))

        assert [(r["outcome"], r["status"]) for r in rows] == [("cancelled", "cancelled")]
        assert (await run_row(conn, run_id))["cancel_action"] == "rollback"

    async def test_late_success_of_the_displaced_owner_is_refused(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        await take_over(conn, run_id, now=at(41))
        taken = await run_row(conn, run_id)

        assert await fenced(conn, "complete_run", run_id, OTHER, 1, now=at(42),
                            output={"late": True}) is False
        assert await fenced(conn, "renew_lease", run_id, OTHER, 1, now=at(42)) is False

        assert dict(await run_row(conn, run_id)) == dict(taken)

    async def test_not_resumable_run_is_ended_never_resumed_by_claim_orphaned(self, conn):
        # The owner died: claim_orphaned ends the run, so neither it nor any run queued behind it
        # on its thread stays stuck for ever (no caller of reconcile_thread_runs is needed).
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        queued = await admit(conn, strategy="enqueue", now=at(1))

        assert await conn.fetch(CLAIM_ORPHANED, OWNER, at(600)) == []

        row = await run_row(conn, run_id)
        assert row["status"] == "failed"
        assert json.loads(row["error"])["stop_reason"] == "orphan_recovered"
        assert await active(conn) == [queued["run_id"]]

    async def test_claim_orphaned_leaves_a_not_resumable_run_alone_within_grace(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        # Expired at at(30); the default grace is 10 s.
        assert await conn.fetch(CLAIM_ORPHANED, OWNER, at(39)) == []

        assert (await run_row(conn, run_id))["status"] == "running"

    async def test_takeover_frees_the_thread_for_the_queue(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        queued = await admit(conn, strategy="enqueue", now=at(1))

        await take_over(conn, run_id, now=at(41))

        assert await active(conn) == [queued["run_id"]]


class TestRequeue:
    async def test_resumable_run_is_handed_back_to_pending(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30, resumable=True)
        assert await fenced(conn, "save_checkpoint", run_id, OTHER, 1, now=at(1),
                            data=json.dumps({"step": 1}))

        rows = await take_over(conn, run_id, now=at(41))

        assert [(r["outcome"], r["status"]) for r in rows] == [("requeued", "pending")]
        row = await run_row(conn, run_id)
        # The interrupted attempt stays counted (a run that kills its worker is not recovered
        # for ever): only a hand-back by the live holder gives one back.
        assert (row["lease_worker_id"], row["attempts"], row["finished_at"], row["error"]) == (
            None, 1, None, None)
        assert await active(conn) == [run_id]  # it keeps its thread
        claimed = await claim(conn, worker_id=OWNER, now=at(42))
        assert [(r["run_id"], r["lease_generation"]) for r in claimed] == [(run_id, 2)]
        assert json.loads(claimed[0]["checkpoint_data"]) == {"step": 1}

    async def test_a_lapsed_unstarted_claim_is_requeued_with_its_attempt_counted(self, conn):
        lease = await make_run(conn, "claimed", lease_seconds=30, max_attempts=3)

        rows = await take_over(conn, lease.run_id, now=at(41))

        assert [(r["outcome"], r["status"]) for r in rows] == [("requeued", "pending")]
        row = await run_row(conn, lease.run_id)
        assert (row["lease_worker_id"], row["attempts"]) == (None, 1)

    async def test_a_lapsed_unstarted_claim_with_no_attempt_left_is_dead_lettered(self, conn):
        lease = await make_run(conn, "claimed", lease_seconds=30, max_attempts=1)

        rows = await take_over(conn, lease.run_id, now=at(41))

        assert [(r["outcome"], r["status"]) for r in rows] == [("dead_lettered", "failed")]
        row = await run_row(conn, lease.run_id)
        assert (row["attempts"], row["dead_lettered_at"]) == (1, at(41))
        assert json.loads(row["error"])["stop_reason"] == "attempts_exhausted"

    async def test_queue_mode_runs_are_resumable(self, conn):
        lease = await make_run(conn, "running", thread_id=THREAD, lease_seconds=30)

        rows = await take_over(conn, lease.run_id, now=at(41))

        assert [r["outcome"] for r in rows] == ["requeued"]


class TestNoTakeover:
    async def test_claim_for_takeover_fails_with_valid_lease(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        before = await run_row(conn, run_id)

        assert await take_over(conn, run_id, now=at(29)) == []
        assert dict(await run_row(conn, run_id)) == dict(before)

    async def test_claim_for_takeover_respects_grace(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        assert await take_over(conn, run_id, now=at(40), grace=10) == []
        assert len(await take_over(conn, run_id, now=at(40.001), grace=10)) == 1

    @pytest.mark.parametrize("state", ["completed", "failed", "cancelled", "waiting"])
    async def test_claim_for_takeover_fails_on_inactive_status(self, conn, state):
        lease = await make_run(conn, state, lease_seconds=30)

        assert await take_over(conn, lease.run_id, now=at(600)) == []

    async def test_unclaimed_pending_run_has_no_owner_to_take_over(self, conn):
        # deer-flow reads a NULL lease as "heartbeat off, orphaned"; here a NULL lease is queue
        # work nobody has claimed yet, and claim_pending is its path.
        lease = await make_run(conn, "pending")

        assert await take_over(conn, lease.run_id, now=at(600)) == []

    async def test_claim_for_takeover_fails_for_nonexistent_run_and_other_scope(self, conn):
        lease = await make_run(conn, "running", tenant_id="acme", lease_seconds=30)

        assert await take_over(conn, uuid.uuid4(), now=at(600)) == []
        assert await take_over(conn, lease.run_id, now=at(600)) == []
        assert len(await take_over(conn, lease.run_id, now=at(600), tenant_id="acme")) == 1

    async def test_run_being_renewed_right_now_is_skipped(self, connect):
        # The renewal holds the row lock; the takeover skips (SKIP LOCKED) rather than wait.
        owner, taker = await connect(), await connect()
        run_id = await own_running(owner, worker_id=OTHER, lease_seconds=30)
        async with owner.transaction():
            assert await fenced(owner, "renew_lease", run_id, OTHER, 1, now=at(29),
                                lease_seconds=30)
            assert await take_over(taker, run_id, now=at(41)) == []
        assert await take_over(taker, run_id, now=at(41)) == []  # renewed until 59 + 10


class TestSlots:
    async def test_takeover_frees_the_admission_slot(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1, lease_seconds=30,
                               thread_id=THREAD)
        assert [r["run_id"] for r in await conn.fetch(SLOT)] == [lease.run_id]

        await take_over(conn, lease.run_id, now=at(41))

        assert [r["run_id"] for r in await conn.fetch(SLOT)] == [None]


class TestBadArguments:
    @pytest.mark.parametrize("kwargs", [{"run_id": None}, {"grace": -1}, {"stop_reason": ""}])
    async def test_bad_argument_raises_zp008(self, conn, kwargs):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        kwargs = {"run_id": run_id, **kwargs}
        before = await run_row(conn, run_id)

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await take_over(conn, kwargs.pop("run_id"), now=at(41), **kwargs)

        assert info.value.sqlstate == "ZP008"
        assert dict(await run_row(conn, run_id)) == dict(before)
