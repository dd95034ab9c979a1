"""Scripted interleavings of zeroth.sleep_run with the calls it can meet: a takeover of the
lease after it expired, a cancel request, the holder's own completion.

Exactly one wins each race and a stale sleep never lands: a sleep that waited for the row while a
takeover committed matches nothing (the fence is in the UPDATE, judged on the newest row and the
clock read after the lock), and a takeover meeting a sleep in progress skips the row (SKIP LOCKED)
and then finds a pending run, not an orphan. A cancel request and a sleep serialise on the run row
and end the same way in either order: cancelled. Clocks are injected with now_override; factory
leases expire at at(60).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from helpers import WORKER, at, make_run, run_row
from interleave import Outcome, assert_waits_for, finished, finishes_without_waiting, only

SLEEP = """SELECT outcome FROM zeroth_test.sleep_run(run_id => $1, worker_id => $2,
               generation => $3, delay_seconds => 30, checkpoint => '{"step": 2}',
               now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, max_concurrency => $3,
                        lease_seconds => 60, now_override => $4) WHERE run_id IS NOT NULL"""
CLAIM_AND_START = """SELECT run_id, lease_generation, recovery_checkpoint_id
                       FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => $2,
                           max_concurrency => $3, now_override => $4) WHERE run_id IS NOT NULL"""
CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"done": true}', now_override => $4)"""
CHECKPOINTS = "SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = $1"
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
SWEEPER = "worker-b"
ADMISSION = ((None, "deploy-free"), (1, "deploy-slotted"))


async def slot(db: asyncpg.Connection, deployment_ref: str) -> tuple[Any, ...]:
    return tuple(await db.fetchrow(SLOT, deployment_ref))


class TestSleepVersusTakeover:
    async def test_a_stale_sleep_that_waited_for_the_takeover_matches_nothing(self, sessions):
        """The sleep read its clock at 59 (lease live to 60); the takeover at 61 holds the row."""
        holder, sweeper, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await sweeper.begin()
            taken = only(await sweeper.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER,
                                            max_concurrency, at(61)))
            assert (taken["run_id"], taken["lease_generation"]) == (lease.run_id, 2)
            new_lease = dict(await run_row(sweeper.conn, lease.run_id))

            stale = holder.spawn(SLEEP, lease.run_id, WORKER, 1, at(59))
            await assert_waits_for(db, holder, sweeper, stale)
            await sweeper.commit()

            assert await finished(stale) == Outcome(value=None)
            assert dict(await run_row(db, lease.run_id)) == new_lease
            assert await db.fetchval(CHECKPOINTS, lease.run_id) == 0
            if max_concurrency:
                assert await slot(db, deployment_ref) == (lease.run_id, SWEEPER, 2)

    async def test_a_takeover_meeting_a_sleep_in_progress_skips_it_and_then_finds_no_orphan(
            self, sessions):
        holder, sweeper, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await holder.begin()
            assert (await holder.call(SLEEP, lease.run_id, WORKER, 1, at(59))).value == "sleeping"

            # The lease would have expired by 61, but the row is locked: SKIP LOCKED, no wait.
            skipped = await finishes_without_waiting(db, sweeper, sweeper.spawn(
                CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency, at(61), rows=True))
            assert skipped == Outcome(value=[])
            await holder.commit()

            # Committed: a pending run sleeping until 89, which is nobody's orphan.
            assert await sweeper.rows(CLAIM_ORPHANED, deployment_ref, SWEEPER, max_concurrency,
                                      at(61)) == Outcome(value=[])
            assert await sweeper.rows(CLAIM_AND_START, deployment_ref, SWEEPER, max_concurrency,
                                      at(88)) == Outcome(value=[])
            resumed = only(await sweeper.rows(CLAIM_AND_START, deployment_ref, SWEEPER,
                                              max_concurrency, at(89)))
            assert (resumed["run_id"], resumed["lease_generation"]) == (lease.run_id, 2)
            assert resumed["recovery_checkpoint_id"] is not None


class TestSleepVersusCancel:
    async def test_a_sleep_waiting_behind_a_cancel_request_cancels_the_run(self, sessions):
        holder, operator, db = sessions
        lease = await make_run(db, "running")
        await operator.begin()
        assert (await operator.call(CANCEL, lease.run_id, at(5))).value == "cancel_requested"

        sleep = holder.spawn(SLEEP, lease.run_id, WORKER, 1, at(10))
        await assert_waits_for(db, holder, operator, sleep)
        await operator.commit()

        assert await finished(sleep) == Outcome(value="cancelled")
        row = await run_row(db, lease.run_id)
        assert (row["status"], row["lease_worker_id"]) == ("cancelled", None)
        assert await db.fetchval(CHECKPOINTS, lease.run_id) == 0

    async def test_a_cancel_waiting_behind_a_sleep_cancels_the_sleeping_run(self, sessions):
        holder, operator, db = sessions
        lease = await make_run(db, "running")
        await holder.begin()
        assert (await holder.call(SLEEP, lease.run_id, WORKER, 1, at(10))).value == "sleeping"

        cancel = operator.spawn(CANCEL, lease.run_id, at(11))
        await assert_waits_for(db, operator, holder, cancel)
        await holder.commit()

        assert await finished(cancel) == Outcome(value="cancelled")
        assert (await run_row(db, lease.run_id))["status"] == "cancelled"


class TestSleepVersusTheHoldersOwnCompletion:
    @pytest.mark.parametrize("first", ["sleep", "complete"])
    async def test_only_the_first_of_sleep_and_complete_lands(self, sessions, first):
        a, b, db = sessions
        lease = await make_run(db, "running")
        calls = {"sleep": (SLEEP, lease.run_id, WORKER, 1, at(10)),
                 "complete": (COMPLETE, lease.run_id, WORKER, 1, at(10))}
        second = "complete" if first == "sleep" else "sleep"
        await a.begin()
        won = await a.call(*calls[first])

        late = b.spawn(*calls[second])
        await assert_waits_for(db, b, a, late)
        await a.commit()

        assert won.value == ("sleeping" if first == "sleep" else True)
        # The loser is refused by the fence: its lease went with the winner's write.
        assert await finished(late) == Outcome(value=None if second == "sleep" else False)
        row = await run_row(db, lease.run_id)
        assert row["status"] == ("pending" if first == "sleep" else "completed")
        assert await db.fetchval(CHECKPOINTS, lease.run_id) == (1 if first == "sleep" else 0)
