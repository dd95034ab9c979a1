"""zeroth.renew_leases: one call renews every live lease of a worker and reports each loss."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

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

    async def test_mixed_batch_reports_each_run_and_renews_only_the_live_one(self, conn):
        now = at(100)
        # Each run in its own deployment so one factory's batch claim cannot touch another run.
        fine = await make_run(conn, "running", deployment_ref="d-fine", lease_seconds=600)
        expired = await make_run(conn, "running", deployment_ref="d-expired", lease_seconds=60)
        stale = await make_run(conn, "claimed", deployment_ref="d-stale", lease_seconds=60)
        reclaimed = await claim(conn, deployment_ref="d-stale", lease_seconds=600, now=at(61))
        assert [r["lease_generation"] for r in reclaimed] == [stale.generation + 1]
        taken = await make_run(conn, "running", deployment_ref="d-taken", lease_seconds=60)
        takeover = await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => 'd-taken',
                   worker_id => $1, lease_seconds => 600, now_override => $2)""", OTHER, at(61))
        assert [r["run_id"] for r in takeover] == [taken.run_id]
        losers = [stale.run_id, expired.run_id, taken.run_id]
        before = await all_rows(conn, losers)

        result = await renew_many(
            conn,
            [stale.run_id, expired.run_id, taken.run_id, fine.run_id],
            [stale.generation, expired.generation, taken.generation, fine.generation],
            now=now)

        assert [tuple(row) for row in result] == [
            (stale.run_id, False, None, False),
            (expired.run_id, False, None, False),
            (taken.run_id, False, None, False),
            (fine.run_id, True, at(160), False),
        ]
        assert await all_rows(conn, losers) == before
        assert (await run_row(conn, fine.run_id))["lease_expires_at"] == at(160)

    async def test_another_workers_lease_is_not_renewed(self, conn):
        lease = await make_run(conn, "running", worker_id=OTHER)
        before = await run_row(conn, lease.run_id)

        result = await renew_many(conn, [lease.run_id], [lease.generation], now=at(30))

        assert [tuple(row) for row in result] == [(lease.run_id, False, None, False)]
        assert await run_row(conn, lease.run_id) == before

    async def test_unknown_run_is_reported_not_renewed(self, conn):
        missing = uuid4()

        result = await renew_many(conn, [missing], [1], now=at(1))

        assert [tuple(row) for row in result] == [(missing, False, None, False)]

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
        # Finding 11: run ids are unique per scope only, and on main the zeroth_control payload
        # and the worker matched a cancel by run id alone. The renewal that confirms a cancel
        # reads the caller's own scope.
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
    @pytest.mark.parametrize(
        ("shape", "worker_id", "lease_seconds"),
        [
            pytest.param("longer-run-ids", WORKER, 60.0, id="run-ids-longer"),
            pytest.param("longer-generations", WORKER, 60.0, id="generations-longer"),
            pytest.param("null-run-id-element", WORKER, 60.0, id="null-run-id-element"),
            pytest.param("null-generation-element", WORKER, 60.0, id="null-generation-element"),
            pytest.param("null-run-ids", WORKER, 60.0, id="null-run-ids"),
            pytest.param("null-generations", WORKER, 60.0, id="null-generations"),
            pytest.param("ok", "", 60.0, id="empty-worker"),
            pytest.param("two-dimensional", WORKER, 60.0, id="two-dimensional"),
            pytest.param("ok", None, 60.0, id="null-worker"),
            pytest.param("ok", WORKER, 0.0, id="lease-zero"),
            pytest.param("ok", WORKER, float("nan"), id="lease-nan"),
            pytest.param("ok", WORKER, 86401.0, id="lease-over-a-day"),
        ],
    )
    async def test_bad_arguments_raise_invalid_argument_and_renew_nothing(
            self, conn, shape, worker_id, lease_seconds):
        a = await make_run(conn, "running")
        b = await make_run(conn, "running")
        run_ids: list[Any] | None = [a.run_id, b.run_id]
        generations: list[Any] | None = [a.generation, b.generation]
        if shape == "longer-run-ids":
            generations = [a.generation]
        elif shape == "longer-generations":
            run_ids = [a.run_id]
        elif shape == "null-run-id-element":
            run_ids = [a.run_id, None]
        elif shape == "null-generation-element":
            generations = [a.generation, None]
        elif shape == "two-dimensional":  # 0A000 before (red-team F4)
            run_ids, generations = [[a.run_id, b.run_id]], [[a.generation, b.generation]]
        elif shape == "null-run-ids":
            run_ids = None
        elif shape == "null-generations":
            generations = None
        before = await all_rows(conn, [a.run_id, b.run_id])

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew_many(conn, run_ids, generations, worker_id=worker_id,
                                 lease_seconds=lease_seconds, now=at(30))

        assert raised.value.sqlstate == "ZP008"
        assert await all_rows(conn, [a.run_id, b.run_id]) == before

    async def test_a_batch_that_repeats_a_run_is_refused_whole(self, conn):
        # Finding 11: renew_leases skipped the checks complete_runs has.
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew_many(conn, [lease.run_id, lease.run_id], [1, 1], now=at(30))

        assert raised.value.sqlstate == "ZP008"
        assert await run_row(conn, lease.run_id) == before

    async def test_more_than_1000_runs_is_refused(self, conn):
        ids = [uuid4() for _ in range(1001)]
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew_many(conn, ids, [1] * 1001, now=at(30))
        assert raised.value.sqlstate == "ZP008"

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

    async def test_lease_whose_slot_was_reallocated_is_not_renewed(self, conn):
        a = await make_run(conn, "running", max_concurrency=1)
        b = await enqueue(conn)
        taken = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(61))
        assert [r["run_id"] for r in taken] == [b]
        a_before = await run_row(conn, a.run_id)
        slot_before = await slot_of(conn, b)

        result = await renew_many(conn, [a.run_id], [a.generation], now=at(61))

        assert [tuple(row) for row in result] == [(a.run_id, False, None, False)]
        assert await run_row(conn, a.run_id) == a_before
        assert await slot_of(conn, b) == slot_before
        assert await slot_of(conn, a.run_id) is None

    async def test_refused_run_in_a_batch_leaves_its_slot_unrenewed(self, conn):
        live = await make_run(conn, "running", max_concurrency=2, lease_seconds=600)
        expired = await make_run(conn, "running", max_concurrency=2, lease_seconds=60)
        expired_slot = await slot_of(conn, expired.run_id)

        result = await renew_many(conn, [live.run_id, expired.run_id],
                                  [live.generation, expired.generation], now=at(100))

        assert [row["renewed"] for row in result] == [True, False]
        assert (await slot_of(conn, live.run_id))["lease_expires_at"] == at(160)
        assert await slot_of(conn, expired.run_id) == expired_slot

