"""zeroth.claim_and_start_scopes: claim_and_start over many deployments and scopes in one call —
every scope's own rules (order, slots, limits, pause), fair shares under a backlog (weighted),
scope columns on every row, one saturation row per saturated scope, and bad input refused with
nothing changed."""

from __future__ import annotations

import collections
from typing import Any

import asyncpg
import pytest
from helpers import LEASE, T0, WORKER, at, enqueue, run_row

CLAIM = """SELECT * FROM zeroth_test.claim_and_start_scopes(deployment_refs => $1::text[],
    worker_id => $2, tenant_ids => $3::text[], workspace_ids => $4::text[],
    max_concurrency => $5, batch_size => $6, lease_seconds => $7, now_override => $8)"""


async def claim(conn: asyncpg.Connection, deployments: Any = ("a",), *,
                worker_id: Any = WORKER, tenants: Any = None, workspaces: Any = None,
                max_concurrency: Any = None, batch_size: Any = 1, lease_seconds: Any = LEASE,
                now: Any = T0) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        CLAIM, None if deployments is None else list(deployments), worker_id,
        None if tenants is None else list(tenants),
        None if workspaces is None else list(workspaces), max_concurrency, batch_size,
        lease_seconds, now)


async def backlog(conn: asyncpg.Connection, count: int, *, deployment: str = "a",
                  tenant: str = "default", workspace: str | None = None, **kwargs: Any) -> list:
    return [await enqueue(conn, deployment_ref=deployment, tenant_id=tenant,
                          workspace_id=workspace, **kwargs) for _ in range(count)]


async def set_limit(conn: asyncpg.Connection, tenant: str, deployment: str = "a", *,
                    workspace: str | None = None, max_concurrency: int | None = None,
                    weight: int = 1, paused: bool = False) -> None:
    await conn.execute(
        """INSERT INTO zeroth.scope_limits (tenant_id, workspace_id, deployment_ref,
                                            max_concurrency, weight, paused)
           VALUES ($1, $2, $3, $4, $5, $6)
           ON CONFLICT (tenant_id, workspace_key, deployment_ref) DO UPDATE
              SET max_concurrency = EXCLUDED.max_concurrency, weight = EXCLUDED.weight,
                  paused = EXCLUDED.paused""",
        tenant, workspace, deployment, max_concurrency, weight, paused)


def per_tenant(rows: list[asyncpg.Record]) -> collections.Counter[str]:
    return collections.Counter(r["tenant_id"] for r in rows if r["run_id"] is not None)


async def table_state(conn: asyncpg.Connection) -> list[list[dict[str, Any]]]:
    return [[dict(r) for r in await conn.fetch(sql)] for sql in (
        "SELECT * FROM zeroth.runs ORDER BY run_id",
        "SELECT * FROM zeroth.admission_slots ORDER BY tenant_id, deployment_ref, slot_no")]


class TestClaims:
    async def test_every_scope_of_the_deployments_and_none_of_others(self, conn):
        mine = [*await backlog(conn, 2, tenant="t1"), *await backlog(conn, 2, tenant="t2"),
                *await backlog(conn, 2, tenant="t3", deployment="b")]
        other = await backlog(conn, 2, tenant="t1", deployment="c")

        rows = await claim(conn, ("a", "b"), batch_size=100, now=at(1))

        assert sorted(r["run_id"] for r in rows) == sorted(mine)
        assert {(r["tenant_id"], r["workspace_id"], r["deployment_ref"]) for r in rows} == {
            ("t1", None, "a"), ("t2", None, "a"), ("t3", None, "b")}
        assert {(r["status"], r["attempts"], r["lease_generation"]) for r in rows} == {
            ("running", 1, 1)}
        assert all(r["lease_expires_at"] == at(1 + LEASE) for r in rows)
        for run_id in other:
            assert (await run_row(conn, run_id, tenant_id="t1"))["status"] == "pending"
        stored = await run_row(conn, mine[0], tenant_id="t1")
        assert (stored["lease_worker_id"], stored["started_at"]) == (WORKER, at(1))

    async def test_listed_scopes_only_with_their_workspaces(self, conn):
        wanted = [*await backlog(conn, 1, tenant="t1", workspace="w1"),
                  *await backlog(conn, 1, tenant="t2")]
        await backlog(conn, 1, tenant="t1")              # t1's null workspace: not listed
        await backlog(conn, 1, tenant="t3", workspace="w1")

        rows = await claim(conn, tenants=["t1", "t2"], workspaces=["w1", None], batch_size=10)

        assert sorted(r["run_id"] for r in rows) == sorted(wanted)
        assert {(r["tenant_id"], r["workspace_id"]) for r in rows} == {("t1", "w1"),
                                                                      ("t2", None)}

    async def test_a_null_tenant_in_the_list_is_the_default_tenant(self, conn):
        (run_id,) = await backlog(conn, 1)
        rows = await claim(conn, tenants=[None])
        assert [(r["run_id"], r["tenant_id"]) for r in rows] == [(run_id, "default")]

    async def test_each_scope_keeps_its_order_priority_then_run_after_then_created(self, conn):
        low = await enqueue(conn, deployment_ref="a", priority=0, now=T0)
        high = await enqueue(conn, deployment_ref="a", priority=5, now=at(2))
        early = await enqueue(conn, deployment_ref="a", priority=0, run_after=at(-5), now=at(1))
        rows = await claim(conn, batch_size=10, now=at(3))
        assert [r["run_id"] for r in rows] == [high, early, low]

    async def test_runs_not_due_or_leased_are_left_and_an_empty_call_returns_no_row(self, conn):
        later = await enqueue(conn, deployment_ref="a", run_after=at(100))
        assert await claim(conn, batch_size=10, now=at(1)) == []
        assert (await run_row(conn, later))["status"] == "pending"
        assert await claim(conn, ("nothing-here",), batch_size=10) == []

    async def test_a_batch_is_filled_from_every_backlogged_scope(self, conn):
        for tenant in ("t1", "t2", "t3"):
            await backlog(conn, 20, tenant=tenant)
        served = per_tenant(await claim(conn, batch_size=30))
        assert sum(served.values()) == 30
        assert set(served) <= {"t1", "t2", "t3"}

    async def test_what_a_small_scope_cannot_use_goes_to_the_others(self, conn):
        await backlog(conn, 1, tenant="small")
        await backlog(conn, 20, tenant="big")
        served = per_tenant(await claim(conn, batch_size=10))
        assert sum(served.values()) == 10
        assert served["small"] <= 1

    async def test_max_concurrency_is_per_scope_and_saturation_is_reported_per_scope(self, conn):
        for tenant in ("t1", "t2"):
            await backlog(conn, 5, tenant=tenant)
        first = await claim(conn, max_concurrency=2, batch_size=10, now=at(1))
        assert per_tenant(first) == {"t1": 2, "t2": 2}

        again = await claim(conn, max_concurrency=2, batch_size=10, now=at(2))
        assert per_tenant(again) == {}
        assert sorted((r["tenant_id"], r["concurrency_saturated"], r["active_count"],
                       r["concurrency_limit"]) for r in again) == [
            ("t1", True, 2, 2), ("t2", True, 2, 2)]

        # The leases expire: their slots are free again (exact slots, as in claim_and_start).
        later = await claim(conn, max_concurrency=2, batch_size=10, now=at(2 + LEASE))
        assert per_tenant(later) == {"t1": 2, "t2": 2}

    async def test_scope_limits_max_concurrency_replaces_the_argument(self, conn):
        for tenant in ("capped", "free"):
            await backlog(conn, 5, tenant=tenant)
        await set_limit(conn, "capped", max_concurrency=1)
        assert per_tenant(await claim(conn, batch_size=10)) == {"capped": 1, "free": 5}

    async def test_a_paused_scope_is_skipped_until_it_is_resumed(self, conn):
        paused = await backlog(conn, 3, tenant="paused")
        await backlog(conn, 3, tenant="busy")
        await set_limit(conn, "paused", paused=True)

        assert per_tenant(await claim(conn, batch_size=10, now=at(1))) == {"busy": 3}
        for run_id in paused:
            stored = await run_row(conn, run_id, tenant_id="paused")
            assert (stored["status"], stored["lease_worker_id"]) == ("pending", None)

        await set_limit(conn, "paused", paused=False)
        assert per_tenant(await claim(conn, batch_size=10, now=at(2))) == {"paused": 3}

    async def test_an_expired_running_run_is_left_to_claim_orphaned(self, conn):
        (run_id,) = await backlog(conn, 1, tenant="t1")
        (row,) = await claim(conn, now=at(1))
        assert row["lease_generation"] == 1
        # Its lease expired while running: an orphan, recovered by claim_orphaned, not here.
        assert await claim(conn, now=at(1 + LEASE + 1)) == []
        assert (await run_row(conn, run_id, tenant_id="t1"))["lease_generation"] == 1


class TestFairnessOverManyClaims:
    """Batches of one: which scope is served is drawn with probability weight / total."""

    async def _shares(self, conn: asyncpg.Connection, claims: int) -> collections.Counter[str]:
        served: collections.Counter[str] = collections.Counter()
        for i in range(claims):
            served.update(per_tenant(await claim(conn, now=at(i * 0.001))))
        return served

    async def test_equal_weights_serve_two_backlogged_scopes_about_equally(self, conn):
        for tenant in ("t1", "t2"):
            await backlog(conn, 400, tenant=tenant)
        served = await self._shares(conn, 400)
        # Binomial(400, 1/2): sd 10, so 140..260 is 6 sd either side.
        assert sum(served.values()) == 400
        assert 140 <= served["t1"] <= 260

    async def test_weight_three_to_one_serves_about_three_to_one(self, conn):
        for tenant in ("heavy", "light"):
            await backlog(conn, 400, tenant=tenant)
        await set_limit(conn, "heavy", weight=3)
        served = await self._shares(conn, 400)
        # Binomial(400, 3/4): mean 300, sd 8.7; 6 sd is 248..352.
        assert 248 <= served["heavy"] <= 352

    async def test_weights_hold_for_batches_too(self, conn):
        """Rounding each scope's share up gave the first scope of the order more than its
        weight whenever the batch was small (0.80 instead of 0.75 under a worker with 8 slots,
        bench fleet); the places of a batch are drawn one by one now."""
        for tenant in ("heavy", "light"):
            await backlog(conn, 500, tenant=tenant)
        await set_limit(conn, "heavy", weight=3)
        served: collections.Counter[str] = collections.Counter()
        for i in range(200):
            served.update(per_tenant(await claim(conn, batch_size=2, now=at(i * 0.001))))
        # 400 places, Binomial(400, 3/4) per place drawn: sd 8.7, 6 sd either side.
        assert sum(served.values()) == 400
        assert 248 <= served["heavy"] <= 352


class TestBadInput:
    @pytest.mark.parametrize(("changes", "message"), [
        ({"deployments": None}, "deployment_refs must be"),
        ({"deployments": []}, "deployment_refs must be"),
        ({"deployments": ["a", None]}, "every deployment_ref"),
        ({"deployments": ["a", ""]}, "every deployment_ref"),
        ({"deployments": [f"d{i}" for i in range(101)]}, "deployment_refs must be"),
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": None}, "worker_id"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1001}, "batch_size"),
        ({"batch_size": None}, "batch_size"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"workspaces": ["w"]}, "workspace_ids needs tenant_ids"),
        ({"tenants": ["t1", "t2"], "workspaces": ["w"]}, "as long as tenant_ids"),
        ({"tenants": []}, "tenant_ids must be"),
        ({"tenants": ["x" * 201]}, "every tenant_id"),
        ({"tenants": [""]}, "every tenant_id"),
        ({"tenants": ["t"], "workspaces": ["w" * 201]}, "every workspace_id"),
        ({"tenants": [f"t{i}" for i in range(10001)]}, "at most 10000"),
    ])
    async def test_zp008_and_nothing_changed(self, conn, changes, message):
        await backlog(conn, 2)
        before = await table_state(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim(conn, **changes)
        assert caught.value.sqlstate == "ZP008"
        assert message in str(caught.value)
        assert await table_state(conn) == before

    @pytest.mark.parametrize("call", [
        "deployment_refs => ARRAY[ARRAY['a'], ARRAY['b']], worker_id => 'w'",
        "deployment_refs => ARRAY['a'], worker_id => 'w', "
        "tenant_ids => ARRAY[ARRAY['t'], ARRAY['u']]",
        "deployment_refs => ARRAY['a'], worker_id => 'w', tenant_ids => ARRAY['t', 'u'], "
        "workspace_ids => ARRAY[ARRAY['v'], ARRAY['w']]",
    ])
    async def test_two_dimensional_arrays_are_refused(self, conn, call):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetch(f"SELECT * FROM zeroth.claim_and_start_scopes({call})")
        assert caught.value.sqlstate == "ZP008"

    async def test_too_many_names_are_refused_before_the_registry_is_read(self, conn):
        """The registry lookups (a lease and a version policy per name) come after the names are
        bounded: 10,000 copies of a registered name are one ZP008, not 20,000 probes of
        zeroth.deployments first (a million took 25 s of CPU before the refusal)."""
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'a', "
                           "lease_seconds => 321)")
        await conn.execute("SELECT zeroth.set_version_policy('a', 'same')")
        scans = """SELECT sum(pg_stat_get_xact_numscans(c.oid)) FROM pg_class c
                    WHERE c.oid = 'zeroth.deployments'::regclass
                       OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                                     WHERE i.indrelid = 'zeroth.deployments'::regclass)"""
        before = await conn.fetchval(scans)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetch("SELECT * FROM zeroth.claim_and_start_scopes("
                                 "deployment_refs => array_fill('a'::text, ARRAY[10000]), "
                                 "worker_id => 'w', code_version => 'v1')")
        assert caught.value.sqlstate == "ZP008"
        assert "deployment_refs must be" in str(caught.value)
        assert await conn.fetchval(scans) - before == 0

    async def test_a_workspace_without_a_tenant_is_zp006(self, conn):
        await backlog(conn, 1)
        before = await table_state(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim(conn, tenants=["t1", None], workspaces=[None, "w"])
        assert caught.value.sqlstate == "ZP006"
        assert await table_state(conn) == before
