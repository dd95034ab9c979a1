"""zeroth.start_run: pending → running for the live lease holder, counting one attempt."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import asyncpg
from helpers import WORKER, at, claim, make_run, run_row

OTHER = "worker-b"
SOON = at(1)

START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""


async def start(conn: asyncpg.Connection, run_id: UUID | None, *,
                worker_id: str | None = WORKER, generation: int | None = 1,
                now: datetime = SOON) -> bool:
    return await conn.fetchval(  # type: ignore[no-any-return]
        START, run_id, worker_id, generation, now)


class TestStart:
    async def test_claimed_run_becomes_running_with_one_attempt(self, conn):
        lease = await make_run(conn, "claimed")
        before = await run_row(conn, lease.run_id)
        assert (before["status"], before["attempts"], before["started_at"]) == (
            "pending", 0, None)

        assert await start(conn, lease.run_id, now=at(5)) is True

        after = await run_row(conn, lease.run_id)
        assert after["status"] == "running"
        assert after["attempts"] == 1
        assert after["started_at"] == at(5)
        assert after["updated_at"] == at(5)
        # Starting is not a renewal and not a new owner: the lease is untouched.
        lease_columns = ("lease_worker_id", "lease_generation", "lease_acquired_at",
                         "lease_expires_at")
        assert [after[c] for c in lease_columns] == [before[c] for c in lease_columns]

    async def test_start_is_idempotent_for_the_holder_of_a_running_run(self, conn):
        lease = await make_run(conn, "running")
        first = await run_row(conn, lease.run_id)

        assert await start(conn, lease.run_id, now=at(10)) is True

        again = await run_row(conn, lease.run_id)
        assert again["status"] == "running"
        assert again["attempts"] == first["attempts"] == 1
        assert again["started_at"] == first["started_at"]

    async def test_recovered_run_starts_without_counting_a_third_attempt(self, conn):
        lease = await make_run(conn, "running")
        taken = await conn.fetch(
            """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                   deployment_ref => 'deploy-a', worker_id => $1, now_override => $2)""",
            OTHER, at(61))
        assert [(r["run_id"], r["lease_generation"]) for r in taken] == [(lease.run_id, 2)]

        assert await start(conn, lease.run_id, worker_id=OTHER, generation=2,
                           now=at(62)) is True

        row = await run_row(conn, lease.run_id)
        # The recovery counted attempt 2; starting the recovered run counts nothing more.
        assert (row["status"], row["attempts"], row["started_at"]) == ("running", 2, at(0))

    async def test_expiry_exactly_equal_to_now_still_starts(self, conn):
        lease = await make_run(conn, "claimed")

        assert await start(conn, lease.run_id, now=at(60)) is True

        assert (await run_row(conn, lease.run_id))["status"] == "running"

    async def test_each_retry_counts_another_attempt(self, conn):
        lease = await make_run(conn, "running")
        outcome = await conn.fetchval(
            """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                   retry_base_seconds => 0, retry_max_seconds => 0, now_override => $4)""",
            lease.run_id, WORKER, lease.generation, at(1))
        assert outcome == "retry_scheduled"
        assert [r["lease_generation"] for r in await claim(conn, now=at(2))] == [2]

        assert await start(conn, lease.run_id, generation=2, now=at(3)) is True

        row = await run_row(conn, lease.run_id)
        assert (row["attempts"], row["started_at"]) == (2, at(3))


class TestFinishedRunsCannotStart:
    async def test_claimed_run_cancelled_by_an_admin_cannot_start(self, conn):
        lease = await make_run(conn, "claimed")
        outcome = await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(1))
        assert outcome == "cancelled"
        before = await run_row(conn, lease.run_id)

        assert await start(conn, lease.run_id, now=at(2)) is False

        after = await run_row(conn, lease.run_id)
        assert after == before
        assert after["status"] == "cancelled"

