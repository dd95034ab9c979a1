"""The bound on a run's events (issue 34) against the roles the product keeps out, on a database
exactly as shipped (no test clock):

* a zeroth_worker cannot raise the bound (no UPDATE on zeroth.deployments) nor go around it (no
  INSERT on zeroth.run_events): the live holder at the bound gets ZP014 and nothing is stored;
* a worker that is not the live holder (another worker id, another tenant, an older generation)
  learns nothing of the bound: NULL, as for any fenced append;
* a role with no grant and a zeroth_reader change neither the bound nor the stream (42501).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

DEPLOYMENT = "bounded"
ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2)"
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => $2, tenant_id => $3, lease_seconds => 600) WHERE run_id IS NOT NULL"""
APPEND = """SELECT zeroth.append_run_event(run_id => $1, worker_id => $2, generation => $3,
                name => 'token', data => '1', tenant_id => $4)"""


async def refused(conn: asyncpg.Connection, query: str, *args: Any) -> str | None:
    try:
        await conn.fetch(query, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


async def full_run(admin: asyncpg.Connection, worker: asyncpg.Connection,
                   tenant: str = "acme") -> tuple[Any, int]:
    """A run held by w1 whose stream holds the 100 events its deployment allows."""
    await admin.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await admin.execute("UPDATE zeroth.deployments SET max_run_events = 100 "
                        "WHERE deployment_ref = $1", DEPLOYMENT)
    run_id = await admin.fetchval(ENQUEUE, DEPLOYMENT, tenant)
    (row,) = await worker.fetch(CLAIM, DEPLOYMENT, "w1", tenant)
    for n in range(1, 101):
        assert await worker.fetchval(APPEND, run_id, "w1", row["lease_generation"], tenant) == n
    return run_id, row["lease_generation"]


async def count(admin: asyncpg.Connection, run_id: Any) -> int:
    return int(await admin.fetchval("SELECT count(*) FROM zeroth.run_events WHERE run_id = $1",
                                    run_id))


class TestTheLiveHolder:
    async def test_gets_zp014_at_the_bound_and_stores_nothing(self, login, admin):
        worker = await login("worker")
        run_id, generation = await full_run(admin, worker)

        assert await refused(worker, APPEND, run_id, "w1", generation, "acme") == "ZP014"
        assert await count(admin, run_id) == 100

    async def test_cannot_raise_the_bound_nor_insert_around_it(self, login, admin):
        worker = await login("worker")
        run_id, generation = await full_run(admin, worker)

        assert await refused(worker, "UPDATE zeroth.deployments SET max_run_events = 10000000 "
                             "WHERE deployment_ref = $1", DEPLOYMENT) == "42501"
        assert await refused(
            worker, """INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id,
                           kind, name, data, lease_generation, created_at)
                       VALUES ('acme', '', $1, 101, 'event', 'token', '1', $2, now())""",
            run_id, generation) == "42501"
        assert await refused(worker, APPEND, run_id, "w1", generation, "acme") == "ZP014"
        assert await count(admin, run_id) == 100
        assert await admin.fetchval("SELECT max_run_events FROM zeroth.deployments "
                                    "WHERE deployment_ref = $1", DEPLOYMENT) == 100


class TestNotTheLiveHolder:
    async def test_another_worker_tenant_or_generation_gets_null_at_the_bound(self, login,
                                                                              admin):
        victim = await login("worker")
        run_id, generation = await full_run(admin, victim)
        attacker = await login("worker")

        assert await attacker.fetchval(APPEND, run_id, "w2", generation, "acme") is None
        assert await attacker.fetchval(APPEND, run_id, "w1", generation, "globex") is None
        assert await attacker.fetchval(APPEND, run_id, "w1", generation - 1, "acme") is None
        assert await count(admin, run_id) == 100

    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_no_grant_and_reader_change_neither_bound_nor_stream(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation = await full_run(admin, worker)
        stranger = await login(kind)

        assert await refused(stranger, "UPDATE zeroth.deployments SET max_run_events = NULL "
                             "WHERE deployment_ref = $1", DEPLOYMENT) == "42501"
        assert await refused(stranger, APPEND, run_id, "w1", generation, "acme") == "42501"
        assert await count(admin, run_id) == 100
