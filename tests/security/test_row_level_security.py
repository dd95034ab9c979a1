"""Row-level security for zeroth_reader: the runs, checkpoints and scope limits of the tenant
named in the setting zeroth.tenant_id, directly and through every view over them; nothing when
it is unset. The SECURITY DEFINER functions (run as the table owner) stay unaffected.

Everything runs in the ``conn`` fixture's transaction, with SET LOCAL ROLE for the reader.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

import asyncpg
import pytest
from helpers import make_run


@pytest.fixture
def conn(clock_conn):
    """make_run places runs on the test clock."""
    return clock_conn


@pytest.fixture
def database_dsn(clock_database_dsn):
    """make_run places runs on the test clock."""
    return clock_database_dsn


PAST = datetime(2020, 1, 1, tzinfo=UTC)  # leases taken then have expired by now

TENANT_TABLES = ("zeroth.runs", "zeroth.checkpoints", "zeroth.scope_limits", "zeroth.run_steps",
                 "zeroth.event_waits", "zeroth.events", "zeroth.run_attempts")
TENANT_VIEWS = ("zeroth.queue_depth", "zeroth.dead_letters", "zeroth.live_leases",
                "zeroth.expired_leases", "zeroth.scope_overview", "zeroth.run_list",
                "zeroth.run_activity", "zeroth.checkpoint_list", "zeroth.step_list",
                "zeroth.wait_list", "zeroth.attempt_history")


async def seed_tenant(conn: asyncpg.Connection, tenant: str) -> None:
    """One row for every view: pending, live lease with a checkpoint and a step, a run waiting on
    an event, expired lease, dead letter (finished in 2030: inside run_activity's last hour)."""
    await make_run(conn, "pending", tenant_id=tenant)
    live = await make_run(conn, "running", tenant_id=tenant)  # leased until 2030
    assert await conn.fetchval(
        """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
               data => '{}', tenant_id => $4, now_override => '2030-01-01')""",
        live.run_id, live.worker_id, live.generation, tenant)
    assert await conn.fetchval(
        """SELECT s.recorded FROM zeroth_test.record_step(run_id => $1, worker_id => $2,
               generation => $3, step_key => 'one', result => '1', tenant_id => $4,
               now_override => '2030-01-01') s""",
        live.run_id, live.worker_id, live.generation, tenant)
    waiter = await make_run(conn, "running", tenant_id=tenant)
    assert await conn.fetchval(
        """SELECT w.outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
               generation => $3, step_key => 'hook', name => 'approved', tenant_id => $4,
               now_override => '2030-01-01') w""",
        waiter.run_id, waiter.worker_id, waiter.generation, tenant) == "waiting"
    dead = await make_run(conn, "running", tenant_id=tenant, max_attempts=1)
    assert await conn.fetchval(
        """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
               error => '{}', retryable => true, tenant_id => $4, now_override => '2030-01-01')""",
        dead.run_id, dead.worker_id, dead.generation, tenant) == "dead_lettered"
    # Last: a later make_run's batch claim would take this expired claim over.
    await make_run(conn, "claimed", tenant_id=tenant, now=PAST)
    await conn.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, weight) "
                       "VALUES ($1, 'any', 2)", tenant)


async def tenants_seen(conn: asyncpg.Connection, relation: str) -> list[str]:
    return [row[0] for row in await conn.fetch(f"SELECT tenant_id FROM {relation}")]


@pytest.fixture
async def two_tenants(conn):
    """Tenants A and B seeded by the superuser; the session then becomes zeroth_reader."""
    a, b = f"tenant-a-{secrets.token_hex(3)}", f"tenant-b-{secrets.token_hex(3)}"
    await seed_tenant(conn, a)
    await seed_tenant(conn, b)
    await conn.execute("SET LOCAL ROLE zeroth_reader")
    return a, b


async def use_tenant(conn: asyncpg.Connection, tenant: str | None) -> None:
    await conn.execute("SELECT set_config('zeroth.tenant_id', $1, true)", tenant or "")


class TestReaderSeesOneTenant:
    @pytest.mark.parametrize("relation", [*TENANT_TABLES, *TENANT_VIEWS])
    async def test_each_tenant_sees_only_its_own_rows(self, conn, two_tenants, relation):
        for tenant in two_tenants:
            await use_tenant(conn, tenant)
            seen = await tenants_seen(conn, relation)
            assert seen, f"{relation}: {tenant} sees none of its own rows"
            assert set(seen) == {tenant}

    @pytest.mark.parametrize("relation", [*TENANT_TABLES, *TENANT_VIEWS])
    async def test_no_tenant_set_sees_nothing(self, conn, two_tenants, relation):
        # Unset: NULL in a session that never set it, '' in one that set and reset it (the
        # kept test connection, zeroth_pg.testing, carries the placeholder from earlier tests).
        assert await conn.fetchval("SELECT current_setting('zeroth.tenant_id', true)") in (None, "")
        assert await tenants_seen(conn, relation) == []
        await use_tenant(conn, two_tenants[0])
        await use_tenant(conn, None)  # reset to '' within the session: still nothing
        assert await tenants_seen(conn, relation) == []

    async def test_a_filter_on_the_other_tenant_finds_nothing(self, conn, two_tenants):
        a, b = two_tenants
        await use_tenant(conn, a)
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs r WHERE r.tenant_id = $1",
                                   b) == 0

    async def test_table_health_is_readable_without_a_tenant(self, conn, two_tenants):
        tables = {row[0] for row in await conn.fetch("SELECT table_name FROM zeroth.table_health")}
        assert "runs" in tables


class TestReaderCannotWrite:
    @pytest.mark.parametrize("statement", [
        "UPDATE zeroth.runs SET priority = 1",
        "DELETE FROM zeroth.checkpoints",
        "SELECT zeroth.current_generation(run_id => gen_random_uuid())",
        "SELECT count(*) FROM zeroth.admission_slots",
        "UPDATE zeroth.run_attempts SET outcome = 'completed', ended_at = now()",
        "DELETE FROM zeroth.run_attempts",
        "INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, "
        "lease_generation, worker_id) VALUES ('x', '', gen_random_uuid(), 1, 1, 'w')",
        "UPDATE zeroth.run_attempt_log SET outcome = 'completed', ended_at = now()",
        "DELETE FROM zeroth.run_attempt_log",
        "INSERT INTO zeroth.run_attempt_log (tenant_id, workspace_key, run_id, attempt, "
        "lease_generation, worker_id) VALUES ('x', '', gen_random_uuid(), 1, 1, 'w')",
        "UPDATE zeroth.runs SET completed_worker_id = 'evil'",
    ])
    async def test_refused(self, conn, two_tenants, statement):
        await use_tenant(conn, two_tenants[0])
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.execute(statement)
        # zeroth.run_attempts is a view of a UNION (migration 0022): no role can write it.
        view = re.search(r"zeroth\.run_attempts\b", statement) is not None
        assert caught.value.sqlstate == ("55000" if view else "42501")


class TestFunctionsBypassTheReaderPolicy:
    async def test_a_worker_with_another_tenant_setting_still_reaches_the_run(self, conn):
        run = await make_run(conn, "running", tenant_id="tenant-fn")
        await conn.execute("SET LOCAL ROLE zeroth_worker")
        await use_tenant(conn, "someone-else")
        assert await conn.fetchval(
            "SELECT zeroth.current_generation(run_id => $1, tenant_id => 'tenant-fn')",
            run.run_id) == run.generation
