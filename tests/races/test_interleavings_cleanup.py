"""Scripted interleavings of lease cleanup and admin transitions with the calls they can meet.

release_lease, hand_back_to_pending and expire_recovery_lease act on exactly one generation: once
a claim of generation N+1 commits, a cleanup of generation N that waited on the row matches
nothing, and while the cleanup holds the row a claimer skips it (SKIP LOCKED) instead of waiting.
clear_lease vs renew_lease, redrive_run vs redrive_run and resume_run vs request_cancel are
decided by the run row lock: the second call waits, re-checks, and sees the first one's outcome.
Clocks are injected with now_override; factory leases expire at at(60).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from interleave import (
    Outcome,
    assert_waits_for,
    finished,
    finishes_without_waiting,
    only,
)

CLAIM = """SELECT run_id, lease_generation, concurrency_saturated
             FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
                  max_concurrency => $3, lease_seconds => 60, now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation, recovery_checkpoint_id, concurrency_saturated
                      FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
                          max_concurrency => $3, lease_seconds => 60, now_override => $4)"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => 60, now_override => $4)"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => '{"step": 1}', now_override => $4)"""
CLEAR = "SELECT zeroth_test.clear_lease(run_id => $1, now_override => $2)"
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"
RESUME = """SELECT zeroth_test.resume_run(run_id => $1, input => '{"answer": 42}',
                now_override => $2)"""
CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
            FROM zeroth_test.slot_leases s WHERE s.deployment_ref = $1 AND s.slot_no = 1"""

SWEEPER = "worker-b"
MICROSECOND = timedelta(microseconds=1)
# Each interleaving runs once without admission and once holding slot 1 of max_concurrency=1,
# each in its own deployment so the two runs share no slot rows.
ADMISSION = ((None, "deploy-free"), (1, "deploy-slotted"))


# ------------------------------------------------------------------------------------------------
# Cleanups of one exact generation: $1 run_id, $2 worker_id, $3 generation, $4 now_override.


@dataclass(frozen=True, slots=True)
class Cleanup:
    sql: str
    status: str          # the run's status when the cleanup is used
    reclaimed_by: str    # the claim that takes the run after the cleanup: CLAIM or CLAIM_ORPHANED


CLEANUPS = {
    "release_lease": Cleanup(
        """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", "claimed", CLAIM),
    "hand_back_to_pending": Cleanup(
        """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", "running", CLAIM),
    "expire_recovery_lease": Cleanup(
        """SELECT zeroth_test.expire_recovery_lease(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", "running", CLAIM_ORPHANED),
}
# The claim of generation N+1 once generation N's lease expired (at 60): a claimed pending run is
# taken by claim_pending, a running one by claim_orphaned.
TAKEOVER = {"claimed": CLAIM, "running": CLAIM_ORPHANED}


async def slot_row(db: asyncpg.Connection, deployment_ref: str) -> dict[str, Any]:
    return dict(await db.fetchrow(SLOT, deployment_ref))


# ------------------------------------------------------------------------------------------------
# Sessions




# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# Cleanup of generation N vs a claim of generation N+1


@pytest.mark.parametrize("name", list(CLEANUPS))
class TestCleanupOfOldGenerationVersusNewClaim:
    """The old holder's cleanup sampled its clock at 59, while its lease (to 60) was live; the
    claim of generation 2 runs at 61. (A cleanup that samples after 60 is refused at once:
    give-backs need a live lease, tests/sql.)"""

    async def test_cleanup_waits_for_the_new_claim_and_matches_nothing_once_it_commits(
            self, sessions, name):
        old_holder, claimer, db = sessions
        cleanup = CLEANUPS[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, cleanup.status, deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await claimer.begin()
            taken = only(await claimer.rows(TAKEOVER[cleanup.status], deployment_ref, SWEEPER,
                                            max_concurrency, at(61)))
            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)
            new_lease = dict(await run_row(claimer.conn, lease.run_id))

            stale = old_holder.spawn(cleanup.sql, lease.run_id, WORKER, 1, at(59))
            await assert_waits_for(db, old_holder, claimer, stale)
            await claimer.commit()

            assert await finished(stale) == Outcome(value=False)
            row = dict(await run_row(db, lease.run_id))
            assert row == new_lease
            assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
                SWEEPER, 2, at(121))
            if max_concurrency:
                assert await slot_row(db, deployment_ref) == {
                    "run_id": lease.run_id, "lease_worker_id": SWEEPER, "lease_generation": 2,
                    "lease_expires_at": at(121)}

    async def test_cleanup_waiting_on_a_rolled_back_claim_applies_to_its_generation(
            self, sessions, name):
        old_holder, claimer, db = sessions
        cleanup = CLEANUPS[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, cleanup.status, deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await claimer.begin()
            assert only(await claimer.rows(TAKEOVER[cleanup.status], deployment_ref, SWEEPER,
                                           max_concurrency, at(61)))["run_id"] == lease.run_id

            pending_cleanup = old_holder.spawn(cleanup.sql, lease.run_id, WORKER, 1, at(59))
            await assert_waits_for(db, old_holder, claimer, pending_cleanup)
            await claimer.rollback()

            assert await finished(pending_cleanup) == Outcome(value=True)
            row = await run_row(db, lease.run_id)
            assert row["lease_generation"] == 1
            if name == "release_lease":
                assert (row["status"], row["lease_worker_id"]) == ("pending", None)
            elif name == "hand_back_to_pending":
                assert (row["status"], row["lease_worker_id"], row["attempts"]) == (
                    "pending", None, 0)
            else:
                # Expired in place, as of the cleanup's own clock sample.
                assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                    "running", WORKER, at(59) - MICROSECOND)
            if max_concurrency:
                assert (await slot_row(db, deployment_ref))["run_id"] is None

    async def test_claimer_skips_the_run_while_the_cleanup_holds_it_then_takes_it(
            self, sessions, name):
        # At 61 the lease (to 60) has expired, so the claimer's snapshot offers it the run (or
        # its slot) and it meets the cleanup's row lock: it skips instead of waiting.
        holder, claimer, db = sessions
        cleanup = CLEANUPS[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, cleanup.status, deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            checkpoint_id = None
            if cleanup.status == "running":
                checkpoint_id = await db.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, at(1))
            await holder.begin()
            assert (await holder.call(cleanup.sql, lease.run_id, WORKER, 1, at(59))).value

            marker = only(await finishes_without_waiting(db, claimer, claimer.spawn(
                cleanup.reclaimed_by, deployment_ref, SWEEPER, max_concurrency, at(61),
                rows=True)))
            # With a slot the cleanup also holds the slot row: no free slot, reported saturated.
            assert marker["run_id"] is None
            assert marker["concurrency_saturated"] is (max_concurrency is not None)
            await holder.commit()
            taken = only(await claimer.rows(cleanup.reclaimed_by, deployment_ref, SWEEPER,
                                            max_concurrency, at(62)))

            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)
            row = await run_row(db, lease.run_id)
            assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
                SWEEPER, 2, at(122))
            expected_status = "running" if name == "expire_recovery_lease" else "pending"
            assert row["status"] == expected_status
            if name == "expire_recovery_lease":
                assert row["recovery_checkpoint_id"] == checkpoint_id
            if max_concurrency:
                slot = await slot_row(db, deployment_ref)
                assert (slot["lease_worker_id"], slot["lease_generation"]) == (SWEEPER, 2)


class TestStaleReleaseBySameWorker:
    async def test_release_of_generation_one_waits_and_spares_the_same_workers_generation_two(
            self, sessions):
        old_call, new_claim, db = sessions
        lease = await make_run(db, "claimed")
        await new_claim.begin()
        taken = only(await new_claim.rows(CLAIM, DEPLOYMENT, WORKER, None, at(61)))
        assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)

        stale = old_call.spawn(CLEANUPS["release_lease"].sql, lease.run_id, WORKER, 1, at(59))
        await assert_waits_for(db, old_call, new_claim, stale)
        await new_claim.commit()

        assert await finished(stale) == Outcome(value=False)
        row = await run_row(db, lease.run_id)
        assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
            WORKER, 2, at(121))


# ------------------------------------------------------------------------------------------------
# clear_lease vs renew_lease


class TestClearLeaseVersusRenewal:
    async def test_renewal_waits_for_an_open_clear_and_is_refused_once_it_commits(
            self, sessions):
        holder, admin, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await admin.begin()
            assert (await admin.call(CLEAR, lease.run_id, at(29))).value is True

            renewal = holder.spawn(RENEW, lease.run_id, WORKER, 1, at(30))
            await assert_waits_for(db, holder, admin, renewal)
            await admin.commit()

            assert await finished(renewal) == Outcome(value=False)
            row = await run_row(db, lease.run_id)
            # Running, holder kept, lease expired in place: recoverable, never stranded.
            assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
                "running", WORKER, 1)
            assert row["lease_expires_at"] == at(29) - MICROSECOND
            if max_concurrency:
                assert (await slot_row(db, deployment_ref))["run_id"] is None

    async def test_renewal_waiting_on_a_rolled_back_clear_extends_the_lease(self, sessions):
        holder, admin, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await admin.begin()
            assert (await admin.call(CLEAR, lease.run_id, at(29))).value is True

            renewal = holder.spawn(RENEW, lease.run_id, WORKER, 1, at(30))
            await assert_waits_for(db, holder, admin, renewal)
            await admin.rollback()

            assert await finished(renewal) == Outcome(value=True)
            row = await run_row(db, lease.run_id)
            assert (row["lease_worker_id"], row["lease_expires_at"]) == (WORKER, at(90))
            if max_concurrency:
                assert (await slot_row(db, deployment_ref))["lease_expires_at"] == at(90)

    async def test_clear_waits_for_an_open_renewal_and_expires_the_renewed_lease(self, sessions):
        holder, admin, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await holder.begin()
            assert (await holder.call(RENEW, lease.run_id, WORKER, 1, at(29))).value is True

            clear = admin.spawn(CLEAR, lease.run_id, at(30))
            await assert_waits_for(db, admin, holder, clear)
            await holder.commit()

            assert await finished(clear) == Outcome(value=True)
            row = await run_row(db, lease.run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "running", WORKER, at(30) - MICROSECOND)
            if max_concurrency:
                assert (await slot_row(db, deployment_ref))["run_id"] is None
            # The cleared run is an orphan at once.
            taken = only(await admin.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER,
                                          max_concurrency, at(30)))
            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)


# ------------------------------------------------------------------------------------------------
# redrive_run vs redrive_run


@pytest.mark.parametrize("status", ["failed", "cancelled"])
class TestRedriveVersusRedrive:
    async def test_second_redrive_waits_and_is_refused_once_the_first_commits(self, sessions,
                                                                               status):
        first, second, db = sessions
        lease = await make_run(db, status)
        await first.begin()
        assert (await first.call(REDRIVE, lease.run_id, at(10))).value is True

        again = second.spawn(REDRIVE, lease.run_id, at(11))
        await assert_waits_for(db, second, first, again)
        await first.commit()

        assert await finished(again) == Outcome(sqlstate="ZP003")
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["attempts"], row["updated_at"]) == ("pending", 0, at(10))
        assert (row["error"], row["finished_at"], row["cancel_requested_at"]) == (None, None, None)
        assert row["lease_generation"] == 1

    async def test_second_redrive_applies_when_the_first_rolls_back(self, sessions, status):
        first, second, db = sessions
        lease = await make_run(db, status)
        await first.begin()
        assert (await first.call(REDRIVE, lease.run_id, at(10))).value is True

        again = second.spawn(REDRIVE, lease.run_id, at(11))
        await assert_waits_for(db, second, first, again)
        await first.rollback()

        assert await finished(again) == Outcome(value=True)
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["run_after"], row["updated_at"]) == ("pending", at(11), at(11))


# ------------------------------------------------------------------------------------------------
# resume_run vs request_cancel on a waiting run


class TestResumeVersusCancel:
    async def test_cancel_waits_for_an_open_resume_and_cancels_the_pending_run(self, sessions):
        resumer, admin, db = sessions
        lease = await make_run(db, "waiting")
        await resumer.begin()
        assert (await resumer.call(RESUME, lease.run_id, at(10))).value is True

        cancel = admin.spawn(CANCEL, lease.run_id, at(11))
        await assert_waits_for(db, admin, resumer, cancel)
        await resumer.commit()

        assert await finished(cancel) == Outcome(value="cancelled")
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["wait_reason"], row["finished_at"]) == (
            "cancelled", None, at(11))
        assert row["metadata"] == '{"resume_input": {"answer": 42}}'

    async def test_resume_waits_for_an_open_cancel_and_is_refused_once_it_commits(
            self, sessions):
        resumer, admin, db = sessions
        lease = await make_run(db, "waiting")
        await admin.begin()
        assert (await admin.call(CANCEL, lease.run_id, at(10))).value == "cancelled"
        cancelled = dict(await run_row(admin.conn, lease.run_id))

        resume = resumer.spawn(RESUME, lease.run_id, at(11))
        await assert_waits_for(db, resumer, admin, resume)
        await admin.commit()

        assert await finished(resume) == Outcome(sqlstate="ZP003")
        row = dict(await run_row(db, lease.run_id))
        assert row == cancelled
        assert (row["status"], row["metadata"]) == ("cancelled", "{}")

    async def test_resume_waiting_on_a_rolled_back_cancel_makes_the_run_pending(self, sessions):
        resumer, admin, db = sessions
        lease = await make_run(db, "waiting")
        await admin.begin()
        assert (await admin.call(CANCEL, lease.run_id, at(10))).value == "cancelled"

        resume = resumer.spawn(RESUME, lease.run_id, at(11))
        await assert_waits_for(db, resumer, admin, resume)
        await admin.rollback()

        assert await finished(resume) == Outcome(value=True)
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["wait_reason"], row["run_after"]) == ("pending", None, at(11))
        assert row["cancel_requested_at"] is None
