"""zeroth.claim_orphaned_scopes: claim_orphaned over many deployments and scopes — every scope
of the deployments with an expired running run (or a listed set), each recovered exactly as
claim_orphaned does, one claim_limit shared by all, scope columns on every row, and bad input
refused with nothing changed."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from helpers import LEASE, at, make_run, run_row

CLAIM = """SELECT * FROM zeroth_test.claim_orphaned_scopes(deployment_refs => $1::text[],
    worker_id => $2, tenant_ids => $3::text[], workspace_ids => $4::text[],
    max_concurrency => $5, claim_limit => $6, lease_seconds => $7, grace_seconds => $8,
    now_override => $9)"""

LATER = at(LEASE + 5)  # every lease taken at T0 has expired


async def sweep(conn: asyncpg.Connection, deployments: Any = ("a",), *, worker: Any = "rescuer",
                tenants: Any = None, workspaces: Any = None, max_concurrency: Any = None,
                claim_limit: Any = None, lease_seconds: Any = LEASE, grace_seconds: Any = 10,
                now: Any = LATER) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        CLAIM, None if deployments is None else list(deployments), worker,
        None if tenants is None else list(tenants),
        None if workspaces is None else list(workspaces), max_concurrency, claim_limit,
        lease_seconds, grace_seconds, now)


async def orphans(conn: asyncpg.Connection, count: int, *, tenant: str,
                  deployment: str = "a", **kwargs: Any) -> list[Any]:
    return [(await make_run(conn, "running", deployment_ref=deployment, tenant_id=tenant,
                            **kwargs)).run_id for _ in range(count)]


class TestRecovery:
    async def test_every_scope_of_the_deployments_with_an_expired_lease(self, conn):
        mine = [*await orphans(conn, 1, tenant="t1"), *await orphans(conn, 2, tenant="t2"),
                *await orphans(conn, 1, tenant="t3", deployment="b")]
        other = await orphans(conn, 1, tenant="t1", deployment="c")

        rows = await sweep(conn, ("a", "b"))

        assert sorted(r["run_id"] for r in rows) == sorted(mine)
        assert {(r["tenant_id"], r["deployment_ref"]) for r in rows} == {
            ("t1", "a"), ("t2", "a"), ("t3", "b")}
        assert {(r["lease_generation"], r["attempts"]) for r in rows} == {(2, 2)}
        stored = await run_row(conn, other[0], tenant_id="t1")
        assert stored["lease_generation"] == 1

    async def test_live_leases_are_left_alone(self, conn):
        await orphans(conn, 2, tenant="t1")
        assert await sweep(conn, now=at(1)) == []

    async def test_listed_scopes_only(self, conn):
        wanted = await orphans(conn, 1, tenant="t1", workspace_id="w")
        await orphans(conn, 1, tenant="t2")
        rows = await sweep(conn, tenants=["t1"], workspaces=["w"])
        assert [(r["run_id"], r["workspace_id"]) for r in rows] == [(wanted[0], "w")]

    async def test_claim_limit_is_shared_by_every_scope(self, conn):
        for tenant in ("t1", "t2", "t3"):
            await orphans(conn, 2, tenant=tenant)
        assert len(await sweep(conn, claim_limit=3)) == 3
        assert len(await sweep(conn)) == 3  # the rest

    async def test_claim_limit_zero_ends_what_nobody_may_resume_and_re_leases_nothing(self, conn):
        spent = await orphans(conn, 1, tenant="t1", max_attempts=1)
        resumable = await orphans(conn, 1, tenant="t2")

        rows = await sweep(conn, claim_limit=0)

        assert [r["run_id"] for r in rows if r["run_id"]] == []
        assert [(r["tenant_id"], r["concurrency_saturated"]) for r in rows] == [("t2", True)]
        dead = await run_row(conn, spent[0], tenant_id="t1")
        assert (dead["status"], dead["dead_lettered_at"] is not None) == ("failed", True)
        assert (await run_row(conn, resumable[0], tenant_id="t2"))["lease_generation"] == 1

    async def test_a_paused_scope_re_leases_nothing(self, conn):
        paused = await orphans(conn, 1, tenant="t1")
        await orphans(conn, 1, tenant="t2")
        await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, paused) "
                           "VALUES ('t1', 'a', true)")
        rows = await sweep(conn)
        assert [r["tenant_id"] for r in rows] == ["t2"]
        assert (await run_row(conn, paused[0], tenant_id="t1"))["lease_generation"] == 1

    async def test_a_full_scope_reports_saturation(self, conn):
        (orphan,) = await orphans(conn, 1, tenant="t1", max_concurrency=1)
        fresh = await make_run(conn, "pending", deployment_ref="a", tenant_id="t1")
        taken = await conn.fetch("""SELECT run_id FROM zeroth_test.claim_and_start(
            deployment_ref => 'a', worker_id => 'x', tenant_id => 't1', max_concurrency => 1,
            now_override => $1)""", LATER)  # the one slot: the orphan's lease had expired
        assert [r["run_id"] for r in taken] == [fresh.run_id]

        rows = await sweep(conn, max_concurrency=1)

        assert [(r["tenant_id"], r["run_id"], r["concurrency_saturated"]) for r in rows] == [
            ("t1", None, True)]
        assert (await run_row(conn, orphan, tenant_id="t1"))["lease_generation"] == 1


class TestBadInput:
    @pytest.mark.parametrize(("changes", "message"), [
        ({"deployments": None}, "deployment_refs must be"),
        ({"deployments": []}, "deployment_refs must be"),
        ({"worker": ""}, "worker_id"),
        ({"claim_limit": -1}, "claim_limit"),
        ({"claim_limit": 1001}, "claim_limit"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"grace_seconds": -1}, "grace_seconds"),
        ({"workspaces": ["w"]}, "workspace_ids needs tenant_ids"),
        ({"tenants": ["t1", "t2"], "workspaces": ["w"]}, "as long as tenant_ids"),
    ])
    async def test_zp008_and_nothing_changed(self, conn, changes, message):
        run_id = (await orphans(conn, 1, tenant="default"))[0]
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await sweep(conn, **changes)
        assert caught.value.sqlstate == "ZP008"
        assert message in str(caught.value)
        assert (await run_row(conn, run_id))["lease_generation"] == 1

    async def test_a_workspace_without_a_tenant_is_zp006(self, conn):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await sweep(conn, tenants=[None], workspaces=["w"])
        assert caught.value.sqlstate == "ZP006"

    @pytest.mark.parametrize(("scopes", "sqlstate"), [
        ({"tenants": [None], "workspaces": ["w"]}, "ZP006"),
        ({"tenants": ["t1", "t2"], "workspaces": ["w"]}, "ZP008"),
        ({"tenants": ["t" * 201]}, "ZP008"),
    ])
    async def test_bad_scopes_are_refused_whatever_the_statistics_say_of_the_runs(
            self, connect, scopes, sqlstate):
        # Once VACUUM (autovacuum) has seen the table empty the planner believes it empty, and a
        # plan that read the scopes only for runs it found (a hash semi-join with nothing on the
        # runs side) never checked them: these calls returned no rows.
        conn = await connect()
        await conn.execute("VACUUM ANALYZE zeroth.runs")
        with pytest.raises(asyncpg.PostgresError) as caught:
            await sweep(conn, **scopes)
        assert caught.value.sqlstate == sqlstate
