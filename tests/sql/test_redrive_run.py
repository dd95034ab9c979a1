"""zeroth.redrive_run: failed (dead-lettered or not) or cancelled → pending.

Resets attempts, error, output, finished, cancel and dead-letter marks, but never the lease
generation, so fencing stays monotonic across replays.
"""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest
from helpers import WORKER, at, claim, make_run, run_row

REDRIVE = """SELECT zeroth_test.redrive_run(run_id => $1, tenant_id => $2, workspace_id => $3,
                 now_override => $4)"""
START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
FAIL = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
              error => '{"reason": "boom"}', retryable => true, now_override => $4)"""
COMMIT = """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                columns => '{"output": {"partial": true}}', now_override => $4)"""
REQUEST_CANCEL = """SELECT zeroth_test.request_cancel(run_id => $1, action => $2,
                        now_override => $3)"""
OTHER = "worker-b"
NOW = at(100)


async def redrive(conn, run_id, *, tenant_id=None, workspace_id=None, now=NOW):
    return await conn.fetchval(REDRIVE, run_id, tenant_id, workspace_id, now)


async def assert_raises(conn, sqlstate, *args, **kwargs):
    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await redrive(conn, *args, **kwargs)
    assert info.value.sqlstate == sqlstate


async def attempt_and_fail(conn, run_id, when):
    """Claim, start and fail (retryable) the run at ``when``; returns the fail_run outcome."""
    rows = await claim(conn, worker_id=OTHER, now=when)
    assert [r["run_id"] for r in rows] == [run_id]
    generation = rows[0]["lease_generation"]
    assert await conn.fetchval(START, run_id, OTHER, generation, when) is True
    return await conn.fetchval(FAIL, run_id, OTHER, generation, when)


async def dead_lettered_run(conn):
    """A run with max_attempts 1 whose only attempt failed retryably: dead-lettered."""
    lease = await make_run(conn, "running", max_attempts=1)
    assert await conn.fetchval(COMMIT, lease.run_id, WORKER, 1, at(1)) is True
    assert await conn.fetchval(FAIL, lease.run_id, WORKER, 1, at(2)) == "dead_lettered"
    return lease.run_id


class TestRedriveDeadLetteredRun:
    async def test_redrive_resets_the_run_to_a_fresh_pending_run(self, conn):
        run_id = await dead_lettered_run(conn)
        before = await run_row(conn, run_id)
        assert (before["status"], before["dead_lettered_at"], before["attempts"]) == (
            "failed", at(2), 1)

        assert await redrive(conn, run_id) is True

        row = await run_row(conn, run_id)
        assert row["status"] == "pending"
        assert row["attempts"] == 0
        assert row["error"] is None
        assert row["output"] is None
        assert row["dead_lettered_at"] is None
        assert row["finished_at"] is None
        assert row["cancel_action"] is None
        assert row["cancel_requested_at"] is None
        assert row["run_after"] == NOW
        assert row["updated_at"] == NOW
        assert row["lease_worker_id"] is None

    async def test_redrive_keeps_the_lease_generation(self, conn):
        run_id = await dead_lettered_run(conn)

        await redrive(conn, run_id)

        assert (await run_row(conn, run_id))["lease_generation"] == 1

    async def test_next_claim_continues_the_generation_above_the_old_value(self, conn):
        run_id = await dead_lettered_run(conn)
        await redrive(conn, run_id)

        rows = await claim(conn, worker_id=OTHER, now=NOW)

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(run_id, 2)]
        # The first owner's generation 1 stays fenced out after the replay.
        assert await conn.fetchval(START, run_id, WORKER, 1, NOW) is False

    async def test_redrive_keeps_identity_payload_and_checkpoint_count(self, conn):
        run_id = await dead_lettered_run(conn)
        before = await run_row(conn, run_id)

        await redrive(conn, run_id)

        row = await run_row(conn, run_id)
        kept = ("run_id", "tenant_id", "workspace_id", "deployment_ref", "payload", "metadata",
                "priority", "max_attempts", "created_at", "checkpoint_seq", "idempotency_key")
        assert [row[c] for c in kept] == [before[c] for c in kept]

    async def test_redriven_run_reaches_the_dead_letter_again_after_max_attempts(self, conn):
        lease = await make_run(conn, "pending", max_attempts=2)
        outcomes = [await attempt_and_fail(conn, lease.run_id, at(10)),
                    await attempt_and_fail(conn, lease.run_id, at(20))]
        assert outcomes == ["retry_scheduled", "dead_lettered"]

        await redrive(conn, lease.run_id, now=at(30))

        outcomes = [await attempt_and_fail(conn, lease.run_id, at(40)),
                    await attempt_and_fail(conn, lease.run_id, at(50))]
        assert outcomes == ["retry_scheduled", "dead_lettered"]
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["attempts"], row["dead_lettered_at"]) == ("failed", 2, at(50))
        assert row["lease_generation"] == 4


class TestRedriveOtherEndedRuns:
    async def test_non_retryable_failure_is_redriven(self, conn):
        lease = await make_run(conn, "failed")

        assert await redrive(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["error"], row["attempts"]) == ("pending", None, 0)

    async def test_cancelled_run_is_redriven_and_its_cancel_marks_cleared(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id, "interrupt", at(61)) == (
            "cancelled")

        assert await redrive(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert (row["cancel_action"], row["cancel_requested_at"], row["finished_at"]) == (
            None, None, None)
        rows = await claim(conn, worker_id=OTHER, now=NOW)
        assert rows[0]["cancel_requested"] is False
        assert rows[0]["lease_generation"] == 2


class TestRedriveRefusals:
    @pytest.mark.parametrize("status", ["pending", "claimed", "running", "waiting", "completed"])
    async def test_redrive_of_a_run_that_has_not_failed_or_been_cancelled_raises_zp003(
            self, conn, status):
        lease = await make_run(conn, status)
        before = await run_row(conn, lease.run_id)

        await assert_raises(conn, "ZP003", lease.run_id)

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_redrive_of_an_unknown_run_raises_zp001(self, conn):
        await assert_raises(conn, "ZP001", uuid.uuid4())

    async def test_redrive_in_another_scope_raises_zp001_and_changes_nothing(self, conn):
        lease = await make_run(conn, "failed", tenant_id="acme", workspace_id="ws-1")
        before = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")

        await assert_raises(conn, "ZP001", lease.run_id)
        await assert_raises(conn, "ZP001", lease.run_id, tenant_id="acme")
        await assert_raises(conn, "ZP001", lease.run_id, tenant_id="other", workspace_id="ws-1")

        after = await run_row(conn, lease.run_id, tenant_id="acme", workspace_id="ws-1")
        assert dict(after) == dict(before)
        assert json.loads(after["error"]) == {"reason": "boom"}

    async def test_redrive_without_a_run_id_raises_zp008(self, conn):
        await assert_raises(conn, "ZP008", None)
