"""zeroth.reconcile_thread_runs: the periodic takeover of thread runs whose owners died.

Ports deer-flow's reconciliation cases (seed spec §17, "Takeover and reconciliation"); the
candidate scan and the takeover are one call here, and each candidate is re-checked under SKIP
LOCKED, so a renewal after the scan wins and concurrent reconcilers never report a run twice.
"""

from __future__ import annotations

import asyncpg
import pytest
from helpers import at, make_run, run_row
from thread_calls import OTHER, admit, fenced, own_running, reconcile


class TestReconcile:
    async def test_reconciliation_claims_expired_lease_runs_and_skips_live_ones(self, conn):
        dead = await own_running(conn, "t-dead", worker_id=OTHER, lease_seconds=30)
        live = await own_running(conn, "t-live", worker_id=OTHER, lease_seconds=300)
        within_grace = await own_running(conn, "t-grace", worker_id=OTHER, lease_seconds=35)
        finished = await own_running(conn, "t-done", worker_id=OTHER, lease_seconds=30)
        assert await fenced(conn, "complete_run", finished, OTHER, 1, now=at(1))

        rows = await reconcile(conn, now=at(41), grace=10)

        assert [(r["run_id"], r["outcome"]) for r in rows] == [(dead, "failed")]
        assert [(await run_row(conn, r))["status"] for r in (live, within_grace, finished)] == [
            "running", "running", "completed"]

    async def test_resumable_runs_are_requeued_and_not_resumable_ones_fail(self, conn):
        fails = await own_running(conn, "t-1", worker_id=OTHER, lease_seconds=30)
        requeues = await make_run(conn, "running", thread_id="t-2", lease_seconds=20)

        rows = await reconcile(conn, now=at(41))

        assert {r["run_id"]: r["outcome"] for r in rows} == {
            fails: "failed", requeues.run_id: "requeued"}

    async def test_unclaimed_and_queued_runs_are_not_orphans(self, conn):
        await admit(conn, "t-1")
        await admit(conn, "t-1", "enqueue")

        assert await reconcile(conn, now=at(600)) == []

    async def test_filters_by_deployment_and_scope_and_honours_the_limit(self, conn):
        await own_running(conn, "t-1", worker_id=OTHER, lease_seconds=30)
        await own_running(conn, "t-2", worker_id=OTHER, lease_seconds=30, deployment_ref="other")
        await own_running(conn, "t-3", worker_id=OTHER, lease_seconds=30, tenant_id="acme")
        await own_running(conn, "t-4", worker_id=OTHER, lease_seconds=31)

        first = await reconcile(conn, now=at(60), deployment_ref="deploy-a", claim_limit=1)
        rest = await reconcile(conn, now=at(60), deployment_ref="deploy-a")

        assert [r["thread_id"] for r in first] == ["t-1"]  # oldest expiry first
        assert [r["thread_id"] for r in rest] == ["t-4"]
        assert [r["thread_id"] for r in await reconcile(conn, now=at(60))] == ["t-2"]
        assert [r["thread_id"] for r in await reconcile(conn, now=at(60), tenant_id="acme")] == [
            "t-3"]

    async def test_reconciliation_returns_empty_when_nothing_expired(self, conn):
        await own_running(conn, worker_id=OTHER)

        assert await reconcile(conn, now=at(1)) == []

    @pytest.mark.parametrize(("kwargs", "code"), [
        ({"claim_limit": 0}, "ZP008"), ({"grace": None}, "ZP008"), ({"stop_reason": None}, "ZP008"),
        ({"workspace_id": "ws"}, "ZP006")])
    async def test_bad_argument_raises(self, conn, kwargs, code):
        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await reconcile(conn, **kwargs)
        assert info.value.sqlstate == code


class TestConcurrentReconcilers:
    async def test_concurrent_reconcilers_report_one_successful_claim(self, connect):
        setup, first, second = await connect(), await connect(), await connect()
        run_id = await own_running(setup, worker_id=OTHER, lease_seconds=30)

        async with first.transaction():
            mine = await reconcile(first, now=at(41))
            theirs = await reconcile(second, now=at(41))  # skips the row first holds
        again = await reconcile(second, now=at(42))

        assert [r["run_id"] for r in mine] == [run_id]
        assert (theirs, again) == ([], [])
