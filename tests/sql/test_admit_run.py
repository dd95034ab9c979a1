"""zeroth.admit_run: one active run per thread, strategies, admit-and-own, idempotency.

Ports the admission cases of deer-flow's test list (seed spec §17, "Admission and uniqueness")
that apply; each runs on real PostgreSQL with two distinct worker ids.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg
import pytest
from helpers import DEPLOYMENT, at, claim, control_key, make_run, run_row
from thread_calls import (
    OTHER,
    OWNER,
    THREAD,
    active,
    admit,
    fenced,
    own_running,
    queue,
    status,
)

RESUME = "SELECT zeroth_test.resume_run(run_id => $1, now_override => $2)"
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"
ENQUEUE = """SELECT run_id, created, status::text AS status FROM zeroth_test.enqueue_run(
                 deployment_ref => $1, thread_id => $2, now_override => $3)"""
REQUEST_CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"


class TestIdleThread:
    async def test_reject_succeeds_when_no_active_run(self, conn):
        admitted = await admit(conn)

        assert admitted["outcome"] == "admitted"
        assert admitted["status"] == "pending"
        assert (admitted["lease_generation"], admitted["lease_expires_at"]) == (None, None)
        assert (admitted["active_run_id"], admitted["retry_after_s"]) == (None, None)
        row = await run_row(conn, admitted["run_id"])
        assert (row["thread_id"], row["lease_worker_id"], row["resumable"]) == (THREAD, None, True)
        # Without an owner the run is queue work: any worker of the deployment claims it.
        assert [r["run_id"] for r in await claim(conn)] == [admitted["run_id"]]

    async def test_run_record_stores_owner_and_lease(self, conn):
        admitted = await admit(conn, worker_id=OWNER, lease_seconds=30)

        assert (admitted["outcome"], admitted["status"]) == ("admitted", "pending")
        assert admitted["lease_generation"] == 1
        assert admitted["lease_expires_at"] == at(30)
        row = await run_row(conn, admitted["run_id"])
        assert (row["lease_worker_id"], row["lease_generation"], row["lease_acquired_at"],
                row["lease_expires_at"]) == (OWNER, 1, at(0), at(30))
        assert row["resumable"] is False  # admit-and-own: terminal on owner loss (deer-flow)
        assert await fenced(conn, "start_run", admitted["run_id"], OWNER, 1, now=at(1))

    async def test_owned_run_is_not_claimable_while_its_lease_lives(self, conn):
        await admit(conn, worker_id=OWNER)

        assert await claim(conn, worker_id=OTHER, now=at(59)) == []

    async def test_owned_run_never_started_is_claimed_once_its_lease_lapses_and_fences_the_admitter(
            self, conn):
        # A worker never double-owns: the claim bumps the generation the admitter holds.
        admitted = await admit(conn, worker_id=OWNER)

        claimed = await claim(conn, worker_id=OTHER, now=at(61))

        assert [(r["run_id"], r["lease_generation"]) for r in claimed] == [(admitted["run_id"], 2)]
        assert await fenced(conn, "start_run", admitted["run_id"], OWNER, 1, now=at(62)) is False

    async def test_interrupt_creates_new_when_old_completed(self, conn):
        first = await own_running(conn)
        assert await fenced(conn, "complete_run", first, OWNER, 1, now=at(1))

        admitted = await admit(conn, strategy="interrupt", now=at(2))

        assert admitted["outcome"] == "admitted"
        assert admitted["displaced"] == []
        assert await active(conn) == [admitted["run_id"]]

    async def test_threads_and_scopes_are_independent(self, conn):
        first = await admit(conn)

        assert (await admit(conn, "thread-2"))["outcome"] == "admitted"
        assert (await admit(conn, tenant_id="acme"))["outcome"] == "admitted"
        assert (await admit(conn, tenant_id="acme", workspace_id="ws"))["outcome"] == "admitted"
        assert (await admit(conn))["active_run_id"] == first["run_id"]


class TestReject:
    async def test_reject_blocks_when_active_run_exists(self, conn):
        first = await admit(conn)
        rows_before = await conn.fetchval("SELECT count(*) FROM zeroth.runs")

        busy = await admit(conn, now=at(1))

        assert busy == {"outcome": "busy", "run_id": None, "status": None,
                        "lease_generation": None, "lease_expires_at": None,
                        "active_run_id": first["run_id"], "retry_after_s": None,
                        "displaced": []}
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == rows_before

    async def test_reject_blocks_reentrant_admission_by_the_same_owner(self, conn):
        first = await own_running(conn)

        busy = await admit(conn, worker_id=OWNER, now=at(5))

        assert (busy["outcome"], busy["active_run_id"]) == ("busy", first)

    async def test_busy_carries_retry_after_from_the_owners_lease_and_grace(self, conn):
        await own_running(conn, lease_seconds=60)

        busy = await admit(conn, now=at(5.5), grace_seconds=10)

        assert busy["retry_after_s"] == 65  # ceil(60 + 10 - 5.5): rounded up, never undershoots

    async def test_retry_after_is_at_least_one_second(self, conn):
        await own_running(conn, lease_seconds=60)

        assert (await admit(conn, now=at(75), grace_seconds=10))["retry_after_s"] == 1

    @pytest.mark.parametrize("state", ["running", "waiting", "claimed"])
    async def test_every_active_state_blocks(self, conn, state):
        lease = await make_run(conn, state, thread_id=THREAD)

        busy = await admit(conn, now=at(1))

        assert (busy["outcome"], busy["active_run_id"]) == ("busy", lease.run_id)

    @pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
    async def test_a_finished_run_does_not_block(self, conn, state):
        await make_run(conn, state, thread_id=THREAD)

        assert (await admit(conn, now=at(1)))["outcome"] == "admitted"

    async def test_unique_index_rejects_a_second_active_run_written_directly(self, conn):
        # The partial unique index is the cross-process backstop under any writer.
        first = await admit(conn)
        with pytest.raises(asyncpg.UniqueViolationError):
            async with conn.transaction():
                await conn.execute(
                    """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, thread_id,
                                                run_after, created_at, updated_at)
                       VALUES (gen_random_uuid(), 'default', $1, $2, $3, $3, $3)""",
                    DEPLOYMENT, THREAD, at(1))
        assert await active(conn) == [first["run_id"]]


class TestEnqueue:
    async def test_enqueue_waits_behind_the_active_run_and_is_never_claimed(self, conn):
        first = await admit(conn)
        await claim(conn)  # the active run is leased; the queued one must not be claimable

        queued = await admit(conn, strategy="enqueue", now=at(1))

        assert (queued["outcome"], queued["status"]) == ("queued", "waiting")
        assert queued["active_run_id"] == first["run_id"]
        row = await run_row(conn, queued["run_id"])
        assert (row["wait_reason"], row["thread_queued_at"]) == ("thread_queue", at(1))
        # Long after, only the active run (its claim lapsed) is claimable again.
        reclaimed = await claim(conn, worker_id=OTHER, batch_size=10, now=at(600))
        assert [r["run_id"] for r in reclaimed] == [first["run_id"]]

    async def test_queue_is_promoted_in_order_as_each_active_run_ends(self, conn):
        first = await own_running(conn)
        second = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]
        third = (await admit(conn, strategy="enqueue", now=at(2)))["run_id"]
        assert await queue(conn) == [second, third]

        assert await fenced(conn, "complete_run", first, OWNER, 1, now=at(3))

        assert await active(conn) == [second]
        assert await queue(conn) == [third]
        promoted = await run_row(conn, second)
        assert (promoted["status"], promoted["wait_reason"], promoted["updated_at"]) == (
            "pending", None, at(3))
        claimed = await claim(conn, worker_id=OTHER, now=at(4))
        assert [r["run_id"] for r in claimed] == [second]
        assert await fenced(conn, "start_run", second, OTHER, 1, now=at(4))
        assert await fenced(conn, "fail_run", second, OTHER, 1, now=at(5),
                            retryable=False) == "failed"
        assert await active(conn) == [third]

    @pytest.mark.parametrize("end", ["complete_run", "fail_run", "cancel_run", "request_cancel",
                                     "paused_then_cancelled"])
    async def test_every_way_the_active_run_ends_promotes_the_queue(self, conn, end):
        first = await own_running(conn)
        queued = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]

        if end == "request_cancel":
            assert await conn.fetchval(REQUEST_CANCEL, first, at(61)) == "cancelled"
        elif end == "paused_then_cancelled":
            assert await fenced(conn, "pause_run", first, OWNER, 1, now=at(2), reason="approval")
            assert await queue(conn) == [queued]  # a paused run still holds the thread
            assert await conn.fetchval(REQUEST_CANCEL, first, at(3)) == "cancelled"
        elif end == "fail_run":
            assert await fenced(conn, end, first, OWNER, 1, now=at(2), retryable=False)
        else:
            assert await fenced(conn, end, first, OWNER, 1, now=at(2))

        assert await active(conn) == [queued]

    async def test_a_retry_keeps_the_thread(self, conn):
        first = await own_running(conn)
        queued = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]

        assert await fenced(conn, "fail_run", first, OWNER, 1, now=at(2)) == "retry_scheduled"

        assert await active(conn) == [first]
        assert await queue(conn) == [queued]

    async def test_cancelling_a_queued_run_keeps_the_rest_of_the_queue(self, conn):
        first = await own_running(conn)
        second = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]
        third = (await admit(conn, strategy="enqueue", now=at(2)))["run_id"]

        assert await conn.fetchval(REQUEST_CANCEL, second, at(3)) == "cancelled"

        row = await run_row(conn, second)
        assert (row["status"], row["thread_queued_at"], row["wait_reason"]) == (
            "cancelled", None, None)
        assert await active(conn) == [first]
        assert await queue(conn) == [third]

    async def test_a_queued_run_cannot_be_resumed(self, conn):
        await own_running(conn)
        queued = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await conn.fetchval(RESUME, queued, at(2))

        assert info.value.sqlstate == "ZP003"
        assert await queue(conn) == [queued]

    async def test_enqueue_run_with_a_busy_thread_id_queues(self, conn):
        first = await admit(conn)

        row = await conn.fetchrow(ENQUEUE, DEPLOYMENT, THREAD, at(1))

        assert (row["created"], row["status"]) == (True, "waiting")
        assert await queue(conn) == [row["run_id"]]
        assert await active(conn) == [first["run_id"]]

    async def test_enqueue_runs_on_one_thread_run_one_after_another(self, conn):
        # One call, one now_override: the queue is still first in, first out.
        rows = await conn.fetch(
            """SELECT run_id, status::text AS status FROM zeroth_test.enqueue_runs(
                   deployment_ref => $1, runs => $2::text::jsonb, now_override => $3)
                ORDER BY ordinality""",
            DEPLOYMENT, json.dumps([{"thread_id": THREAD}] * 8), at(0))

        assert [r["status"] for r in rows] == ["pending"] + ["waiting"] * 7
        assert await queue(conn) == [r["run_id"] for r in rows[1:]]

    async def test_redrive_into_a_busy_thread_queues(self, conn):
        failed = await make_run(conn, "failed", thread_id=THREAD)
        first = await admit(conn, now=at(1))

        assert await conn.fetchval(REDRIVE, failed.run_id, at(2)) is True

        assert await queue(conn) == [failed.run_id]
        assert await active(conn) == [first["run_id"]]

    async def test_redrive_into_an_idle_thread_is_pending(self, conn):
        failed = await make_run(conn, "failed", thread_id=THREAD)

        assert await conn.fetchval(REDRIVE, failed.run_id, at(2)) is True

        assert await active(conn) == [failed.run_id]


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
class TestInterrupt:
    async def test_interrupt_cancels_old_run_and_creates_new(self, conn, strategy):
        old = await admit(conn)

        new = await admit(conn, strategy=strategy, now=at(1))

        assert (new["outcome"], new["status"]) == ("admitted", "pending")
        assert new["displaced"] == [{"run_id": str(old["run_id"]), "outcome": "cancelled",
                                     "worker_id": None, "lease_generation": 0}]
        row = await run_row(conn, old["run_id"])
        assert (row["status"], row["cancel_action"], row["finished_at"]) == (
            "cancelled", strategy, at(1))
        assert await active(conn) == [new["run_id"]]

    async def test_claimed_unstarted_run_is_cancelled_and_its_holder_fenced(self, conn, strategy):
        # The start barrier: a run cancelled before start_run never becomes running.
        old = await admit(conn, worker_id=OTHER)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, now=at(1))

        assert new["outcome"] == "admitted"
        assert new["lease_generation"] == 1
        assert await fenced(conn, "start_run", old["run_id"], OTHER, 1, now=at(2)) is False
        assert await status(conn, old["run_id"]) == "cancelled"

    async def test_paused_run_is_cancelled(self, conn, strategy):
        paused = await make_run(conn, "waiting", thread_id=THREAD)

        new = await admit(conn, strategy=strategy, now=at(1))

        assert new["outcome"] == "admitted"
        assert await status(conn, paused.run_id) == "cancelled"

    async def test_interrupt_rejects_other_worker_valid_lease_by_asking_it_to_stop(
            self, conn, strategy):
        # deer-flow answers 409 here; zeroth_pg sets the durable cancel flag (the owner is told
        # by NOTIFY) and queues the new run right behind the one that is stopping.
        old = await own_running(conn, worker_id=OTHER)
        before = await run_row(conn, old)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, now=at(5))

        assert (new["outcome"], new["status"], new["active_run_id"]) == ("queued", "waiting", old)
        assert new["retry_after_s"] == 65
        assert (new["lease_generation"], new["lease_expires_at"]) == (None, None)
        assert new["displaced"] == [{"run_id": str(old), "outcome": "cancel_requested",
                                     "worker_id": OTHER, "lease_generation": 1}]
        row = await run_row(conn, old)
        assert (row["status"], row["cancel_action"], row["cancel_requested_at"]) == (
            "running", strategy, at(5))
        lease = ("lease_worker_id", "lease_generation", "lease_expires_at")
        assert [row[c] for c in lease] == [before[c] for c in lease]  # never stolen

        # The owner stops and finalises: the new run takes the thread at once.
        assert await fenced(conn, "cancel_run", old, OTHER, 1, now=at(6))
        assert await active(conn) == [new["run_id"]]

    async def test_owner_that_completes_anyway_still_hands_the_thread_on(self, conn, strategy):
        old = await own_running(conn, worker_id=OTHER)
        new = await admit(conn, strategy=strategy, now=at(5))

        assert await fenced(conn, "complete_run", old, OTHER, 1, now=at(6))

        assert await active(conn) == [new["run_id"]]

    async def test_interrupt_allows_self_owned_valid_lease(self, conn, strategy):
        old = await own_running(conn, worker_id=OWNER)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, owner_generation=1, now=at(5))

        assert (new["outcome"], new["lease_generation"]) == ("admitted", 1)
        assert new["displaced"] == [{"run_id": str(old), "outcome": "cancelled",
                                     "worker_id": OWNER, "lease_generation": 1}]
        assert await status(conn, old) == "cancelled"
        # The admitter aborts its local task; that task's late success is refused.
        assert await fenced(conn, "complete_run", old, OWNER, 1, now=at(6)) is False

    async def test_naming_the_owner_without_its_generation_only_asks_it_to_stop(self, conn,
                                                                                  strategy):
        # A worker id is a label anyone can write: without the live generation the caller is
        # just another admitter, and the owner's live run keeps running until it finalises.
        old = await own_running(conn, worker_id=OWNER)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, now=at(5))

        assert (new["outcome"], new["active_run_id"]) == ("queued", old)
        assert new["displaced"][-1]["outcome"] == "cancel_requested"
        assert await status(conn, old) == "running"
        assert await fenced(conn, "complete_run", old, OWNER, 1, now=at(6)) is True

    async def test_a_stale_owner_generation_only_asks_the_owner_to_stop(self, conn, strategy):
        old = await own_running(conn, worker_id=OWNER)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, owner_generation=2, now=at(5))

        assert new["outcome"] == "queued"
        assert await status(conn, old) == "running"

    async def test_interrupt_claims_expired_predecessor_past_grace(self, conn, strategy):
        old = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        new = await admit(conn, strategy=strategy, worker_id=OWNER, now=at(41), grace_seconds=10)

        assert new["outcome"] == "admitted"
        assert new["displaced"][0]["outcome"] == "taken_over"
        row = await run_row(conn, old)
        assert row["status"] == "cancelled"
        assert json.loads(row["error"])["stop_reason"] == "taken_over"
        assert await fenced(conn, "complete_run", old, OTHER, 1, now=at(42)) is False

    async def test_expired_predecessor_within_grace_is_still_asked(self, conn, strategy):
        old = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        new = await admit(conn, strategy=strategy, now=at(33), grace_seconds=10)

        assert (new["outcome"], new["active_run_id"], new["retry_after_s"]) == ("queued", old, 7)

    async def test_interrupt_supersedes_the_queue(self, conn, strategy):
        old = await own_running(conn, worker_id=OTHER)
        queued = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]

        new = await admit(conn, strategy=strategy, now=at(2))

        assert [d["run_id"] for d in new["displaced"]] == [str(queued), str(old)]
        assert [d["outcome"] for d in new["displaced"]] == ["cancelled", "cancel_requested"]
        row = await run_row(conn, queued)
        assert (row["status"], row["cancel_action"]) == ("cancelled", strategy)
        assert await queue(conn) == [new["run_id"]]

    async def test_first_cancel_action_wins(self, conn, strategy):
        old = await own_running(conn, worker_id=OTHER)
        await admit(conn, strategy="rollback" if strategy == "interrupt" else "interrupt",
                    now=at(1))

        await admit(conn, strategy=strategy, now=at(2))

        row = await run_row(conn, old)
        assert row["cancel_action"] != strategy
        assert row["cancel_requested_at"] == at(1)

    async def test_live_other_owner_is_notified_on_zeroth_control(self, connect, strategy):
        actor, listener = await connect(), await connect()
        old = await own_running(actor, worker_id=OTHER)
        notes: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_control", lambda *args: notes.put_nowait(args[3]))

        await admit(actor, strategy=strategy, now=at(1))

        payload = await asyncio.wait_for(notes.get(), timeout=10)
        # The owner's opaque key only: it learns which run (and that it is a cancel) from its
        # own renewal, and a listener learns nothing.
        assert payload == await control_key(actor, OTHER)
        assert str(old) not in payload
        assert OTHER not in payload


class TestIdempotency:
    async def test_run_admission_reuses_idempotency_key(self, conn):
        first = await admit(conn, worker_id=OWNER, idempotency_key="k-1")

        again = await admit(conn, worker_id=OTHER, idempotency_key="k-1", now=at(1))

        assert (again["outcome"], again["run_id"], again["status"]) == (
            "reused", first["run_id"], "pending")
        assert (again["lease_generation"], again["lease_expires_at"]) == (None, None)
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.idempotency_key = 'k-1'") == 1

    async def test_reuse_reports_the_lease_to_its_holder(self, conn):
        first = await admit(conn, worker_id=OWNER, idempotency_key="k-1")

        again = await admit(conn, "thread-1", "interrupt", worker_id=OWNER,
                            idempotency_key="k-1", now=at(1))

        assert (again["outcome"], again["lease_generation"]) == ("reused", 1)
        assert await status(conn, first["run_id"]) == "pending"  # a retry interrupts nothing

    async def test_reuse_of_a_caller_run_id(self, conn):
        run_id = uuid.uuid4()
        await admit(conn, run_id=run_id)

        again = await admit(conn, strategy="enqueue", run_id=run_id, now=at(1))

        assert (again["outcome"], again["run_id"]) == ("reused", run_id)
        assert await queue(conn) == []

    async def test_key_of_a_run_of_another_thread_is_refused(self, conn):
        await admit(conn, idempotency_key="k-1")
        rows_before = await conn.fetchval("SELECT count(*) FROM zeroth.runs")

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await admit(conn, "thread-2", idempotency_key="k-1")

        assert info.value.sqlstate == "ZP008"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == rows_before


async def limit_scope(conn: asyncpg.Connection, *, paused: bool = False,
                      max_concurrency: int | None = None, rate: tuple[int, float] | None = None
                      ) -> None:
    """The DBA's zeroth.scope_limits row for the default scope (and its rate key)."""
    if rate is not None:
        await conn.execute("SELECT zeroth.set_rate_limit(name => 'admit-rate', max_starts => $1, "
                           "period_seconds => $2)", *rate)
    await conn.execute(
        """INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, paused, max_concurrency,
                                            rate_limit)
           VALUES ('default', $1, $2, $3, $4)
           ON CONFLICT (tenant_id, workspace_key, deployment_ref) DO UPDATE
              SET paused = EXCLUDED.paused, max_concurrency = EXCLUDED.max_concurrency,
                  rate_limit = EXCLUDED.rate_limit""",
        DEPLOYMENT, paused, max_concurrency, None if rate is None else "admit-rate")


def unleased(admitted: dict[str, object]) -> bool:
    return (admitted["outcome"], admitted["status"], admitted["lease_generation"],
            admitted["lease_expires_at"]) == ("admitted", "pending", None, None)


class TestAdmitAndOwnObeysTheScopeLimits:
    """Every lease obeys the DBA's zeroth.scope_limits row as a claim does; an admit-and-own
    admission the scope has no room for is admitted unleased (pending queue work)."""

    async def test_a_paused_scope_admits_the_run_unleased(self, conn):
        await limit_scope(conn, paused=True)

        admitted = await admit(conn, worker_id=OWNER)

        assert unleased(admitted)
        row = await run_row(conn, admitted["run_id"])
        assert (row["lease_worker_id"], row["lease_generation"]) == (None, 0)
        assert await fenced(conn, "start_run", admitted["run_id"], OWNER, 1, now=at(1)) is False
        assert await claim(conn, worker_id=OTHER, now=at(2)) == []
        await limit_scope(conn, paused=False)
        assert [r["run_id"] for r in await claim(conn, worker_id=OTHER, now=at(3))] == [
            admitted["run_id"]]

    async def test_a_full_scope_admits_the_run_unleased(self, conn):
        await limit_scope(conn, max_concurrency=1)
        running = await make_run(conn, "running", worker_id=OTHER)

        admitted = await admit(conn, worker_id=OWNER, now=at(1))

        assert unleased(admitted)
        assert admitted["retry_after_s"] is None
        assert await fenced(conn, "complete_run", running.run_id, OTHER, running.generation,
                            now=at(2), output={})
        assert [r["run_id"] for r in await claim(conn, worker_id=OTHER, now=at(3))] == [
            admitted["run_id"]]

    async def test_an_owned_lease_takes_a_slot_that_claims_then_see_taken(self, conn):
        await limit_scope(conn, max_concurrency=1)
        owned = await admit(conn, worker_id=OWNER)
        assert (owned["outcome"], owned["lease_generation"]) == ("admitted", 1)
        assert (await run_row(conn, owned["run_id"]))["admission_slot"] == 1
        waiting = await make_run(conn, "pending", now=at(1))

        (marker,) = await conn.fetch(
            """SELECT * FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
                   now_override => $3)""", DEPLOYMENT, OTHER, at(2))
        assert (marker["run_id"], marker["concurrency_saturated"], marker["active_count"]) == (
            None, True, 1)

        # Ending the owned run frees its slot, as any lease's end does.
        assert await fenced(conn, "start_run", owned["run_id"], OWNER, 1, now=at(3))
        assert await fenced(conn, "complete_run", owned["run_id"], OWNER, 1, now=at(4), output={})
        assert [r["run_id"] for r in await claim(conn, worker_id=OTHER, now=at(5))] == [
            waiting.run_id]

    @pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
    async def test_interrupting_its_own_run_hands_its_slot_to_the_new_one(self, conn, strategy):
        await limit_scope(conn, max_concurrency=1)
        first = await own_running(conn)

        admitted = await admit(conn, strategy=strategy, worker_id=OWNER, owner_generation=1,
                               now=at(1))

        assert (admitted["outcome"], admitted["lease_generation"]) == ("admitted", 1)
        assert await status(conn, first) == "cancelled"
        assert (await run_row(conn, admitted["run_id"]))["admission_slot"] == 1

    async def test_a_rate_limited_scope_leases_only_what_the_window_allows(self, conn):
        await limit_scope(conn, rate=(2, 60))

        admitted = [await admit(conn, f"thread-{i}", worker_id=OWNER, now=at(i * 0.001))
                    for i in range(10)]

        assert [a["lease_generation"] for a in admitted] == [1, 1] + [None] * 8
        assert all(unleased(a) for a in admitted[2:])
        # retry_after_s: when the window has a start again (the first start leaves at 60 s).
        assert {a["retry_after_s"] for a in admitted[2:]} == {60}
        assert await conn.fetchval(
            "SELECT sum(starts) FROM zeroth.rate_limit_starts WHERE name = 'admit-rate'") == 2
        # The owned starts count against the claims of the scope too.
        (marker,) = await conn.fetch(
            """SELECT * FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
                   now_override => $3)""", DEPLOYMENT, OTHER, at(1))
        assert marker["run_id"] is None
        assert marker["retry_at"] is not None

    async def test_an_unleased_admission_keeps_its_run_for_a_retry_with_the_same_key(self, conn):
        await limit_scope(conn, paused=True)
        first = await admit(conn, worker_id=OWNER, idempotency_key="k")
        await limit_scope(conn, paused=False)

        again = await admit(conn, worker_id=OWNER, idempotency_key="k", now=at(1))

        assert (again["outcome"], again["run_id"], again["lease_generation"]) == (
            "reused", first["run_id"], None)


class TestAdmitAndOwnIsNotAClaim:
    async def test_an_owned_lease_takes_no_slot_and_does_not_fill_max_concurrency(self, conn):
        """A documented decision (docs/threads.md): without a
        zeroth.scope_limits max_concurrency (the DBA's limit, which it obeys: see above) an
        admit-and-own lease takes no admission slot and counts against no claimer's own K."""
        owned = await admit(conn, worker_id=OWNER)
        assert (owned["outcome"], owned["lease_generation"]) == ("admitted", 1)
        assert (await run_row(conn, owned["run_id"]))["admission_slot"] is None
        assert await conn.fetchval("SELECT count(*) FROM zeroth.admission_slots") == 0

        waiting = await make_run(conn, "pending", now=at(1))
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(2))
        assert [(r["run_id"], r["active_count"]) for r in rows] == [(waiting.run_id, 0)]


class TestBadArguments:
    @pytest.mark.parametrize(("kwargs", "code"), [
        ({"strategy": "steal"}, "ZP008"),
        ({"strategy": None}, "ZP008"),
        ({"thread": ""}, "ZP008"),
        ({"thread": None}, "ZP008"),
        ({"thread": "t" * 201}, "ZP008"),
        ({"worker_id": ""}, "ZP008"),
        ({"lease_seconds": 0}, "ZP008"),
        ({"grace_seconds": -1}, "ZP008"),
        ({"payload": [1]}, "ZP008"),
        ({"max_attempts": 0}, "ZP008"),
        ({"idempotency_key": ""}, "ZP008"),
        ({"workspace_id": "ws"}, "ZP006"),
        # the prefix of fire_due_schedules' keys
        ({"idempotency_key": "zeroth-schedule:x:2030-01-01T00:00:00.000000Z"}, "ZP011"),
        # over the idempotency index's row limit (ZP008, not 54000)
        ({"deployment_ref": "\U0001F602" * 200, "tenant_id": "\U0001F600" * 200,
          "workspace_id": "\U0001F601" * 200, "idempotency_key": "\U0001F603" * 500}, "ZP008"),
    ], ids=lambda value: json.dumps(value)[:60] if isinstance(value, dict) else value)
    async def test_bad_argument_raises_and_changes_nothing(self, conn, kwargs, code):
        await admit(conn)  # an active run an interrupt would otherwise cancel
        rows_before = await conn.fetch("SELECT r.* FROM zeroth.runs r ORDER BY r.run_id")
        kwargs = {"strategy": "interrupt", **kwargs}

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await admit(conn, kwargs.pop("thread", THREAD), now=at(1), **kwargs)

        assert info.value.sqlstate == code
        assert await conn.fetch("SELECT r.* FROM zeroth.runs r ORDER BY r.run_id") == rows_before

