"""Scripted interleavings of the claims: two real sessions, one holding its transaction open.

claim_pending and claim_orphaned lock slots and runs with FOR UPDATE SKIP LOCKED, so a claimer
never queues behind another claimer or a renewal: it skips the held row and takes the next one,
or reports the empty / saturated marker. enqueue_run with a repeated idempotency key is the one
call here that is meant to wait (on the unique-index entry of the first, uncommitted insert).
Every clock is injected with now_override; the lease of a factory run expires at at(60).
"""

from __future__ import annotations

import asyncio

from helpers import DEPLOYMENT, WORKER, at, enqueue, make_run, run_row
from interleave import (
    assert_waits_for,
    finished,
    finishes_without_waiting,
    only,
)

CLAIM = """SELECT run_id, lease_generation, concurrency_saturated, active_count
             FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
                  max_concurrency => $3, batch_size => 1, lease_seconds => 60,
                  now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation, recovery_checkpoint_id, concurrency_saturated
                      FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
                          max_concurrency => $3, lease_seconds => 60, now_override => $4)"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => 60, now_override => $4)"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => '{"step": 1}', now_override => $4)"""
ENQUEUE = """SELECT run_id, created, status FROM zeroth_test.enqueue_run(deployment_ref => $1,
                 idempotency_key => $2, now_override => $3)"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
            FROM zeroth_test.slot_leases s WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
SLOT_ROWS = "SELECT count(*) FROM zeroth.admission_slots s WHERE s.deployment_ref = $1"
KEYED = """SELECT r.run_id FROM zeroth.runs r
            WHERE r.deployment_ref = $1 AND r.idempotency_key = $2"""

SWEEPER = "worker-b"
OTHER_SWEEPER = "worker-c"
# Run once without admission and once holding slot 1 of max_concurrency=1, each in its own
# deployment so the two runs share no slot rows.
ADMISSION = ((None, "deploy-free"), (1, "deploy-slotted"))


# ------------------------------------------------------------------------------------------------
# Sessions




# ------------------------------------------------------------------------------------------------
# claim_pending vs claim_pending


class TestClaimPendingSkipsARunAnotherClaimerHolds:
    async def test_second_claimer_takes_the_next_run_while_the_first_claim_is_open(self, sessions):
        a, b, db = sessions
        first = await enqueue(db, priority=10)
        second = await enqueue(db)
        await a.begin()
        claimed_by_a = only(await a.rows(CLAIM, DEPLOYMENT, WORKER, None, at(1)))
        assert claimed_by_a["run_id"] == first

        claimed_by_b = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM, DEPLOYMENT, SWEEPER, None, at(1), rows=True)))
        await a.commit()

        assert claimed_by_b["run_id"] == second
        assert claimed_by_b["lease_generation"] == 1
        for run_id, worker in ((first, WORKER), (second, SWEEPER)):
            row = await run_row(db, run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
                "pending", worker, 1)
            assert row["lease_expires_at"] == at(61)

    async def test_second_claimer_gets_the_empty_marker_when_the_only_run_is_held(self, sessions):
        a, b, db = sessions
        run_id = await enqueue(db)
        await a.begin()
        assert only(await a.rows(CLAIM, DEPLOYMENT, WORKER, None, at(1)))["run_id"] == run_id

        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM, DEPLOYMENT, SWEEPER, None, at(1), rows=True)))
        await a.commit()

        assert marker["run_id"] is None
        assert marker["concurrency_saturated"] is False
        row = await run_row(db, run_id)
        assert (row["lease_worker_id"], row["lease_generation"]) == (WORKER, 1)

    async def test_run_held_by_a_rolled_back_claim_is_claimable_again(self, sessions):
        a, b, db = sessions
        run_id = await enqueue(db)
        await a.begin()
        assert only(await a.rows(CLAIM, DEPLOYMENT, WORKER, None, at(1)))["run_id"] == run_id
        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM, DEPLOYMENT, SWEEPER, None, at(1), rows=True)))
        assert marker["run_id"] is None

        await a.rollback()
        claimed_by_b = only(await b.rows(CLAIM, DEPLOYMENT, SWEEPER, None, at(2)))

        # The rolled-back claim's generation bump is gone with it: B's claim is generation 1.
        assert (claimed_by_b["run_id"], claimed_by_b["lease_generation"]) == (run_id, 1)
        row = await run_row(db, run_id)
        assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
            "pending", SWEEPER, 1)
        assert row["lease_expires_at"] == at(62)


class TestClaimPendingAdmissionNeverWaits:
    @staticmethod
    async def existing_slot(db):
        # A committed claim and completion under max_concurrency=1 leaves slot row 1, free.
        await make_run(db, "completed", max_concurrency=1)
        assert await db.fetchval(SLOT_ROWS, DEPLOYMENT) == 1

    async def test_claimer_is_saturated_without_waiting_while_the_only_slot_is_held_open(
            self, sessions):
        a, b, db = sessions
        await self.existing_slot(db)
        first = await enqueue(db, priority=10)
        second = await enqueue(db)
        await a.begin()
        assert only(await a.rows(CLAIM, DEPLOYMENT, WORKER, 1, at(1)))["run_id"] == first

        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM, DEPLOYMENT, SWEEPER, 1, at(1), rows=True)))
        assert (marker["run_id"], marker["concurrency_saturated"]) == (None, True)
        await a.commit()
        after_commit = only(await b.rows(CLAIM, DEPLOYMENT, SWEEPER, 1, at(2)))

        assert after_commit["run_id"] is None
        assert after_commit["concurrency_saturated"] is True
        assert after_commit["active_count"] == 1
        assert dict(await db.fetchrow(SLOT, DEPLOYMENT)) == {
            "run_id": first, "lease_worker_id": WORKER, "lease_generation": 1,
            "lease_expires_at": at(61)}
        assert (await run_row(db, first))["admission_slot"] == 1
        untouched = await run_row(db, second)
        assert (untouched["lease_worker_id"], untouched["lease_generation"]) == (None, 0)

    async def test_slot_of_a_rolled_back_claim_goes_to_the_next_claimer(self, sessions):
        a, b, db = sessions
        await self.existing_slot(db)
        run_id = await enqueue(db)
        await a.begin()
        assert only(await a.rows(CLAIM, DEPLOYMENT, WORKER, 1, at(1)))["run_id"] == run_id
        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM, DEPLOYMENT, SWEEPER, 1, at(1), rows=True)))
        assert marker["concurrency_saturated"] is True

        await a.rollback()
        claimed_by_b = only(await b.rows(CLAIM, DEPLOYMENT, SWEEPER, 1, at(2)))

        assert (claimed_by_b["run_id"], claimed_by_b["lease_generation"]) == (run_id, 1)
        assert dict(await db.fetchrow(SLOT, DEPLOYMENT)) == {
            "run_id": run_id, "lease_worker_id": SWEEPER, "lease_generation": 1,
            "lease_expires_at": at(62)}
        row = await run_row(db, run_id)
        assert (row["lease_worker_id"], row["admission_slot"]) == (SWEEPER, 1)

    async def test_first_claim_in_a_new_scope_does_not_make_a_concurrent_claimer_wait(
            self, sessions):
        # sql/README.md: claims do not queue behind another claimer. Here A's claim is the
        # scope's first under max_concurrency, so A's open transaction is the one that inserted
        # the slot rows: B's INSERT of the same rows would wait for A's commit, so B gives up
        # after its 10 ms lock_timeout and reports saturation, while A is still open.
        a, b, db = sessions
        run_id = await enqueue(db)
        assert await db.fetchval(SLOT_ROWS, DEPLOYMENT) == 0
        await a.begin()
        assert only(await a.rows(CLAIM, DEPLOYMENT, WORKER, 1, at(1)))["run_id"] == run_id

        # B finishes while A stays open (had it queued behind A, the wait would never end).
        claim = b.spawn(CLAIM, DEPLOYMENT, SWEEPER, 1, at(1), rows=True)
        marker = only(await asyncio.wait_for(asyncio.shield(claim), timeout=30))
        await a.commit()

        assert (marker["run_id"], marker["concurrency_saturated"]) == (None, True)
        assert await db.fetchval(SLOT_ROWS, DEPLOYMENT) == 1
        assert (await db.fetchrow(SLOT, DEPLOYMENT))["run_id"] == run_id


# ------------------------------------------------------------------------------------------------
# claim_orphaned vs claim_orphaned


class TestClaimOrphanedSkipsAnOrphanAnotherSweeperHolds:
    @staticmethod
    async def orphan_with_checkpoint(db):
        lease = await make_run(db, "running")
        checkpoint_id = await db.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, at(1))
        assert checkpoint_id is not None
        return lease, checkpoint_id

    async def test_second_sweeper_gets_the_empty_marker_while_the_first_takeover_is_open(
            self, sessions):
        a, b, db = sessions
        lease, checkpoint_id = await self.orphan_with_checkpoint(db)
        await a.begin()
        taken = only(await a.rows(CLAIM_ORPHANED, DEPLOYMENT, SWEEPER, None, at(61)))
        assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)

        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM_ORPHANED, DEPLOYMENT, OTHER_SWEEPER, None, at(61), rows=True)))
        await a.commit()

        assert (marker["run_id"], marker["concurrency_saturated"]) == (None, False)
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
            "running", SWEEPER, 2)
        assert row["lease_expires_at"] == at(121)
        assert row["recovery_checkpoint_id"] == checkpoint_id

    async def test_orphan_of_a_rolled_back_takeover_goes_to_the_second_sweeper(self, sessions):
        a, b, db = sessions
        lease, checkpoint_id = await self.orphan_with_checkpoint(db)
        await a.begin()
        assert only(await a.rows(CLAIM_ORPHANED, DEPLOYMENT, SWEEPER, None, at(61)))["run_id"]
        marker = only(await finishes_without_waiting(
            db, b, b.spawn(CLAIM_ORPHANED, DEPLOYMENT, OTHER_SWEEPER, None, at(61), rows=True)))
        assert marker["run_id"] is None

        await a.rollback()
        taken = only(await b.rows(CLAIM_ORPHANED, DEPLOYMENT, OTHER_SWEEPER, None, at(62)))

        assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)
        assert taken["recovery_checkpoint_id"] == checkpoint_id
        row = await run_row(db, lease.run_id)
        assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
            OTHER_SWEEPER, 2, at(122))


# ------------------------------------------------------------------------------------------------
# claim_orphaned vs the old holder's renew_lease


class TestClaimOrphanedVersusTheHoldersRenewal:
    async def test_sweeper_skips_a_run_whose_holder_is_renewing(self, sessions):
        a, b, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await a.begin()
            assert (await a.call(RENEW, lease.run_id, WORKER, 1, at(59))).value is True

            marker = only(await finishes_without_waiting(db, b, b.spawn(
                CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency, at(61), rows=True)))
            # Skipped, not taken. With a slot, the renewal holds the slot row: no free slot
            # while an orphan is visible (the committed lease still reads expired): saturated.
            assert marker["run_id"] is None
            assert marker["concurrency_saturated"] is (max_concurrency is not None)
            await a.commit()
            again = only(await b.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency,
                                      at(61)))

            # The committed renewal extended the lease: there is no orphan to take any more.
            assert (again["run_id"], again["concurrency_saturated"]) == (None, False)
            row = await run_row(db, lease.run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
                "running", WORKER, 1)
            assert row["lease_expires_at"] == at(119)
            if max_concurrency:
                slot = await db.fetchrow(SLOT, deployment_ref)
                assert (slot["run_id"], slot["lease_generation"], slot["lease_expires_at"]) == (
                    lease.run_id, 1, at(119))

    async def test_sweeper_takes_the_run_when_the_renewal_rolls_back(self, sessions):
        a, b, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await a.begin()
            assert (await a.call(RENEW, lease.run_id, WORKER, 1, at(59))).value is True
            marker = only(await finishes_without_waiting(db, b, b.spawn(
                CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency, at(61), rows=True)))
            assert marker["run_id"] is None

            await a.rollback()
            taken = only(await b.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency,
                                      at(61)))

            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)
            row = await run_row(db, lease.run_id)
            assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
                SWEEPER, 2, at(121))

    async def test_renewal_waits_for_an_open_takeover_and_is_refused_after_it_commits(
            self, sessions):
        # The renewal sampled its clock (at 60, lease still live) before the sweeper's takeover
        # (at 61) but reaches the rows after it: it waits, re-checks, and matches nothing.
        a, b, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await b.begin()
            taken = only(await b.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency,
                                      at(61)))
            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)

            renewal = a.spawn(RENEW, lease.run_id, WORKER, 1, at(60))
            await assert_waits_for(db, a, b, renewal)
            await b.commit()

            assert (await finished(renewal)).value is False
            row = await run_row(db, lease.run_id)
            assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
                SWEEPER, 2, at(121))
            if max_concurrency:
                slot = await db.fetchrow(SLOT, deployment_ref)
                assert (slot["lease_worker_id"], slot["lease_generation"]) == (SWEEPER, 2)
                assert slot["lease_expires_at"] == at(121)

    async def test_renewal_waiting_on_a_rolled_back_takeover_extends_the_lease(self, sessions):
        a, b, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await b.begin()
            assert only(await b.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency,
                                     at(61)))["run_id"] == lease.run_id

            renewal = a.spawn(RENEW, lease.run_id, WORKER, 1, at(60))
            await assert_waits_for(db, a, b, renewal)
            await b.rollback()

            assert (await finished(renewal)).value is True
            row = await run_row(db, lease.run_id)
            assert (row["lease_worker_id"], row["lease_generation"], row["lease_expires_at"]) == (
                WORKER, 1, at(120))
            if max_concurrency:
                slot = await db.fetchrow(SLOT, deployment_ref)
                assert (slot["lease_worker_id"], slot["lease_generation"]) == (WORKER, 1)
                assert slot["lease_expires_at"] == at(120)


# ------------------------------------------------------------------------------------------------
# enqueue_run with one idempotency key in two open transactions


class TestEnqueueSameIdempotencyKeyInTwoTransactions:
    async def test_second_enqueue_waits_and_returns_the_committed_run(self, sessions):
        a, b, db = sessions
        await a.begin()
        created = only(await a.rows(ENQUEUE, DEPLOYMENT, "key-1", at(0)))
        assert created["created"] is True
        await b.begin()

        duplicate = b.spawn(ENQUEUE, DEPLOYMENT, "key-1", at(1), rows=True)
        await assert_waits_for(db, b, a, duplicate)
        await a.commit()
        returned = only(await finished(duplicate))
        await b.commit()

        assert returned == {"run_id": created["run_id"], "created": False, "status": "pending"}
        assert [r["run_id"] for r in await db.fetch(KEYED, DEPLOYMENT, "key-1")] == [
            created["run_id"]]
        row = await run_row(db, created["run_id"])
        assert (row["created_at"], row["lease_generation"]) == (at(0), 0)

    async def test_second_enqueue_creates_the_run_when_the_first_rolls_back(self, sessions):
        a, b, db = sessions
        await a.begin()
        rolled_back = only(await a.rows(ENQUEUE, DEPLOYMENT, "key-1", at(0)))
        await b.begin()

        duplicate = b.spawn(ENQUEUE, DEPLOYMENT, "key-1", at(1), rows=True)
        await assert_waits_for(db, b, a, duplicate)
        await a.rollback()
        returned = only(await finished(duplicate))
        await b.commit()

        assert returned["created"] is True
        assert returned["run_id"] != rolled_back["run_id"]
        assert [r["run_id"] for r in await db.fetch(KEYED, DEPLOYMENT, "key-1")] == [
            returned["run_id"]]
        assert (await run_row(db, returned["run_id"]))["created_at"] == at(1)
