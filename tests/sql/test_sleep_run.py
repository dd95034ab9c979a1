"""zeroth.sleep_run: durable sleep — the live holder ends its attempt with "resume me at T".

running → pending with run_after = T, the lease cleared, the slot freed, the attempt given back
(a sleep is not a failure), optionally with a checkpoint saved in the same call; the next claim
at T delivers the latest checkpoint as the recovery checkpoint. A pending cancel request wins.
"""

from __future__ import annotations

import json
from datetime import timedelta

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
from thread_calls import THREAD, admit

SLEEP = """SELECT outcome, run_after, checkpoint_id FROM zeroth_test.sleep_run(
               run_id => $1, worker_id => $2, generation => $3, resume_at => $4,
               delay_seconds => $5, checkpoint => $6::text::jsonb, tenant_id => $7,
               workspace_id => $8, now_override => $9)"""
CLAIM_AND_START = """SELECT * FROM zeroth_test.claim_and_start(deployment_ref => $1,
                         worker_id => $2, max_concurrency => $3, now_override => $4)
                      WHERE run_id IS NOT NULL"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation, attempts FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3, data => $4::text::jsonb, now_override => $5)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"done": true}', now_override => $4)"""
REQUEST_CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, action => $2,
                        now_override => $3)"""
CHECKPOINTS = """SELECT k.checkpoint_id, k.checkpoint_order, k.lease_generation, k.data
                   FROM zeroth.checkpoints k WHERE k.run_id = $1 ORDER BY k.checkpoint_order"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)


async def sleep(conn, run_id, worker_id=WORKER, generation=1, *, resume_at=None,
                delay_seconds=None, checkpoint=None, tenant_id=None, workspace_id=None,
                now=NOW):
    text = None if checkpoint is None else json.dumps(checkpoint)
    return await conn.fetchrow(SLEEP, run_id, worker_id, generation, resume_at, delay_seconds,
                               text, tenant_id, workspace_id, now)


async def claim_and_start(conn, *, worker_id=WORKER, max_concurrency=None, now):
    return await conn.fetch(CLAIM_AND_START, DEPLOYMENT, worker_id, max_concurrency, now)


async def assert_raises(conn, sqlstate, call, *args, **kwargs):
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await call(conn, *args, **kwargs)
    assert info.value.sqlstate == sqlstate
    return info.value


async def checkpoints(conn, run_id):
    return [dict(row) for row in await conn.fetch(CHECKPOINTS, run_id)]


class TestSleepOfARunningRun:
    async def test_sleep_makes_the_run_pending_until_t_without_a_lease(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        result = await sleep(conn, lease.run_id, delay_seconds=30)

        assert (result["outcome"], result["run_after"], result["checkpoint_id"]) == (
            "sleeping", at(40), None)
        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert row["run_after"] == at(40)
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["recovery_checkpoint_id"] is None
        assert row["finished_at"] is None
        assert row["updated_at"] == NOW
        # Only the next owner bumps the generation.
        assert row["lease_generation"] == 1
        # A sleep is not a failure: the attempt claim_and_start counted is given back.
        assert (before["attempts"], row["attempts"]) == (1, 0)

    async def test_resume_at_sets_run_after_to_exactly_that_instant(self, conn):
        lease = await make_run(conn, "running")

        result = await sleep(conn, lease.run_id, resume_at=at(3600))

        assert result["run_after"] == at(3600)
        assert (await run_row(conn, lease.run_id))["run_after"] == at(3600)

    async def test_resume_at_in_the_past_resumes_now(self, conn):
        lease = await make_run(conn, "running")

        result = await sleep(conn, lease.run_id, resume_at=at(-1000))

        assert result["run_after"] == NOW
        rows = await claim_and_start(conn, worker_id=OTHER, now=NOW)
        assert [r["run_id"] for r in rows] == [lease.run_id]

    async def test_zero_delay_resumes_now(self, conn):
        lease = await make_run(conn, "running")

        assert (await sleep(conn, lease.run_id, delay_seconds=0))["run_after"] == NOW

    async def test_the_delay_is_counted_on_the_database_clock_read_under_the_lock(self, conn):
        lease = await make_run(conn, "running")

        result = await sleep(conn, lease.run_id, delay_seconds=1.5, now=at(20))

        assert result["run_after"] == at(21.5)


class TestResumeAfterTheSleep:
    async def test_a_sleeping_run_is_claimed_by_nobody_before_t(self, conn):
        lease = await make_run(conn, "running")
        await sleep(conn, lease.run_id, delay_seconds=30)

        assert await claim_and_start(conn, worker_id=OTHER, now=at(39)) == []
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(10_000)) == []
        assert (await run_row(conn, lease.run_id))["status"] == "pending"

    async def test_at_t_any_worker_claims_it_with_the_sleeps_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        result = await sleep(conn, lease.run_id, delay_seconds=30, checkpoint={"step": 2})

        (row,) = await claim_and_start(conn, worker_id=OTHER, now=at(40))

        assert row["run_id"] == lease.run_id
        assert row["lease_generation"] == 2
        assert row["status"] == "running"
        assert row["attempts"] == 1
        assert row["recovery_checkpoint_id"] == result["checkpoint_id"]
        assert json.loads(row["checkpoint_data"]) == {"step": 2}

    async def test_the_checkpoint_is_written_with_the_sleep_after_earlier_ones(self, conn):
        lease = await make_run(conn, "running")
        first = await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1,
                                    json.dumps({"step": 1}), at(5))

        result = await sleep(conn, lease.run_id, delay_seconds=1, checkpoint={"step": 2})

        saved = await checkpoints(conn, lease.run_id)
        assert [(k["checkpoint_id"], k["checkpoint_order"], k["lease_generation"]) for k in saved] \
            == [(first, 1, 1), (result["checkpoint_id"], 2, 1)]
        assert json.loads(saved[1]["data"]) == {"step": 2}
        assert (await run_row(conn, lease.run_id))["checkpoint_seq"] == 2

    async def test_without_a_checkpoint_the_resume_gets_the_latest_saved_one(self, conn):
        lease = await make_run(conn, "running")
        latest = await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1,
                                     json.dumps({"step": 7}), at(5))
        await sleep(conn, lease.run_id, delay_seconds=1)

        (row,) = await claim_and_start(conn, worker_id=OTHER, now=at(11))

        assert row["recovery_checkpoint_id"] == latest

    async def test_a_run_without_any_checkpoint_resumes_without_one(self, conn):
        lease = await make_run(conn, "running")
        await sleep(conn, lease.run_id, delay_seconds=1)

        (row,) = await claim_and_start(conn, worker_id=OTHER, now=at(11))

        assert (row["recovery_checkpoint_id"], row["checkpoint_data"]) == (None, None)


class TestAttemptsAcrossSleeps:
    async def test_ten_sleeps_with_max_attempts_three_still_complete(self, conn):
        run_id = (await make_run(conn, "pending", max_attempts=3)).run_id
        t = 100.0
        for n in range(10):
            (row,) = await claim_and_start(conn, now=at(t))
            assert row["attempts"] == 1
            result = await sleep(conn, run_id, generation=row["lease_generation"],
                                 delay_seconds=5, checkpoint={"n": n}, now=at(t + 1))
            assert result["outcome"] == "sleeping"
            t += 6
        (row,) = await claim_and_start(conn, now=at(t))
        assert json.loads(row["checkpoint_data"]) == {"n": 9}
        assert await conn.fetchval(COMPLETE, run_id, WORKER, row["lease_generation"], at(t + 1))

        final = await run_row(conn, run_id)
        assert (final["status"], final["attempts"], final["lease_generation"]) == (
            "completed", 1, 11)

    async def test_a_crash_after_a_sleep_still_counts_as_a_failed_attempt(self, conn):
        lease = await make_run(conn, "running", max_attempts=3)
        await sleep(conn, lease.run_id, delay_seconds=1)
        (row,) = await claim_and_start(conn, worker_id=OTHER, now=at(11))
        assert row["attempts"] == 1

        # OTHER dies without a word: its lease expires, the recovery counts the next attempt
        # and the dead one stays counted.
        (orphan,) = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, WORKER, at(11 + 61))

        assert (orphan["run_id"], orphan["attempts"]) == (lease.run_id, 2)


class TestSleepFreesTheSlot:
    async def test_sleep_frees_the_slot_for_another_run(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        other_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await sleep(conn, lease.run_id, delay_seconds=60)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert [r["run_id"] for r in rows] == [other_run]


class TestSleepAndCancel:
    @pytest.mark.parametrize("action", ["cancel", "interrupt", "rollback"])
    async def test_a_pending_cancel_request_cancels_the_run_instead(self, conn, action):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, action, at(5)) == \
            "cancel_requested"

        result = await sleep(conn, lease.run_id, delay_seconds=30, checkpoint={"step": 2})

        assert (result["outcome"], result["run_after"], result["checkpoint_id"]) == (
            "cancelled", None, None)
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["cancel_action"], row["finished_at"]) == (
            "cancelled", action, NOW)
        assert row["lease_worker_id"] is None
        assert row["run_after"] == at(0)  # not rescheduled
        # No resume point is saved for a run that will not resume.
        assert await checkpoints(conn, lease.run_id) == []

    async def test_a_cancel_request_for_a_sleeping_run_cancels_it_at_once(self, conn):
        lease = await make_run(conn, "running")
        await sleep(conn, lease.run_id, delay_seconds=3600)

        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, "cancel", at(20)) == "cancelled"

        assert (await run_row(conn, lease.run_id))["status"] == "cancelled"
        assert await claim_and_start(conn, worker_id=OTHER, now=at(10_000)) == []


class TestSleepingThreadRun:
    async def test_a_sleeping_thread_run_keeps_its_place_and_the_queue_waits(self, conn):
        lease = await make_run(conn, "running", thread_id="t-1")
        await sleep(conn, lease.run_id, delay_seconds=30)
        queued = await enqueue(conn, thread_id="t-1", now=at(11))

        queued_row = await run_row(conn, queued)
        assert queued_row["status"] == "waiting"
        assert queued_row["thread_queued_at"] is not None
        # At T the sleeper resumes, not the queued run; when it ends the queue moves.
        (row,) = await claim_and_start(conn, worker_id=OTHER, now=at(40))
        assert row["run_id"] == lease.run_id
        assert await conn.fetchval(COMPLETE, lease.run_id, OTHER, 2, at(41))
        promoted = await run_row(conn, queued)
        assert (promoted["status"], promoted["thread_queued_at"]) == ("pending", None)

    @pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
    async def test_an_interrupting_admission_cancels_the_sleeper_and_takes_the_thread(
            self, conn, strategy):
        lease = await make_run(conn, "running", thread_id=THREAD)
        await sleep(conn, lease.run_id, delay_seconds=3600)

        admitted = await admit(conn, THREAD, strategy, now=at(20))

        assert admitted["status"] == "pending"
        assert admitted["run_id"] != lease.run_id
        assert (await run_row(conn, lease.run_id))["status"] == "cancelled"

    async def test_a_rejecting_admission_meets_the_sleeper_as_the_active_run(self, conn):
        lease = await make_run(conn, "running", thread_id=THREAD)
        await sleep(conn, lease.run_id, delay_seconds=3600)

        refused = await admit(conn, THREAD, "reject", now=at(20))

        assert refused["active_run_id"] == lease.run_id
        assert (await run_row(conn, lease.run_id))["status"] == "pending"

    async def test_a_cancelled_sleep_of_a_thread_run_promotes_the_queue(self, conn):
        lease = await make_run(conn, "running", thread_id="t-1")
        queued = await enqueue(conn, thread_id="t-1", now=at(1))
        await conn.fetchval(REQUEST_CANCEL, lease.run_id, "cancel", at(5))

        assert (await sleep(conn, lease.run_id, delay_seconds=30))["outcome"] == "cancelled"

        assert (await run_row(conn, queued))["status"] == "pending"


class TestSleepRejectsBadArguments:
    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [({}, "exactly one"),
         ({"delay_seconds": 1.0, "resume_at": at(100)}, "exactly one"),
         ({"delay_seconds": -0.001}, "delay_seconds"),
         ({"delay_seconds": float("nan")}, "delay_seconds"),
         ({"delay_seconds": float("inf")}, "delay_seconds"),
         ({"delay_seconds": 366 * 86400 + 1.0}, "delay_seconds"),
         ({"resume_at": "infinity"}, "finite"),
         ({"resume_at": "-infinity"}, "finite"),
         ({"resume_at": at(10 + 366 * 86400 + 1)}, "at most")],
        ids=["neither", "both", "negative", "nan", "inf", "too_long", "infinity",
             "minus_infinity", "resume_at_too_far"])
    async def test_bad_time_raises_zp008_and_changes_nothing(self, conn, kwargs, message):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)
        if isinstance(kwargs.get("resume_at"), str):
            text = kwargs["resume_at"]
            kwargs = {"resume_at": await conn.fetchval(f"SELECT '{text}'::timestamptz")}

        error = await assert_raises(conn, "ZP008", sleep, lease.run_id, checkpoint={"x": 1},
                                    **kwargs)

        assert message in str(error)
        assert dict(await run_row(conn, lease.run_id)) == dict(before)
        assert await checkpoints(conn, lease.run_id) == []

    async def test_the_longest_sleep_is_accepted(self, conn):
        lease = await make_run(conn, "running")

        result = await sleep(conn, lease.run_id, delay_seconds=366 * 86400)

        assert result["run_after"] == NOW + timedelta(days=366)

class TestSleepNotifiesOnlyWhatIsDue:
    async def test_a_sleep_for_later_wakes_nobody(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running")
        queue = await listen(listener, "zeroth_wakeup")

        assert (await sleep(actor, lease.run_id, delay_seconds=30))["outcome"] == "sleeping"
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        # Notifications arrive in commit order: nothing came before the sentinel.
        assert await next_payload(queue) == "sentinel"

    async def test_a_sleep_that_is_due_now_notifies_its_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", tenant_id="acme", workspace_id="ws-1")
        queue = await listen(listener, "zeroth_wakeup", ((DEPLOYMENT, "acme", "ws-1"),))

        await sleep(actor, lease.run_id, delay_seconds=0, tenant_id="acme", workspace_id="ws-1")

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "acme", "ws-1")

    async def test_a_sleep_that_frees_a_slot_notifies(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", max_concurrency=1)
        queue = await listen(listener, "zeroth_wakeup")

        await sleep(actor, lease.run_id, delay_seconds=3600)

        assert await next_payload(queue) == await wakeup_key(actor)
