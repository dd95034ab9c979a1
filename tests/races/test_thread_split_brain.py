"""Split brain on threads: scripted two-session interleavings of an owner and a peer.

A late success from a displaced owner can never overwrite cancelled or taken_over; a committed
success makes a cancel not_cancellable; a takeover never waits on a renewal in flight (the
renewal wins); an admission racing the active run's end neither cancels a finished run nor
strands a queued one. Session A holds its transaction open while B's call runs in the background.
"""

from __future__ import annotations

import json

import pytest
from helpers import at
from interleave import assert_waits_for, finished, finishes_without_waiting, only
from thread_calls import OTHER, THREAD, active, admit, own_running, queue, status

COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => 1,
                  output => '{"late": true}', now_override => $3)"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => 1,
               lease_seconds => 30, now_override => $3)"""
CANCEL_V2 = """SELECT outcome FROM zeroth_test.request_cancel_v2(run_id => $1,
                   now_override => $2)"""
TAKE_OVER = """SELECT outcome FROM zeroth_test.claim_for_takeover(run_id => $1,
                   now_override => $2)"""
ADMIT = """SELECT outcome, displaced::text FROM zeroth_test.admit_run(deployment_ref => 'deploy-a',
               thread_id => $1, strategy => $2, now_override => $3)"""
OUTPUT = "SELECT r.output::text FROM zeroth.runs r WHERE r.run_id = $1"


class TestLateSuccessAgainstCancel:
    @pytest.mark.parametrize(("peer", "outcome", "ended"), [
        (CANCEL_V2, "taken_over", "cancelled"), (TAKE_OVER, "failed", "failed")],
        ids=["cancel_taken_over", "claim_for_takeover"])
    async def test_displaced_owners_late_success_is_refused(self, sessions, peer, outcome, ended):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await b.begin()
        assert (await b.call(peer, run_id, at(41))).value == outcome
        # The owner's lease ran out before the takeover could start, so its late write is
        # refused by the fence itself, without even waiting for the takeover to commit.
        late = a.spawn(COMPLETE, run_id, OTHER, at(42))
        assert (await finishes_without_waiting(db, a, late)).value is False
        await b.commit()

        assert (await a.call(COMPLETE, run_id, OTHER, at(43))).value is False
        assert await status(db, run_id) == ended
        assert await db.fetchval(OUTPUT, run_id) is None

    async def test_committed_success_makes_the_cancel_not_cancellable(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await a.begin()
        assert (await a.call(COMPLETE, run_id, OTHER, at(29))).value is True
        cancel = b.spawn(CANCEL_V2, run_id, at(41))
        await assert_waits_for(db, b, a, cancel)
        await a.commit()

        assert (await finished(cancel)).value == "not_cancellable"
        assert await status(db, run_id) == "completed"


class TestTakeoverAgainstRenewal:
    async def test_takeover_skips_a_run_whose_renewal_is_in_flight(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await a.begin()
        assert (await a.call(RENEW, run_id, OTHER, at(29))).value is True
        takeover = b.spawn(TAKE_OVER, run_id, at(41), rows=True)
        assert (await finishes_without_waiting(db, b, takeover)).value == []
        await a.commit()

        assert (await b.rows(TAKE_OVER, run_id, at(41))).value == []  # renewed to 59 (+10)
        assert await status(db, run_id) == "running"

    async def test_renewal_racing_a_takeover_is_refused_without_waiting(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await b.begin()
        only(await b.rows(TAKE_OVER, run_id, at(41)))
        renew = a.spawn(RENEW, run_id, OTHER, at(42))
        assert (await finishes_without_waiting(db, a, renew)).value is False
        await b.commit()

        assert await status(db, run_id) == "failed"


class TestAdmissionAgainstTheActiveRunsEnd:
    async def test_interrupt_waiting_on_a_completing_run_does_not_cancel_it(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await a.begin()
        assert (await a.call(COMPLETE, run_id, OTHER, at(5))).value is True
        admission = b.spawn(ADMIT, THREAD, "interrupt", at(6), rows=True)
        await assert_waits_for(db, b, a, admission)
        await a.commit()

        admitted = only(await finished(admission))
        assert admitted["outcome"] == "admitted"
        assert json.loads(admitted["displaced"]) == []
        assert await status(db, run_id) == "completed"

    async def test_enqueue_waiting_on_a_completing_run_is_admitted_not_stranded(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await a.begin()
        assert (await a.call(COMPLETE, run_id, OTHER, at(5))).value is True
        admission = b.spawn(ADMIT, THREAD, "enqueue", at(6), rows=True)
        await assert_waits_for(db, b, a, admission)
        await a.commit()

        assert only(await finished(admission))["outcome"] == "admitted"
        assert await queue(db) == []
        assert len(await active(db)) == 1

    async def test_completion_waiting_on_an_enqueue_promotes_the_queued_run(self, sessions):
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)

        await b.begin()
        queued = only(await b.rows(ADMIT, THREAD, "enqueue", at(5)))
        assert queued["outcome"] == "queued"
        completion = a.spawn(COMPLETE, run_id, OTHER, at(6))
        await assert_waits_for(db, a, b, completion)
        await b.commit()

        assert (await finished(completion)).value is True
        assert await queue(db) == []
        promoted = await active(db)
        assert len(promoted) == 1
        assert promoted[0] != run_id
        assert await status(db, promoted[0]) == "pending"

    @pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
    async def test_a_finisher_whose_snapshot_predates_the_queued_run_must_retry(
            self, sessions, isolation):
        """A REPEATABLE READ transaction that finishes the active run from a snapshot older than
        a queued run would promote nothing (the trigger reads the queue in that snapshot),
        leaving the queued run waiting with no active run. The admission writes the active run's
        row, so that finisher fails with 40001 and its retry, with a new snapshot, promotes the
        queued run."""
        a, b, db = sessions
        run_id = await own_running(db, worker_id=OTHER, lease_seconds=30)
        snapshot = a.conn.transaction(isolation=isolation)
        await snapshot.start()
        await a.conn.fetchval("SELECT 1")  # the snapshot is taken here

        assert only(await b.rows(ADMIT, THREAD, "enqueue", at(5)))["outcome"] == "queued"
        assert (await a.call(COMPLETE, run_id, OTHER, at(6))).sqlstate == "40001"
        await snapshot.rollback()

        assert (await a.call(COMPLETE, run_id, OTHER, at(7))).value is True
        assert await queue(db) == []
        promoted = await active(db)
        assert len(promoted) == 1
        assert promoted[0] != run_id
        assert await status(db, promoted[0]) == "pending"

    async def test_admission_behind_an_open_admission_sees_its_run(self, sessions):
        a, b, db = sessions

        await a.begin()
        first = only(await a.rows(ADMIT, THREAD, "reject", at(0)))
        second = b.spawn(ADMIT, THREAD, "reject", at(1), rows=True)
        await assert_waits_for(db, b, a, second)  # the thread's stripe lock
        await a.commit()

        assert first["outcome"] == "admitted"
        assert only(await finished(second))["outcome"] == "busy"
        assert (await admit(db, now=at(2)))["outcome"] == "busy"
