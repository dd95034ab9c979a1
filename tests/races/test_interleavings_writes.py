"""Scripted interleavings of the holder's fenced writes with admin cancels and renewals.

Session A is the lease holder, session B the admin (or a second session of the same worker);
one of them holds its transaction open while the other's call is started in the background.
A fenced write re-checks its fence after waiting on the row, so an admin cancel that committed
first wins over a stale write; a write that committed first is what the cancel sees. Every
function that may wait locks the admission slot before the run, so renewals, completions and
cancels never deadlock. Clocks are injected with now_override; factory leases expire at at(60).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from helpers import WORKER, at, make_run, run_row
from interleave import (
    DEADLINE,
    Outcome,
    Session,
    assert_waits_for,
    finished,
    finishes_without_waiting,
)

CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => 60, now_override => $4)"""
RENEW_MANY = """SELECT run_id, renewed, lease_expires_at, cancel_requested
                  FROM zeroth_test.renew_leases(worker_id => $1, run_ids => $2, generations => $3,
                       lease_seconds => 60, now_override => $4)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"ok": true}', now_override => $4)"""
CHECKPOINTS = "SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = $1"
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
            FROM zeroth_test.slot_leases s WHERE s.deployment_ref = $1 AND s.slot_no = $2"""

# Each interleaving runs once without admission and once holding slot 1 of max_concurrency=1,
# each in its own deployment so the two runs share no slot rows.
ADMISSION = ((None, "deploy-free"), (1, "deploy-slotted"))


# ------------------------------------------------------------------------------------------------
# The holder's fenced writes: $1 run_id, $2 worker_id, $3 generation, $4 now_override.


@dataclass(frozen=True, slots=True)
class Write:
    sql: str
    refused: Any        # the return value when fenced out
    applied: Any        # the return value when applied (Ellipsis: any non-NULL value)
    status_after: str   # the run's status once the write is applied


WRITES = {
    "start_run": Write(
        """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", False, True, "running"),
    "commit_fenced": Write(
        """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
               columns => '{"progress": {"n": 1}}', now_override => $4)""", False, True, "running"),
    "save_checkpoint": Write(
        """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
               data => '{"step": 1}', now_override => $4)""", None, ..., "running"),
    "complete_run": Write(COMPLETE, False, True, "completed"),
    "fail_run": Write(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => '{"reason": "boom"}', retryable => false, now_override => $4)""",
        None, "failed", "failed"),
    "cancel_run": Write(
        """SELECT zeroth_test.cancel_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", False, True, "cancelled"),
    "pause_run": Write(
        """SELECT zeroth_test.pause_run(run_id => $1, worker_id => $2, generation => $3,
               reason => 'approval', now_override => $4)""", False, True, "waiting"),
}
# What request_cancel answers once the write has committed (the lease, if any, is still live).
CANCEL_AFTER = {"start_run": "cancel_requested", "commit_fenced": "cancel_requested",
                "save_checkpoint": "cancel_requested", "complete_run": "not_cancellable",
                "fail_run": "not_cancellable", "cancel_run": "not_cancellable",
                "pause_run": "cancelled"}


def starting_status(name: str) -> str:
    # start_run is the pending → running edge: its holder has a claimed, not yet running run.
    return "claimed" if name == "start_run" else "running"


def assert_applied(write: Write, outcome: Any) -> None:
    assert outcome.sqlstate is None, outcome
    if write.applied is ...:
        assert outcome.value is not None
    else:
        assert outcome.value == write.applied


async def slot_row(db: asyncpg.Connection, deployment_ref: str) -> dict[str, Any]:
    return dict(await db.fetchrow(SLOT, deployment_ref, 1))


FREE_SLOT = {"run_id": None, "lease_worker_id": None, "lease_generation": None,
             "lease_expires_at": None}


# ------------------------------------------------------------------------------------------------
# Sessions




# ------------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------------
# Holder writes vs an admin request_cancel


@pytest.mark.parametrize("name", list(WRITES))
class TestAdminCancelVersusHolderWrite:
    async def test_stale_write_waits_for_the_cancel_and_is_refused_once_it_commits(
            self, sessions, name):
        # The holder's call sampled its clock at 59 (lease live) but reaches the row after the
        # admin's cancel at 61 found the lease expired and cancelled the run outright.
        holder, admin, db = sessions
        write = WRITES[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, starting_status(name), deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await admin.begin()
            assert (await admin.call(CANCEL, lease.run_id, at(61))).value == "cancelled"
            cancelled = dict(await run_row(admin.conn, lease.run_id))

            stale = holder.spawn(write.sql, lease.run_id, WORKER, 1, at(59))
            await assert_waits_for(db, holder, admin, stale)
            await admin.commit()

            assert await finished(stale) == Outcome(value=write.refused)
            row = dict(await run_row(db, lease.run_id))
            assert row == cancelled
            assert (row["status"], row["lease_worker_id"], row["finished_at"]) == (
                "cancelled", None, at(61))
            assert await db.fetchval(CHECKPOINTS, lease.run_id) == 0
            if max_concurrency:
                assert await slot_row(db, deployment_ref) == FREE_SLOT

    async def test_write_waiting_on_a_rolled_back_cancel_is_applied(self, sessions, name):
        holder, admin, db = sessions
        write = WRITES[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, starting_status(name), deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await admin.begin()
            assert (await admin.call(CANCEL, lease.run_id, at(61))).value == "cancelled"

            pending_write = holder.spawn(write.sql, lease.run_id, WORKER, 1, at(59))
            await assert_waits_for(db, holder, admin, pending_write)
            await admin.rollback()

            assert_applied(write, await finished(pending_write))
            row = await run_row(db, lease.run_id)
            assert row["status"] == write.status_after
            assert row["cancel_requested_at"] == (at(59) if name == "cancel_run" else None)

    async def test_cancel_waits_for_the_holder_write_and_sees_the_new_status(
            self, sessions, name):
        holder, admin, db = sessions
        write = WRITES[name]
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, starting_status(name), deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await holder.begin()
            assert_applied(write, await holder.call(write.sql, lease.run_id, WORKER, 1, at(30)))

            cancel = admin.spawn(CANCEL, lease.run_id, at(31))
            await assert_waits_for(db, admin, holder, cancel)
            await holder.commit()

            answer = CANCEL_AFTER[name]
            assert await finished(cancel) == Outcome(value=answer)
            row = await run_row(db, lease.run_id)
            if answer == "cancel_requested":
                # Still running under the holder's live lease, now flagged for cancellation.
                assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
                    "running", WORKER, 1)
                assert (row["cancel_requested_at"], row["cancel_action"]) == (at(31), "cancel")
            elif answer == "cancelled":
                # The paused run was cancelled outright.
                assert (row["status"], row["wait_reason"], row["finished_at"]) == (
                    "cancelled", None, at(31))
                assert row["cancel_requested_at"] == at(31)
            else:
                assert (row["status"], row["lease_worker_id"], row["finished_at"]) == (
                    write.status_after, None, at(30))
                assert row["cancel_requested_at"] == (at(30) if name == "cancel_run" else None)
            if max_concurrency:
                slot = await slot_row(db, deployment_ref)
                held = answer == "cancel_requested"
                assert (slot["run_id"] is not None) is held

    async def test_cancel_request_on_a_live_lease_does_not_fence_the_waiting_write(
            self, sessions, name):
        # With the lease live the cancel is only a durable request: the holder's write, which
        # waited on the admin's row lock, is applied afterwards (the first action wins).
        holder, admin, db = sessions
        write = WRITES[name]
        for max_concurrency, deployment_ref in ADMISSION:
            # start_run is idempotent for the holder of a running run.
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await admin.begin()
            assert (await admin.call(CANCEL, lease.run_id, at(30))).value == "cancel_requested"

            pending_write = holder.spawn(write.sql, lease.run_id, WORKER, 1, at(31))
            await assert_waits_for(db, holder, admin, pending_write)
            await admin.commit()

            assert_applied(write, await finished(pending_write))
            row = await run_row(db, lease.run_id)
            assert row["status"] == write.status_after
            assert (row["cancel_requested_at"], row["cancel_action"]) == (at(30), "cancel")


# ------------------------------------------------------------------------------------------------
# renew_lease vs complete_run of one run by one worker in two sessions


class TestRenewalVersusCompletionBySameWorker:
    async def test_completion_waits_for_an_open_renewal_and_then_completes(self, sessions):
        renewer, completer, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await renewer.begin()
            assert (await renewer.call(RENEW, lease.run_id, WORKER, 1, at(30))).value is True

            completion = completer.spawn(COMPLETE, lease.run_id, WORKER, 1, at(31))
            await assert_waits_for(db, completer, renewer, completion)
            await renewer.commit()

            assert await finished(completion) == Outcome(value=True)
            row = await run_row(db, lease.run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "completed", None, None)
            assert (row["finished_at"], row["lease_generation"]) == (at(31), 1)
            if max_concurrency:
                assert await slot_row(db, deployment_ref) == FREE_SLOT

    async def test_renewal_waits_for_an_open_completion_and_is_refused(self, sessions):
        renewer, completer, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await completer.begin()
            assert (await completer.call(COMPLETE, lease.run_id, WORKER, 1, at(30))).value

            renewal = renewer.spawn(RENEW, lease.run_id, WORKER, 1, at(31))
            await assert_waits_for(db, renewer, completer, renewal)
            await completer.commit()

            assert await finished(renewal) == Outcome(value=False)
            row = await run_row(db, lease.run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "completed", None, None)
            if max_concurrency:
                assert await slot_row(db, deployment_ref) == FREE_SLOT

    async def test_renewal_waiting_on_a_rolled_back_completion_extends_the_lease(self, sessions):
        renewer, completer, db = sessions
        for max_concurrency, deployment_ref in ADMISSION:
            lease = await make_run(db, "running", deployment_ref=deployment_ref,
                                   max_concurrency=max_concurrency)
            await completer.begin()
            assert (await completer.call(COMPLETE, lease.run_id, WORKER, 1, at(30))).value

            renewal = renewer.spawn(RENEW, lease.run_id, WORKER, 1, at(31))
            await assert_waits_for(db, renewer, completer, renewal)
            await completer.rollback()

            assert await finished(renewal) == Outcome(value=True)
            row = await run_row(db, lease.run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "running", WORKER, at(91))
            if max_concurrency:
                slot = await slot_row(db, deployment_ref)
                assert (slot["run_id"], slot["lease_expires_at"]) == (lease.run_id, at(91))


# ------------------------------------------------------------------------------------------------
# renew_leases vs request_cancel (lock order: slot, then run)


async def slotted_runs(db: asyncpg.Connection, count: int) -> list[Any]:
    """``count`` running runs of WORKER, each holding one slot of max_concurrency=count."""
    return [await make_run(db, "running", deployment_ref="deploy-slotted",
                           max_concurrency=count) for _ in range(count)]


class TestBatchRenewalVersusCancel:
    async def test_cancel_waits_for_an_open_batch_renewal_and_sees_the_renewed_lease(
            self, sessions):
        worker, admin, db = sessions
        leases = await slotted_runs(db, 3)
        ids, generations = [x.run_id for x in leases], [x.generation for x in leases]
        await worker.begin()
        renewed = await worker.rows(RENEW_MANY, WORKER, ids, generations, at(30))
        assert [r["renewed"] for r in renewed.value] == [True, True, True]

        # At 61 the old lease (to 60) would be expired and the run cancelled outright; the
        # renewal it waited for extended the lease to 90, so it only requests the cancel.
        cancel = admin.spawn(CANCEL, ids[1], at(61))
        await assert_waits_for(db, admin, worker, cancel)
        await worker.commit()

        assert await finished(cancel) == Outcome(value="cancel_requested")
        for run_id in ids:
            row = await run_row(db, run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "running", WORKER, at(90))
        assert (await run_row(db, ids[1]))["cancel_requested_at"] == at(61)

    async def test_batch_renewal_skips_the_run_an_open_cancel_holds_then_sees_it_cancelled(
            self, sessions):
        # renew_leases does not wait for a row another session holds: the
        # held run comes back renewed NULL (not renewed, not lost), the others are renewed; the
        # next renewal, once the cancel committed, reports it gone.
        worker, admin, db = sessions
        leases = await slotted_runs(db, 3)
        ids, generations = [x.run_id for x in leases], [x.generation for x in leases]
        await admin.begin()
        assert (await admin.call(CANCEL, ids[1], at(61))).value == "cancelled"

        result = await finishes_without_waiting(db, worker, worker.spawn(
            RENEW_MANY, WORKER, ids, generations, at(59), rows=True))
        assert [(r["run_id"], r["renewed"]) for r in result.value] == [
            (ids[0], True), (ids[1], None), (ids[2], True)]
        await admin.commit()
        again = await worker.rows(RENEW_MANY, WORKER, ids, generations, at(59))
        assert [r["renewed"] for r in again.value] == [True, False, True]
        assert (await run_row(db, ids[1]))["status"] == "cancelled"
        for run_id in (ids[0], ids[2]):
            row = await run_row(db, run_id)
            assert (row["status"], row["lease_expires_at"]) == ("running", at(119))
        slots = await db.fetch("""SELECT s.run_id FROM zeroth.admission_slots s
                                   WHERE s.run_id IS NOT NULL""")
        assert sorted(r["run_id"] for r in slots) == sorted([ids[0], ids[2]])

    async def test_fifty_rounds_of_batch_renewals_racing_cancels_never_deadlock(self, sessions):
        worker, admin, db = sessions
        leases = await slotted_runs(db, 4)
        ids, generations = [x.run_id for x in leases], [x.generation for x in leases]

        async def in_transaction(session: Session, call: Any) -> Outcome:
            try:
                async with session.conn.transaction():
                    return await call
            except asyncpg.PostgresError as exc:
                return Outcome(sqlstate=exc.sqlstate)

        outcomes = []
        for round_no in range(50):
            now = at(round_no)
            # Alternate which call is sent first, and the run the admin cancels.
            renew = in_transaction(worker, worker.rows(RENEW_MANY, WORKER, ids, generations, now))
            cancel = in_transaction(admin, admin.call(CANCEL, ids[round_no % 4], now))
            pair = (renew, cancel) if round_no % 2 == 0 else (cancel, renew)
            outcomes.append(await asyncio.wait_for(asyncio.gather(*pair), timeout=DEADLINE))

        errors = [o.sqlstate for pair in outcomes for o in pair if o.sqlstate is not None]
        assert "40P01" not in errors
        assert errors == []
        last_renewed = [0] * 4
        for round_no, pair in enumerate(outcomes):
            renew, cancel = pair if round_no % 2 == 0 else pair[::-1]
            renewed = [r["renewed"] for r in renew.value]
            target = round_no % 4
            # The run the cancel holds at that moment is skipped (NULL), never waited for.
            assert [r for i, r in enumerate(renewed) if i != target] == [True] * 3
            assert renewed[target] in (True, None)
            assert cancel.value == "cancel_requested"
            for i, ok in enumerate(renewed):
                if ok:
                    last_renewed[i] = round_no
        for run_id, last in zip(ids, last_renewed, strict=True):
            row = await run_row(db, run_id)
            assert (row["status"], row["lease_worker_id"], row["lease_expires_at"]) == (
                "running", WORKER, at(last + 60))
            assert row["cancel_requested_at"] is not None
        slots = await db.fetch("""SELECT s.run_id, s.lease_expires_at FROM zeroth_test.slot_leases s
                                   WHERE s.deployment_ref = 'deploy-slotted'""")
        assert sorted((r["run_id"], r["lease_expires_at"]) for r in slots) == sorted(
            (run_id, at(last + 60)) for run_id, last in zip(ids, last_renewed, strict=True))
