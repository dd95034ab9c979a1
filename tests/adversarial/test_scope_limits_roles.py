"""Per-scope limits and the multi-scope claim against the roles the product keeps out, on a
database exactly as shipped (no test clock):

* a zeroth_worker cannot read or change zeroth.scope_limits, so it can neither lift a pause, nor
  raise a limit, nor give its own tenant more weight; a pause holds against its claims, single-
  and multi-scope alike, and pause, slots and rate hold against its admit-and-own admissions;
* a zeroth_reader sees the limits of the tenant it names and nothing else, and changes none;
* a role with no grant can do neither, nor claim.
"""

from __future__ import annotations

import asyncpg
import pytest

CLAIM_SCOPES = """SELECT run_id FROM zeroth.claim_and_start_scopes(
    deployment_refs => ARRAY['d'], worker_id => 'w', batch_size => 100)"""

WRITES = (
    "UPDATE zeroth.scope_limits SET paused = false",
    "DELETE FROM zeroth.scope_limits",
    "INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, weight) "
    "VALUES ('acme', 'd', 1000)",
    "TRUNCATE zeroth.scope_limits",
)


async def seed(admin: asyncpg.Connection) -> None:
    for tenant in ("acme", "globex"):
        for _ in range(3):
            await admin.execute(
                "SELECT zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1)", tenant)
    await admin.execute(
        "INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, paused) VALUES "
        "('acme', 'd', true), ('globex', 'd', false)")


async def sqlstate(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


class TestWorker:
    @pytest.mark.parametrize("statement", ["SELECT * FROM zeroth.scope_limits", *WRITES])
    async def test_cannot_read_or_change_the_limits(self, login, admin, statement):
        await seed(admin)
        worker = await login("worker")
        assert await sqlstate(worker, statement) == "42501"
        assert await admin.fetchval(
            "SELECT paused FROM zeroth.scope_limits WHERE tenant_id = 'acme'") is True

    async def test_a_pause_holds_against_every_claim_it_can_make(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        claimed = [r["run_id"] for r in await worker.fetch(CLAIM_SCOPES)]
        claimed += [r["run_id"] for r in await worker.fetch(
            "SELECT run_id FROM zeroth.claim_and_start(deployment_ref => 'd', worker_id => 'w', "
            "tenant_id => 'acme', batch_size => 100)") if r["run_id"]]
        claimed += [r["run_id"] for r in await worker.fetch(
            "SELECT run_id FROM zeroth.claim_and_start_scopes(deployment_refs => ARRAY['d'], "
            "worker_id => 'w', tenant_ids => ARRAY['acme'], batch_size => 100)")]
        tenants = await admin.fetch(
            "SELECT DISTINCT tenant_id FROM zeroth.runs WHERE run_id = ANY ($1::uuid[])", claimed)
        assert [r["tenant_id"] for r in tenants] == ["globex"]
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE tenant_id = 'acme' AND status = 'pending' "
            "AND lease_worker_id IS NULL") == 3


ADMIT_AND_OWN = """SELECT lease_generation, run_id FROM zeroth.admit_run(deployment_ref => 'd',
    thread_id => $1, worker_id => 'w', tenant_id => $2)"""


class TestAdmitAndOwn:
    async def test_a_worker_cannot_lease_past_a_pause_slots_or_rate_through_admit_run(
            self, login, admin):
        """admit_run with worker_id then start_run, ten times per scope as fast as it can: the
        paused scope starts nothing, the one-slot scope one run, the scope with 2 starts a
        minute two; the rest are admitted unleased, pending for ordinary claims."""
        await admin.execute("SELECT zeroth.set_rate_limit(name => 'adv-rate', max_starts => 2, "
                            "period_seconds => 60)")
        await admin.execute(
            "INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, paused, "
            "max_concurrency, rate_limit) VALUES ('paused', 'd', true, NULL, NULL), "
            "('capped', 'd', false, 1, NULL), ('rated', 'd', false, NULL, 'adv-rate')")
        worker = await login("worker")
        started = {}
        for tenant in ("paused", "capped", "rated"):
            started[tenant] = 0
            for i in range(10):
                row = await worker.fetchrow(ADMIT_AND_OWN, f"t-{i}", tenant)
                if row["lease_generation"] is not None and await worker.fetchval(
                        "SELECT zeroth.start_run(run_id => $1, worker_id => 'w', "
                        "generation => $2, tenant_id => $3)",
                        row["run_id"], row["lease_generation"], tenant):
                    started[tenant] += 1
        assert started == {"paused": 0, "capped": 1, "rated": 2}
        rows = await admin.fetch(
            """SELECT tenant_id, count(*) FILTER (WHERE status = 'running') AS running,
                      count(*) FILTER (WHERE status = 'pending' AND lease_worker_id IS NULL)
                          AS unleased
                 FROM zeroth.runs GROUP BY tenant_id ORDER BY tenant_id""")
        assert [tuple(r) for r in rows] == [("capped", 1, 9), ("paused", 0, 10), ("rated", 2, 8)]


class TestReader:
    async def test_sees_the_limits_of_its_named_tenant_only(self, login, admin):
        await seed(admin)
        reader = await login("reader")
        assert await reader.fetchval("SELECT count(*) FROM zeroth.scope_limits") == 0
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        rows = await reader.fetch("SELECT tenant_id, paused FROM zeroth.scope_limits")
        assert [tuple(r) for r in rows] == [("acme", True)]

    @pytest.mark.parametrize("statement", WRITES)
    async def test_changes_nothing(self, login, admin, statement):
        await seed(admin)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        assert await sqlstate(reader, statement) == "42501"

    async def test_cannot_claim(self, login, admin):
        await seed(admin)
        reader = await login("reader")
        assert await sqlstate(reader, CLAIM_SCOPES) == "42501"


class TestNoGrant:
    @pytest.mark.parametrize("statement", [CLAIM_SCOPES, "SELECT * FROM zeroth.scope_limits",
                                           *WRITES])
    async def test_can_do_nothing(self, login, admin, statement):
        await seed(admin)
        nobody = await login("nobody")
        assert await sqlstate(nobody, statement) == "42501"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs WHERE status = 'pending' "
                                    "AND lease_worker_id IS NULL") == 6


COUNT_SCOPES = """SELECT deployment_ref, pending FROM zeroth.count_pending_scopes(
    deployment_refs => ARRAY['d'])"""


class TestCountPendingScopes:
    """zeroth.count_pending_scopes (a fleet worker's queue-depth gauge): the worker role may
    count, and the count changes nothing and locks nothing; reader and no-grant roles may not
    call it (a reader reads the views of its own tenant instead)."""

    async def test_a_worker_counts_every_scope_and_changes_nothing(self, login, admin):
        await seed(admin)
        before = await admin.fetch("SELECT run_id, status, lease_generation, updated_at "
                                   "FROM zeroth.runs ORDER BY run_id")
        worker = await login("worker")
        async with worker.transaction():
            rows = await worker.fetch(COUNT_SCOPES)
            assert [tuple(r) for r in rows] == [("d", 6)]  # paused scopes are still pending
            locks = await worker.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                "AND locktype IN ('tuple', 'advisory', 'transactionid')")
        assert locks == 0
        assert await admin.fetch("SELECT run_id, status, lease_generation, updated_at "
                                 "FROM zeroth.runs ORDER BY run_id") == before

    @pytest.mark.parametrize("kind", ["reader", "nobody"])
    async def test_other_roles_cannot_call_it(self, login, admin, kind):
        await seed(admin)
        stranger = await login(kind)
        assert await sqlstate(stranger, COUNT_SCOPES) == "42501"
