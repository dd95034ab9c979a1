"""zeroth.request_cancel_v2: five outcomes, a grace, retry_after_s.

cancelled | cancel_requested | taken_over | not_cancellable | unknown. Ports deer-flow's cancel
cases (seed spec §17, "Cancel") that apply. The 0002 request_cancel shares the decision with a
grace of 0 (tests/sql/test_request_cancel.py keeps its contract).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import asyncpg
import pytest
from helpers import at, make_run, run_row
from thread_calls import OTHER, OWNER, THREAD, active, admit, cancel_v2, fenced, own_running

REQUEST_CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"
RENEW_MANY = """SELECT renewed, cancel_requested FROM zeroth_test.renew_leases(worker_id => $1,
                    run_ids => $2, generations => $3, now_override => $4)"""


class TestImmediate:
    @pytest.mark.parametrize("state", ["pending", "claimed", "waiting"])
    async def test_not_yet_running_run_is_cancelled_at_once(self, conn, state):
        lease = await make_run(conn, state)

        result = await cancel_v2(conn, lease.run_id, "interrupt", now=at(5))

        assert result == {"outcome": "cancelled", "run_id": lease.run_id, "status": "cancelled",
                          "cancel_action": "interrupt",
                          "lease_worker_id": None if state != "claimed" else lease.worker_id,
                          "lease_generation": lease.generation, "retry_after_s": None}
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["lease_worker_id"], row["finished_at"]) == (
            "cancelled", None, at(5))

    async def test_cancel_local_run_succeeds_for_a_queued_thread_run(self, conn):
        await admit(conn)
        queued = await admit(conn, strategy="enqueue", now=at(1))

        assert (await cancel_v2(conn, queued["run_id"], now=at(2)))["outcome"] == "cancelled"


class TestLiveOwner:
    async def test_cancel_requests_active_lease_from_other_worker(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=45)

        result = await cancel_v2(conn, run_id, "rollback", now=at(5), grace=10)

        assert result == {"outcome": "cancel_requested", "run_id": run_id, "status": "running",
                          "cancel_action": "rollback", "lease_worker_id": OTHER,
                          "lease_generation": 1, "retry_after_s": 50}
        row = await run_row(conn, run_id)
        assert (row["status"], row["cancel_action"], row["cancel_requested_at"]) == (
            "running", "rollback", at(5))

    async def test_request_cancel_is_returned_by_owner_lease_renewal(self, conn):
        run_id = await own_running(conn, worker_id=OTHER)
        await cancel_v2(conn, run_id, now=at(5))

        renewal = await conn.fetchrow(RENEW_MANY, OTHER, [run_id], [1], at(6))

        assert tuple(renewal) == (True, True)

    async def test_cancel_idempotent_and_first_action_wins(self, conn):
        run_id = await own_running(conn, worker_id=OTHER)

        first = await cancel_v2(conn, run_id, "rollback", now=at(5))
        again = await cancel_v2(conn, run_id, "interrupt", now=at(6))

        assert (first["outcome"], again["outcome"]) == ("cancel_requested", "cancel_requested")
        assert again["cancel_action"] == "rollback"
        assert (await run_row(conn, run_id))["cancel_requested_at"] == at(5)

    async def test_retry_after_is_clamped_for_a_far_off_clock(self, conn):
        run_id = await own_running(conn, worker_id=OTHER)

        # Year 2, not year 1: asyncpg sends datetime.min as -infinity, which now_override refuses.
        result = await cancel_v2(conn, run_id, now=datetime(2, 1, 1, tzinfo=UTC))

        assert (result["outcome"], result["retry_after_s"]) == ("cancel_requested", 2**31 - 1)

    async def test_cancel_takeover_respects_grace_seconds(self, conn):
        # 3 s past expiry with a 10 s grace is not a takeover: still a request, 7 s to wait.
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        result = await cancel_v2(conn, run_id, now=at(33), grace=10)

        assert (result["outcome"], result["retry_after_s"]) == ("cancel_requested", 7)
        assert (await run_row(conn, run_id))["status"] == "running"


class TestTakeover:
    async def test_cancel_takeover_from_crashed_worker(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        result = await cancel_v2(conn, run_id, "interrupt", now=at(41), grace=10)

        assert result == {"outcome": "taken_over", "run_id": run_id, "status": "cancelled",
                          "cancel_action": "interrupt", "lease_worker_id": OTHER,
                          "lease_generation": 1, "retry_after_s": None}
        row = await run_row(conn, run_id)
        assert (row["status"], row["lease_worker_id"], row["finished_at"]) == (
            "cancelled", None, at(41))
        error = json.loads(row["error"])
        assert (error["stop_reason"], error["worker_id"], error["lease_generation"]) == (
            "taken_over", OTHER, 1)

    async def test_killed_owners_late_writes_are_refused_after_a_takeover(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        await cancel_v2(conn, run_id, now=at(41))
        taken = await run_row(conn, run_id)

        assert await fenced(conn, "complete_run", run_id, OTHER, 1, now=at(42)) is False
        assert await fenced(conn, "cancel_run", run_id, OTHER, 1, now=at(42)) is False
        assert await fenced(conn, "update_run_progress", run_id, OTHER, 1, now=at(42),
                            progress={"late": True}) is False
        assert dict(await run_row(conn, run_id)) == dict(taken)

    async def test_takeover_keeps_an_earlier_error_and_the_first_action(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        assert await fenced(conn, "commit_fenced", run_id, OTHER, 1, now=at(1),
                            columns=json.dumps({"error": {"partial": 1}}))
        await cancel_v2(conn, run_id, "rollback", now=at(2))

        await cancel_v2(conn, run_id, "cancel", now=at(41))

        row = await run_row(conn, run_id)
        assert row["cancel_action"] == "rollback"
        assert json.loads(row["error"])["previous_error"] == {"partial": 1}

    async def test_takeover_frees_the_thread(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        queued = await admit(conn, strategy="enqueue", now=at(1))

        await cancel_v2(conn, run_id, now=at(41))

        assert await active(conn) == [queued["run_id"]]

    async def test_old_request_cancel_reports_a_takeover_as_cancelled(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)

        assert await conn.fetchval(REQUEST_CANCEL, run_id, at(31)) == "cancelled"

        assert json.loads((await run_row(conn, run_id))["error"])["stop_reason"] == "taken_over"


class TestNotCancellableOrUnknown:
    @pytest.mark.parametrize("state", ["completed", "failed", "cancelled"])
    async def test_terminal_run_is_not_cancellable(self, conn, state):
        lease = await make_run(conn, state)
        before = await run_row(conn, lease.run_id)

        result = await cancel_v2(conn, lease.run_id, now=at(5))

        assert (result["outcome"], result["status"]) == ("not_cancellable", state)
        assert dict(await run_row(conn, lease.run_id)) == dict(before)

    async def test_owner_completion_wins_before_cancel_request(self, conn):
        run_id = await own_running(conn, worker_id=OTHER)
        assert await fenced(conn, "complete_run", run_id, OTHER, 1, now=at(1))

        assert (await cancel_v2(conn, run_id, now=at(2)))["outcome"] == "not_cancellable"

    async def test_cancel_request_wins_before_a_late_owner_completion_once_taken_over(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        assert (await cancel_v2(conn, run_id, now=at(41)))["outcome"] == "taken_over"

        assert await fenced(conn, "complete_run", run_id, OTHER, 1, now=at(42)) is False

        assert (await cancel_v2(conn, run_id, now=at(43)))["outcome"] == "not_cancellable"

    async def test_unknown_run_and_other_scope_are_unknown(self, conn):
        lease = await make_run(conn, "pending", tenant_id="acme")

        assert (await cancel_v2(conn, uuid.uuid4()))["outcome"] == "unknown"
        assert (await cancel_v2(conn, lease.run_id))["outcome"] == "unknown"
        assert (await cancel_v2(conn, lease.run_id, tenant_id="acme"))["outcome"] == "cancelled"


class TestBadArguments:
    @pytest.mark.parametrize(("drop_run_id", "action", "grace"), [
        (True, "cancel", 10), (False, "stop", 10), (False, None, 10), (False, "cancel", -1),
        (False, "cancel", 86401), (False, "cancel", None)])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, drop_run_id, action,
                                                                 grace):
        run_id = await own_running(conn, THREAD, worker_id=OWNER)
        before = await run_row(conn, run_id)

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await cancel_v2(conn, None if drop_run_id else run_id, action, grace=grace)

        assert info.value.sqlstate == "ZP008"
        assert dict(await run_row(conn, run_id)) == dict(before)
