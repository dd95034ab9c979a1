"""zeroth.claim_and_start: claim_pending and start_run in one UPDATE — same order, slots,
saturation row and argument checks as claim_pending, but every claimed run comes back running
with its attempt counted."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, T0, WORKER, at, enqueue, make_run, run_row

CLAIM_AND_START = """SELECT * FROM zeroth_test.claim_and_start(deployment_ref => $1,
                         worker_id => $2,
    tenant_id => $3, workspace_id => $4, max_concurrency => $5, batch_size => $6,
    lease_seconds => $7, now_override => $8)"""


async def claim_and_start(conn: asyncpg.Connection, *, deployment_ref: str = DEPLOYMENT,
                          worker_id: str | None = WORKER, tenant_id: str | None = None,
                          workspace_id: str | None = None, max_concurrency: int | None = None,
                          batch_size: int | None = 1, lease_seconds: float | None = LEASE,
                          now: Any = T0) -> list[asyncpg.Record]:
    """Every row claim_and_start returns, the run_id-NULL marker included."""
    return await conn.fetch(  # type: ignore[no-any-return]
        CLAIM_AND_START, deployment_ref, worker_id, tenant_id, workspace_id, max_concurrency,
        batch_size, lease_seconds, now)


async def table_state(conn: asyncpg.Connection) -> list[list[dict[str, Any]]]:
    return [[dict(r) for r in await conn.fetch(sql)] for sql in (
        "SELECT * FROM zeroth.runs ORDER BY run_id",
        "SELECT * FROM zeroth.admission_slots ORDER BY deployment_ref, slot_no")]


class TestClaimAndStart:
    async def test_claimed_run_is_running_with_its_lease_and_first_attempt(self, conn):
        run_id = await enqueue(conn)

        (row,) = await claim_and_start(conn, now=at(1))

        assert (row["run_id"], row["lease_generation"], row["status"], row["attempts"]) == (
            run_id, 1, "running", 1)
        assert row["lease_expires_at"] == at(1 + LEASE)
        stored = await run_row(conn, run_id)
        assert (stored["status"], stored["attempts"], stored["started_at"]) == ("running", 1, at(1))
        assert (stored["lease_worker_id"], stored["lease_acquired_at"]) == (WORKER, at(1))

    async def test_run_is_completed_without_a_start_run_call(self, conn):
        await enqueue(conn)
        (row,) = await claim_and_start(conn)

        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   output => '{"done": 1}', now_override => $4)""",
            row["run_id"], WORKER, row["lease_generation"], at(2))
        assert (await run_row(conn, row["run_id"]))["status"] == "completed"

    async def test_a_later_start_run_is_idempotent_and_counts_no_second_attempt(self, conn):
        await enqueue(conn)
        (row,) = await claim_and_start(conn)

        assert await conn.fetchval(
            """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", row["run_id"], WORKER, row["lease_generation"], at(3))
        stored = await run_row(conn, row["run_id"])
        assert (stored["attempts"], stored["started_at"]) == (1, T0)

    async def test_batch_follows_claim_order_priority_then_run_after_then_created_at(self, conn):
        low = await enqueue(conn, priority=0, now=T0)
        high = await enqueue(conn, priority=5, now=at(2))
        early = await enqueue(conn, priority=0, run_after=at(-5), now=at(1))

        rows = await claim_and_start(conn, batch_size=10, now=at(3))

        assert [r["run_id"] for r in rows] == [high, early, low]
        assert {r["status"] for r in rows} == {"running"}

    async def test_empty_queue_returns_one_unsaturated_marker_row(self, conn):
        (row,) = await claim_and_start(conn)

        assert row["run_id"] is None
        assert (row["concurrency_saturated"], row["active_count"]) == (False, 0)

    async def test_handed_back_run_is_started_again_with_its_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        checkpoint = await conn.fetchval(
            """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => 1,
                   data => '{"step": 3}', now_override => $3)""", lease.run_id, WORKER, at(1))
        assert await conn.fetchval(
            """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => 1,
                   now_override => $3)""", lease.run_id, WORKER, at(2))

        (row,) = await claim_and_start(conn, worker_id="worker-b", now=at(3))

        assert (row["run_id"], row["lease_generation"], row["status"]) == (
            lease.run_id, 2, "running")
        assert (row["recovery_checkpoint_id"], json.loads(row["checkpoint_data"])) == (
            checkpoint, {"step": 3})
        # A hand-back gives the attempt back, so this start is attempt 1 again.
        assert (await run_row(conn, lease.run_id))["attempts"] == 1

    async def test_future_and_leased_runs_are_not_claimed(self, conn):
        await enqueue(conn, run_after=at(10))
        await make_run(conn, "claimed")

        (row,) = await claim_and_start(conn, now=at(1))

        assert row["run_id"] is None


class TestMaxConcurrency:
    async def test_claims_stop_at_the_limit_and_report_saturation(self, conn):
        for _ in range(3):
            await enqueue(conn, tenant_id="t1")

        first = await claim_and_start(conn, tenant_id="t1", max_concurrency=2, batch_size=5)
        second = await claim_and_start(conn, tenant_id="t1", max_concurrency=2)

        assert [r["status"] for r in first] == ["running", "running"]
        assert [r["admission_slot"] for r in await conn.fetch(
            "SELECT admission_slot FROM zeroth.runs WHERE status = 'running' ORDER BY 1")] == [1, 2]
        (marker,) = second
        assert (marker["run_id"], marker["concurrency_saturated"], marker["active_count"],
                marker["concurrency_limit"]) == (None, True, 2, 2)

    async def test_slot_rows_mirror_the_started_leases(self, conn):
        await enqueue(conn, tenant_id="t1")

        (row,) = await claim_and_start(conn, tenant_id="t1", max_concurrency=3)

        slot = await conn.fetchrow(
            """SELECT run_id, lease_worker_id, lease_generation, lease_expires_at
                 FROM zeroth_test.slot_leases WHERE run_id IS NOT NULL""")
        assert tuple(slot) == (row["run_id"], WORKER, 1, row["lease_expires_at"])


class TestRejectedArguments:
    @pytest.mark.parametrize("kwargs", [
        {"worker_id": None}, {"worker_id": ""}, {"deployment_ref": ""}, {"batch_size": 0},
        {"batch_size": 1001}, {"max_concurrency": 0}, {"lease_seconds": 0},
        {"lease_seconds": float("nan")},
    ], ids=lambda kwargs: ",".join(f"{k}={v!r}" for k, v in kwargs.items()))
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, kwargs):
        await enqueue(conn)
        before = await table_state(conn)

        with pytest.raises(asyncpg.PostgresError) as error:
            async with conn.transaction():
                await claim_and_start(conn, **kwargs)

        assert error.value.sqlstate == "ZP008"
        assert await table_state(conn) == before

    async def test_max_concurrency_with_workspace_but_no_tenant_raises_zp006(self, conn):
        with pytest.raises(asyncpg.PostgresError) as error:
            async with conn.transaction():
                await claim_and_start(conn, workspace_id="w1", max_concurrency=1)

        assert error.value.sqlstate == "ZP006"
