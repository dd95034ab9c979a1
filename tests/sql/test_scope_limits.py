"""zeroth.scope_limits: per-scope limits a DBA sets in SQL, read by every claim on its next call —
claim_pending, claim_and_start and claim_orphaned (claim_and_start_scopes has its own module):
max_concurrency replaces the claimer's argument, paused leases nothing, and the table refuses
values no claim could work with."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, WORKER, at, claim, enqueue, make_run, run_row

CLAIM_AND_START = """SELECT * FROM zeroth_test.claim_and_start(deployment_ref => $1,
    worker_id => $2, tenant_id => $3, max_concurrency => $4, batch_size => $5,
    now_override => $6)"""

CLAIM_ORPHANED = """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => $1,
    worker_id => $2, tenant_id => $3, max_concurrency => $4, now_override => $5)"""


async def set_limit(conn: asyncpg.Connection, *, tenant: str = "default",
                    deployment: str = DEPLOYMENT, max_concurrency: int | None = None,
                    paused: bool = False, weight: int = 1) -> None:
    await conn.execute(
        """INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, max_concurrency, paused,
                                            weight)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (tenant_id, workspace_key, deployment_ref) DO UPDATE
              SET max_concurrency = EXCLUDED.max_concurrency, paused = EXCLUDED.paused,
                  weight = EXCLUDED.weight""", tenant, deployment, max_concurrency, paused, weight)


async def claim_and_start(conn: asyncpg.Connection, *, max_concurrency: int | None = None,
                          batch_size: int = 10, tenant: str | None = None,
                          now: object = at(1)) -> list[asyncpg.Record]:
    return await conn.fetch(CLAIM_AND_START, DEPLOYMENT, WORKER, tenant, max_concurrency,  # type: ignore[no-any-return]
                            batch_size, now)


class TestMaxConcurrency:
    async def test_the_table_caps_a_claimer_that_passes_no_limit(self, conn):
        for _ in range(3):
            await enqueue(conn)
        await set_limit(conn, max_concurrency=2)

        rows = await claim_and_start(conn)
        assert len([r for r in rows if r["run_id"]]) == 2
        assert rows[0]["concurrency_limit"] == 2

        (marker,) = await claim_and_start(conn, now=at(2))
        assert (marker["run_id"], marker["concurrency_saturated"], marker["active_count"]) == (
            None, True, 2)

    async def test_the_table_replaces_the_claimers_argument(self, conn):
        for _ in range(5):
            await enqueue(conn)
        await set_limit(conn, max_concurrency=1)
        rows = await claim_and_start(conn, max_concurrency=5)
        assert len([r for r in rows if r["run_id"]]) == 1

    async def test_a_row_without_max_concurrency_leaves_the_argument(self, conn):
        for _ in range(5):
            await enqueue(conn)
        await set_limit(conn, weight=5)
        rows = await claim_and_start(conn, max_concurrency=3)
        assert len([r for r in rows if r["run_id"]]) == 3

    async def test_a_change_applies_to_the_next_claim(self, conn):
        for _ in range(5):
            await enqueue(conn)
        await set_limit(conn, max_concurrency=1)
        assert len(await claim(conn, batch_size=10, now=at(1))) == 1
        await set_limit(conn, max_concurrency=4)
        assert len(await claim(conn, batch_size=10, now=at(2))) == 3

    async def test_another_scope_is_not_limited_by_the_row(self, conn):
        for tenant in ("capped", "other"):
            for _ in range(3):
                await enqueue(conn, tenant_id=tenant)
        await set_limit(conn, tenant="capped", max_concurrency=1)
        assert len([r for r in await claim_and_start(conn, tenant="other") if r["run_id"]]) == 3


class TestPaused:
    async def test_claims_lease_nothing_in_a_paused_scope(self, conn):
        run_id = await enqueue(conn)
        await set_limit(conn, paused=True)

        (marker,) = await claim_and_start(conn)
        assert (marker["run_id"], marker["concurrency_saturated"]) == (None, False)
        assert await claim(conn) == []
        stored = await run_row(conn, run_id)
        assert (stored["status"], stored["lease_worker_id"], stored["lease_generation"]) == (
            "pending", None, 0)

        await set_limit(conn, paused=False)
        assert [r["run_id"] for r in await claim_and_start(conn, now=at(2))] == [run_id]

    async def test_orphans_of_a_paused_scope_are_not_re_leased(self, conn):
        lease = await make_run(conn, "running")
        await set_limit(conn, paused=True)
        after = at(LEASE + 5)

        (marker,) = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "rescuer", None, None, after)
        assert marker["run_id"] is None
        assert (await run_row(conn, lease.run_id))["lease_worker_id"] == lease.worker_id

        await set_limit(conn, paused=False)
        rows = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "rescuer", None, None, after)
        assert [r["run_id"] for r in rows] == [lease.run_id]


class TestTable:
    @pytest.mark.parametrize(("column", "value"), [
        ("max_concurrency", 0), ("max_concurrency", 10001), ("weight", 0), ("weight", 1001),
        ("tenant_id", ""), ("deployment_ref", ""),
    ])
    async def test_values_no_claim_could_use_are_refused(self, conn, column, value):
        row = {"tenant_id": "t", "deployment_ref": "d", column: value}
        with pytest.raises(asyncpg.CheckViolationError):
            async with conn.transaction():
                await conn.execute(
                    f"INSERT INTO zeroth.scope_limits ({', '.join(row)}) "
                    f"VALUES ({', '.join(f'${i + 1}' for i in range(len(row)))})", *row.values())

    async def test_one_row_per_scope_whatever_the_workspace_spelling(self, conn):
        await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, workspace_id, "
                           "deployment_ref) VALUES ('t', NULL, 'd'), ('t', 'w', 'd')")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, workspace_id, "
                               "deployment_ref) VALUES ('t', NULL, 'd')")
