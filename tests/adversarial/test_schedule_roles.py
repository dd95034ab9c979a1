"""Schedules against the roles the product keeps out, on a database exactly as shipped (no test
clock):

* a zeroth_worker may register and fire schedules and list its scope's, nothing more: it cannot
  create, alter, pause, resume or delete a DBA's schedule, nor read or write the tables; its
  registration never undoes a DBA's pause or edit; firing one scope never fires another's;
* a zeroth_reader sees its named tenant's schedules and fires only, and runs no function;
* a role with no grant can do none of it;
* a DBA's manual UPDATE of next_fire_at backwards never makes a second run of a fire time.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

ADMIN_CALLS = (
    "SELECT zeroth.create_schedule(name => 'x', deployment_ref => 'd', cron => '* * * * *')",
    "SELECT zeroth.alter_schedule(name => 's', tenant_id => 'acme', cron => '* * * * *')",
    "SELECT zeroth.pause_schedule(name => 's', tenant_id => 'acme')",
    "SELECT zeroth.resume_schedule(name => 's', tenant_id => 'acme')",
    "SELECT zeroth.delete_schedule(name => 's', tenant_id => 'acme')",
)
WORKER_CALLS = (
    "SELECT zeroth.register_schedule(name => 'y', deployment_ref => 'd', cron => '* * * * *')",
    "SELECT zeroth.fire_due_schedules(deployment_refs => '{d}')",
    "SELECT zeroth.list_schedules(tenant_id => 'acme')",
)
TABLE_STATEMENTS = (
    "SELECT * FROM zeroth.schedules",
    "SELECT * FROM zeroth.schedule_fires",
    "UPDATE zeroth.schedules SET paused = false",
    "UPDATE zeroth.schedules SET next_fire_at = now() - interval '1 day'",
    "DELETE FROM zeroth.schedule_fires",
    "INSERT INTO zeroth.schedule_fires (schedule_id, fire_at, tenant_id, run_id, fired_at) "
    "VALUES (gen_random_uuid(), now(), 'acme', gen_random_uuid(), now())",
)


async def outcome(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def seed(admin: asyncpg.Connection) -> None:
    for tenant in ("acme", "globex"):
        await admin.execute(
            "SELECT zeroth.create_schedule(name => 's', deployment_ref => 'd', tenant_id => $1, "
            "interval_seconds => 1, missed_fire_policy => 'catch_up', catch_up_limit => 5)",
            tenant)
    await admin.execute("SELECT zeroth.pause_schedule(name => 's', tenant_id => 'globex')")


class TestNoGrant:
    @pytest.mark.parametrize("statement", [*ADMIN_CALLS, *WORKER_CALLS, *TABLE_STATEMENTS])
    async def test_can_do_nothing(self, login, admin, statement):
        await seed(admin)
        nobody = await login("nobody")
        assert await outcome(nobody, statement) == "42501"


class TestWorker:
    @pytest.mark.parametrize("statement", [*ADMIN_CALLS, *TABLE_STATEMENTS])
    async def test_cannot_manage_a_dbas_schedules_or_touch_the_tables(self, login, admin,
                                                                    statement):
        await seed(admin)
        worker = await login("worker")
        assert await outcome(worker, statement) == "42501"
        rows = await admin.fetch("SELECT tenant_id, paused FROM zeroth.schedules ORDER BY 1")
        assert [tuple(r) for r in rows] == [("acme", False), ("globex", True)]

    async def test_its_registration_cannot_undo_a_dbas_pause_or_edit(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        outcome_ = await worker.fetchval(
            "SELECT outcome FROM zeroth.register_schedule(name => 's', deployment_ref => 'd', "
            "tenant_id => 'globex', interval_seconds => 1)")
        assert outcome_ == "kept"
        row = await admin.fetchrow("SELECT paused, missed_fire_policy FROM zeroth.schedules "
                                   "WHERE tenant_id = 'globex'")
        assert tuple(row) == (True, "catch_up")

    async def test_firing_one_scope_fires_no_other(self, login, admin):
        await seed(admin)
        await admin.execute("SELECT zeroth.resume_schedule(name => 's', tenant_id => 'globex')")
        worker = await login("worker")
        await asyncio.sleep(1.2)
        rows = await worker.fetch("SELECT tenant_id FROM zeroth.fire_due_schedules("
                                  "deployment_refs => '{d}', tenant_ids => '{acme}')")
        assert {r["tenant_id"] for r in rows} == {"acme"}
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE tenant_id = 'globex'") == 0

    async def test_has_no_way_to_bring_its_own_clock(self, login, admin):
        worker = await login("worker")
        assert await admin.fetchval(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'zeroth_test'") == 0
        assert await outcome(worker, "SET zeroth_test.now = '2100-01-01'") == "ok"
        await seed(admin)
        rows = await worker.fetch(
            "SELECT fire_at FROM zeroth.fire_due_schedules(deployment_refs => '{d}')")
        # The setting is ignored: nothing of 2100 fired (at most the fire times that passed).
        assert all(r["fire_at"] is None or r["fire_at"].year < 2100 for r in rows)


class TestReader:
    async def test_sees_its_named_tenants_schedules_only_and_runs_nothing(self, login, admin):
        await seed(admin)
        reader = await login("reader")
        assert await reader.fetchval("SELECT count(*) FROM zeroth.schedules") == 0
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        rows = await reader.fetch("SELECT tenant_id FROM zeroth.schedules")
        assert [r["tenant_id"] for r in rows] == ["acme"]
        for statement in (*ADMIN_CALLS, *WORKER_CALLS, *TABLE_STATEMENTS[2:]):
            assert await outcome(reader, statement) == "42501", statement


class TestDbaManualUpdate:
    async def test_moving_next_fire_at_back_never_makes_a_second_run(self, admin):
        await seed(admin)
        await asyncio.sleep(2.2)
        await admin.fetch("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}')")
        before = await admin.fetchval("SELECT count(*) FROM zeroth.runs")
        assert before >= 2
        await admin.execute("UPDATE zeroth.schedules SET next_fire_at = anchor_at")
        rows = await admin.fetch(
            "SELECT fire_at, created FROM zeroth.fire_due_schedules(deployment_refs => '{d}')")
        keys = await admin.fetch("SELECT idempotency_key FROM zeroth.runs")
        assert len(keys) == len({k["idempotency_key"] for k in keys})
        # Only fire times that had not fired yet may have been added (the clock moved on).
        fired_before = await admin.fetchval(
            "SELECT count(*) FROM zeroth.schedule_fires WHERE fire_at <= (SELECT max(fire_at) "
            "FROM zeroth.schedule_fires) - interval '1 second'")
        assert fired_before <= len(keys)
        assert all(r["created"] in (None, True) for r in rows)
