"""zeroth.renew_leases: one call renews every live lease of a worker and reports each loss."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import WORKER, at, claim, enqueue, make_run, run_row

OTHER = "worker-b"

RENEW_MANY = """SELECT run_id, renewed, lease_expires_at, cancel_requested
                  FROM zeroth_test.renew_leases(worker_id => $1, run_ids => $2::uuid[],
                       generations => $3::bigint[], lease_seconds => $4, now_override => $5)"""


async def renew_many(conn: asyncpg.Connection, run_ids: list[Any] | None,
                     generations: list[Any] | None, *, worker_id: str | None = WORKER,
                     lease_seconds: float = 60.0, now: datetime) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        RENEW_MANY, worker_id, run_ids, generations, lease_seconds, now)


async def slot_of(conn: asyncpg.Connection, run_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT s.slot_no, s.lease_worker_id, s.lease_generation, s.lease_expires_at
             FROM zeroth_test.slot_leases s WHERE s.run_id = $1""", run_id)


async def all_rows(conn: asyncpg.Connection, run_ids: list[UUID]) -> list[asyncpg.Record]:
    return [await run_row(conn, run_id) for run_id in run_ids]


class TestBatchRenewal:
    async def test_renews_every_live_lease_of_the_worker_in_input_order(self, conn):
        leases = [await make_run(conn, "running") for _ in range(3)]
        requested = list(reversed(leases))

        result = await renew_many(conn, [lease.run_id for lease in requested],
                                  [lease.generation for lease in requested],
                                  lease_seconds=90, now=at(30))

        assert [tuple(row) for row in result] == [
            (lease.run_id, True, at(120), False) for lease in requested]
        for lease in leases:
            row = await run_row(conn, lease.run_id)
            assert row["lease_expires_at"] == at(120)
            assert row["lease_generation"] == lease.generation

    async def test_renews_claimed_runs_that_have_not_started(self, conn):
        lease = await make_run(conn, "claimed")

        result = await renew_many(conn, [lease.run_id], [lease.generation], now=at(30))

        assert [tuple(row) for row in result] == [(lease.run_id, True, at(90), False)]
        assert (await run_row(conn, lease.run_id))["status"] == "pending"

    async def test_expiry_exactly_equal_to_now_is_still_renewable(self, conn):
        lease = await make_run(conn, "running")

        result = await renew_many(conn, [lease.run_id], [lease.generation], now=at(60))

        assert [tuple(row) for row in result] == [(lease.run_id, True, at(120), False)]


class TestCancelRequested:
    async def test_cancel_requested_is_reported_with_the_renewal(self, conn):
        cancelled = await make_run(conn, "running")
        untouched = await make_run(conn, "running")
        outcome = await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            cancelled.run_id, at(10))
        assert outcome == "cancel_requested"

        result = await renew_many(conn, [cancelled.run_id, untouched.run_id],
                                  [cancelled.generation, untouched.generation], now=at(20))

        assert [tuple(row) for row in result] == [
            (cancelled.run_id, True, at(80), True),
            (untouched.run_id, True, at(80), False),
        ]


class TestCancelsAreReportedInTheirOwnScope:
    async def test_a_cancel_of_the_same_run_id_elsewhere_is_not_reported_here(self, conn):
        # Run ids are unique per scope only, so a cancel is not matched by run id alone: the
        # renewal that confirms a cancel reads the caller's own scope.
        mine = await make_run(conn, "running", tenant_id="t-1")
        theirs = await make_run(conn, "running", tenant_id="t-2", run_id=mine.run_id)
        assert (theirs.run_id, theirs.generation) == (mine.run_id, mine.generation)
        assert await conn.fetchval(
            """SELECT zeroth_test.request_cancel(run_id => $1, tenant_id => 't-2',
                   now_override => $2)""", mine.run_id, at(10)) == "cancel_requested"

        rows = await conn.fetch(
            """SELECT renewed, cancel_requested FROM zeroth_test.renew_leases(worker_id => $1,
                   run_ids => $2::uuid[], generations => $3::bigint[], tenant_id => 't-1',
                   now_override => $4)""", WORKER, [mine.run_id], [1], at(20))

        assert [tuple(r) for r in rows] == [(True, False)]


class TestBadArguments:
    # The fence and the batch's shape (NULL, unequal, two-dimensional, repeated, over 1000):
    # tests/sql/test_fenced_conformance.py. Here: the lease duration.
    @pytest.mark.parametrize("lease_seconds", [0.0, float("nan"), 86401.0],
                             ids=["lease-zero", "lease-nan", "lease-over-a-day"])
    async def test_a_bad_lease_duration_raises_invalid_argument_and_renews_nothing(
            self, conn, lease_seconds):
        a = await make_run(conn, "running")
        b = await make_run(conn, "running")
        before = await all_rows(conn, [a.run_id, b.run_id])

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew_many(conn, [a.run_id, b.run_id], [a.generation, b.generation],
                                 lease_seconds=lease_seconds, now=at(30))

        assert raised.value.sqlstate == "ZP008"
        assert await all_rows(conn, [a.run_id, b.run_id]) == before

    async def test_empty_arrays_return_no_rows(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await renew_many(conn, [], [], now=at(30)) == []

        assert await run_row(conn, lease.run_id) == before


class TestAdmissionSlots:
    async def test_slots_are_renewed_together_with_their_runs(self, conn):
        a = await make_run(conn, "running", max_concurrency=2)
        b = await make_run(conn, "running", max_concurrency=2)

        result = await renew_many(conn, [a.run_id, b.run_id], [a.generation, b.generation],
                                  lease_seconds=120, now=at(30))

        assert [row["renewed"] for row in result] == [True, True]
        for lease in (a, b):
            slot = await slot_of(conn, lease.run_id)
            row = await run_row(conn, lease.run_id)
            assert slot is not None
            assert slot["slot_no"] == row["admission_slot"]
            assert slot["lease_expires_at"] == row["lease_expires_at"] == at(150)
            assert (slot["lease_worker_id"], slot["lease_generation"]) == (
                WORKER, lease.generation)

    async def test_renewed_slots_keep_a_later_claim_saturated(self, conn):
        a = await make_run(conn, "running", max_concurrency=1)
        await enqueue(conn)

        result = await renew_many(conn, [a.run_id], [a.generation], now=at(50))

        assert [row["renewed"] for row in result] == [True]
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(61)) == []
