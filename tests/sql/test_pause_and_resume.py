"""zeroth.pause_run (running → waiting, fenced) and zeroth.resume_run (waiting → pending, admin).

A waiting run holds no lease and no slot and is claimed by nobody; resume makes it pending again,
storing the caller's input as metadata.resume_input.
"""

from __future__ import annotations

import json
import uuid

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

PAUSE = """SELECT zeroth_test.pause_run(run_id => $1, worker_id => $2, generation => $3,
               reason => $4, tenant_id => $5, workspace_id => $6, now_override => $7)"""
RESUME = """SELECT zeroth_test.resume_run(run_id => $1, tenant_id => $2, workspace_id => $3,
                input => $4::text::jsonb, now_override => $5)"""
CLAIM_ORPHANED = """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1,
                        worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"done": true}', now_override => $4)"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
NOW = at(10)
RESUMED_AT = at(100)


async def pause(conn, run_id, worker_id=WORKER, generation=1, reason="approval", *,
                tenant_id=None, workspace_id=None, now=NOW):
    return await conn.fetchval(PAUSE, run_id, worker_id, generation, reason, tenant_id,
                               workspace_id, now)


async def resume(conn, run_id, input_=None, *, tenant_id=None, workspace_id=None,
                 now=RESUMED_AT):
    text = None if input_ is None else json.dumps(input_)
    return await conn.fetchval(RESUME, run_id, tenant_id, workspace_id, text, now)


async def assert_raises(conn, sqlstate, call, *args, **kwargs):
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await call(conn, *args, **kwargs)
    assert info.value.sqlstate == sqlstate




class TestPauseRunningRun:
    async def test_pause_makes_the_run_waiting_with_its_reason_and_no_lease(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await pause(conn, lease.run_id, reason="interrupt:tool-approval") is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "waiting"
        assert row["wait_reason"] == "interrupt:tool-approval"
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["recovery_checkpoint_id"] is None
        assert row["lease_generation"] == 1
        # Waiting is not a failure: the attempt is given back (approval loops do not use up the
        # retry budget, nor push attempts past max_attempts).
        assert (before["attempts"], row["attempts"]) == (1, 0)
        assert row["finished_at"] is None
        assert row["updated_at"] == NOW

    async def test_approval_loops_never_push_attempts_past_max_attempts(self, conn):
        """With max_attempts 1, three rounds of claim, pause and resume leave attempts within
        max_attempts (not at 4)."""
        run_id = (await make_run(conn, "pending", max_attempts=1)).run_id
        for n in range(1, 4):
            (row,) = await claim(conn, now=at(1000 * n))
            assert await conn.fetchval(START, run_id, WORKER, row["lease_generation"],
                                       at(1000 * n + 1)) is True
            assert (await run_row(conn, run_id))["attempts"] == 1
            assert await pause(conn, run_id, generation=row["lease_generation"],
                               now=at(1000 * n + 2)) is True
            assert await resume(conn, run_id, now=at(1000 * n + 3)) is True
            assert (await run_row(conn, run_id))["attempts"] == 0

    async def test_waiting_run_is_never_claimed(self, conn):
        lease = await make_run(conn, "running")
        await pause(conn, lease.run_id)

        assert await claim(conn, worker_id=OTHER, now=at(10_000)) == []
        assert await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, OTHER, at(10_000)) == []
        assert (await run_row(conn, lease.run_id))["status"] == "waiting"

    async def test_pause_frees_the_slot_for_another_run(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        other_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await pause(conn, lease.run_id)

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert [r["run_id"] for r in rows] == [other_run]


class TestPauseRejectsBadArguments:
    @pytest.mark.parametrize(
        "reason", ["", None, "r" * 201], ids=["reason_empty", "reason_null", "reason_too_long"])
    async def test_bad_reason_raises_zp008_and_changes_nothing(self, conn, reason):
        # The fence arguments: tests/sql/test_fenced_conformance.py.
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        await assert_raises(conn, "ZP008", pause, lease.run_id, WORKER, 1, reason)

        assert dict(await run_row(conn, lease.run_id)) == dict(before)


class TestResumeWaitingRun:
    async def test_resume_makes_the_run_pending_and_claimable_now(self, conn):
        lease = await make_run(conn, "waiting")

        assert await resume(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["wait_reason"]) == ("pending", None)
        assert row["run_after"] == RESUMED_AT
        assert row["updated_at"] == RESUMED_AT
        assert row["lease_worker_id"] is None
        rows = await claim(conn, worker_id=OTHER, now=RESUMED_AT)
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

    async def test_resume_stores_the_input_beside_existing_metadata(self, conn):
        lease = await make_run(conn, "waiting", metadata={"origin": "api"})

        await resume(conn, lease.run_id, {"approved": True, "by": "alice"})

        metadata = json.loads((await run_row(conn, lease.run_id))["metadata"])
        assert metadata == {"origin": "api", "resume_input": {"approved": True, "by": "alice"}}

    async def test_resume_without_input_leaves_metadata_alone(self, conn):
        lease = await make_run(conn, "waiting", metadata={"origin": "api"})

        await resume(conn, lease.run_id)

        assert json.loads((await run_row(conn, lease.run_id))["metadata"]) == {"origin": "api"}

    async def test_a_second_resume_input_replaces_the_first(self, conn):
        lease = await make_run(conn, "waiting")
        await resume(conn, lease.run_id, {"answer": 1})
        rows = await claim(conn, now=RESUMED_AT)
        assert await conn.fetchval(START, lease.run_id, WORKER, rows[0]["lease_generation"],
                                   RESUMED_AT)
        assert await pause(conn, lease.run_id, WORKER, rows[0]["lease_generation"],
                           now=RESUMED_AT)

        await resume(conn, lease.run_id, {"answer": 2}, now=at(200))

        metadata = json.loads((await run_row(conn, lease.run_id))["metadata"])
        assert metadata == {"resume_input": {"answer": 2}}

    async def test_paused_and_resumed_run_is_driven_to_completion_by_the_next_owner(self, conn):
        lease = await make_run(conn, "running")
        await pause(conn, lease.run_id)
        await resume(conn, lease.run_id, {"approved": True})

        rows = await claim(conn, worker_id=OTHER, now=RESUMED_AT)
        generation = rows[0]["lease_generation"]
        assert json.loads(rows[0]["metadata"])["resume_input"] == {"approved": True}
        assert await conn.fetchval(START, lease.run_id, OTHER, generation, RESUMED_AT) is True
        assert await conn.fetchval(COMPLETE, lease.run_id, OTHER, generation, at(101)) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["lease_generation"]) == ("completed", 2)
        # The old holder of generation 1 can never end the run again.
        assert await pause(conn, lease.run_id, now=at(102)) is False


class TestResumeRefusals:
    async def test_resume_of_an_unknown_run_raises_zp001(self, conn):
        await assert_raises(conn, "ZP001", resume, uuid.uuid4())

    async def test_resume_in_another_scope_raises_zp001_and_changes_nothing(self, conn):
        lease = await make_run(conn, "waiting", tenant_id="acme")
        before = await run_row(conn, lease.run_id, tenant_id="acme")

        await assert_raises(conn, "ZP001", resume, lease.run_id)
        await assert_raises(conn, "ZP001", resume, lease.run_id, tenant_id="acme",
                            workspace_id="ws")

        assert dict(await run_row(conn, lease.run_id, tenant_id="acme")) == dict(before)

    @pytest.mark.parametrize(
        "status", ["pending", "claimed", "running", "completed", "failed", "cancelled"])
    async def test_resume_of_a_run_that_is_not_waiting_raises_zp003(self, conn, status):
        lease = await make_run(conn, status)
        before = await run_row(conn, lease.run_id)

        await assert_raises(conn, "ZP003", resume, lease.run_id, {"approved": True})

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_resume_without_a_run_id_raises_zp008(self, conn):
        await assert_raises(conn, "ZP008", resume, None)


class TestPauseAndResumeNotify:
    async def test_resume_notifies_the_runs_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "waiting", workspace_id="ws-1", tenant_id="acme")
        queue = await listen(listener, "zeroth_wakeup", ((DEPLOYMENT, "acme", "ws-1"),))

        assert await resume(actor, lease.run_id, tenant_id="acme", workspace_id="ws-1") is True

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "acme", "ws-1")

    async def test_pause_that_frees_a_slot_notifies_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "running", max_concurrency=1)
        queue = await listen(listener, "zeroth_wakeup")

        assert await pause(actor, lease.run_id) is True

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "default", None)
