"""zeroth.renew_lease: a live lease held by (worker_id, generation) is extended, nothing else is.

Who may renew (the exact holder; generation NULL: the holder's lease whatever its generation) and
what is refused: tests/sql/test_fenced_conformance.py."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, claim, enqueue, make_run, run_row

OTHER = "worker-b"

RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => $4, now_override => $5)"""


async def renew(conn: asyncpg.Connection, run_id: UUID | None, worker_id: str | None = WORKER,
                generation: int | None = 1, *, lease_seconds: float = 60.0,
                now: datetime) -> bool:
    return await conn.fetchval(  # type: ignore[no-any-return]
        RENEW, run_id, worker_id, generation, lease_seconds, now)


async def slot_row(conn: asyncpg.Connection, slot_no: int = 1) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
             FROM zeroth_test.slot_leases s
            WHERE s.tenant_id = 'default' AND s.workspace_key = '' AND s.deployment_ref = $1
              AND s.slot_no = $2""", DEPLOYMENT, slot_no)


class TestOwnerRenews:
    async def test_owner_with_current_generation_moves_expiry_to_now_plus_lease(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await renew(conn, lease.run_id, generation=lease.generation,
                           lease_seconds=90, now=at(30)) is True

        after = await run_row(conn, lease.run_id)
        assert after["lease_expires_at"] == at(120)
        # Only the expiry moves: holder, generation, status and acquisition time stay.
        assert {**dict(after), "lease_expires_at": None} == {
            **dict(before), "lease_expires_at": None}

    async def test_renewal_sets_expiry_from_now_even_when_that_shortens_it(self, conn):
        lease = await make_run(conn, "running", lease_seconds=600)

        assert await renew(conn, lease.run_id, lease_seconds=10, now=at(5)) is True

        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(15)

    async def test_null_generation_renews_for_the_owner(self, conn):
        lease = await make_run(conn, "running")

        assert await renew(conn, lease.run_id, generation=None, now=at(30)) is True

        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(90)

    async def test_renewal_of_claimed_but_not_started_run_works(self, conn):
        lease = await make_run(conn, "claimed")

        assert await renew(conn, lease.run_id, now=at(30)) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert row["lease_expires_at"] == at(90)
        assert row["lease_generation"] == lease.generation

    async def test_expiry_exactly_equal_to_now_is_still_renewable(self, conn):
        lease = await make_run(conn, "running")

        assert await renew(conn, lease.run_id, now=at(60)) is True

        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(120)

    async def test_renewal_never_bumps_the_generation(self, conn):
        lease = await make_run(conn, "running")

        for second in (10, 20, 30):
            assert await renew(conn, lease.run_id, now=at(second)) is True

        assert (await run_row(conn, lease.run_id))["lease_generation"] == lease.generation

    async def test_largest_lease_of_one_day_is_accepted(self, conn):
        lease = await make_run(conn, "running")

        assert await renew(conn, lease.run_id, lease_seconds=86400, now=at(1)) is True

        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(86401)


class TestRenewalKeepsTheSlot:
    async def test_live_renewal_keeps_the_slot_so_a_second_claim_is_saturated(self, conn):
        a = await make_run(conn, "running", max_concurrency=1)
        await enqueue(conn)

        assert await renew(conn, a.run_id, generation=a.generation, now=at(50)) is True

        assert (await slot_row(conn))["lease_expires_at"] == at(110)
        # At 61 the original lease would have expired; the renewed slot still holds A.
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(61)) == []
        assert (await slot_row(conn))["run_id"] == a.run_id


class TestBadArguments:
    @pytest.mark.parametrize(
        "lease_seconds", [0.0, -1.0, float("nan"), 86400.5, float("inf")],
        ids=["lease-zero", "lease-negative", "lease-nan", "lease-over-a-day", "lease-infinite"])
    async def test_bad_argument_raises_invalid_argument_and_changes_nothing(
            self, conn, lease_seconds):
        # The fence arguments: tests/sql/test_fenced_conformance.py.
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew(conn, lease.run_id, WORKER, lease_seconds=lease_seconds, now=at(30))

        assert raised.value.sqlstate == "ZP008"
        assert await run_row(conn, lease.run_id) == before

    async def test_null_lease_seconds_raises_invalid_argument(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await conn.fetchval(
                    """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2,
                           generation => 1,
                           lease_seconds => NULL, now_override => $3)""",
                    lease.run_id, WORKER, at(30))

        assert raised.value.sqlstate == "ZP008"
        assert await run_row(conn, lease.run_id) == before


class TestHeapOnlyTupleUpdates:
    async def test_renewals_are_hot_updates_because_lease_columns_are_not_indexed(self, conn):
        lease = await make_run(conn, "running")
        stats = """SELECT pg_stat_get_xact_tuples_hot_updated('zeroth.runs'::regclass) AS hot,
                          pg_stat_get_xact_tuples_updated('zeroth.runs'::regclass) AS updated"""
        before = await conn.fetchrow(stats)

        renewals = 3
        for second in range(1, renewals + 1):
            assert await renew(conn, lease.run_id, now=at(second)) is True

        after = await conn.fetchrow(stats)
        assert after["updated"] - before["updated"] == renewals
        assert after["hot"] - before["hot"] == renewals
