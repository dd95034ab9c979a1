"""The dashboard's views, and the tables under them, show a reader its own tenant's rows only.

A reader naming one tenant sees that tenant's rows (wait_list does not join another tenant's
event of the same name); a reader naming no tenant sees nothing; a worker and a role with no
grant read no view; a reader cannot write through a view or a table.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from test_child_run_attacks import COMPLETE, held, snapshot

#: The dashboard's views and the tables they read, which a reader may select from.
VIEWS = ("scope_overview", "run_list", "run_activity", "checkpoint_list", "step_list", "wait_list",
         "attempt_history", "queue_depth", "live_leases", "expired_leases", "dead_letters",
         "child_list")

READER_TABLES = ("runs", "checkpoints", "run_steps", "events", "event_waits", "run_attempts",
                 "child_runs")


async def two_tenants(admin, worker) -> dict[str, Any]:
    """In acme and globex each: a running run with a checkpoint, a step and an event wait on
    the event 'e', a completed run, a dead-lettered run; 'e' is emitted in globex only."""
    made: dict[str, Any] = {}
    for tenant in ("acme", "globex"):
        run_id, generation = await held(admin, worker, tenant)
        await worker.fetchval("SELECT zeroth.save_checkpoint(run_id => $1, worker_id => 'w1', "
                              "generation => $2, data => '{}', tenant_id => $3)",
                              run_id, generation, tenant)
        await worker.fetch("SELECT * FROM zeroth.record_step(run_id => $1, worker_id => 'w1', "
                           "generation => $2, step_key => 's', result => '1', tenant_id => $3)",
                           run_id, generation, tenant)
        done, gen2 = await held(admin, worker, tenant)
        assert await worker.fetchval(COMPLETE, done, "w1", gen2, tenant) is True
        waiter, gen3 = await held(admin, worker, tenant)
        row = await worker.fetchrow(
            "SELECT * FROM zeroth.wait_for_event(run_id => $1, worker_id => 'w1', "
            "generation => $2, step_key => 'ev', name => 'e', tenant_id => $3)",
            waiter, gen3, tenant)
        assert row["outcome"] == "waiting"
        made[tenant] = (run_id, done, waiter)
    # Emitting in globex wakes globex's waiter; acme's wait stays open with no event.
    await admin.fetch("SELECT * FROM zeroth.emit_event(name => 'e', tenant_id => 'globex')")
    return made


class TestViews:
    async def test_a_reader_naming_a_tenant_sees_only_its_rows(self, login, admin):
        worker = await login("worker")
        made = await two_tenants(admin, worker)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        for relation in VIEWS + READER_TABLES:
            rows = await reader.fetch(f"SELECT tenant_id FROM zeroth.{relation}")
            assert {r["tenant_id"] for r in rows} <= {"acme"}, relation
        for relation in ("run_list", "checkpoint_list", "step_list", "wait_list",
                         "attempt_history", "scope_overview"):
            assert await reader.fetch(f"SELECT 1 FROM zeroth.{relation}"), relation
        # acme's wait does not see globex's event of the same name.
        (wait,) = await reader.fetch("SELECT run_id, emitted_at FROM zeroth.wait_list")
        assert wait["run_id"] == made["acme"][2]
        assert wait["emitted_at"] is None
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.fetch("SELECT * FROM zeroth.child_waits")

    async def test_a_reader_without_a_tenant_sees_nothing(self, login, admin):
        worker = await login("worker")
        await two_tenants(admin, worker)
        reader = await login("reader")
        for relation in VIEWS + READER_TABLES:
            assert await reader.fetch(f"SELECT * FROM zeroth.{relation}") == [], relation

    @pytest.mark.parametrize("kind", ["nobody", "worker"])
    async def test_a_worker_or_a_role_with_no_grant_reads_no_view(self, login, admin, kind):
        worker = await login("worker")
        await two_tenants(admin, worker)
        hostile = await login(kind)
        await hostile.execute("SET zeroth.tenant_id = 'acme'")
        for relation in VIEWS + READER_TABLES + ("child_waits",):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.fetch(f"SELECT * FROM zeroth.{relation}")

    async def test_a_reader_cannot_write_through_a_view_or_table(self, login, admin):
        worker = await login("worker")
        made = await two_tenants(admin, worker)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        before = await snapshot(admin)
        for statement in ("UPDATE zeroth.run_list SET status = 'completed'",
                          "DELETE FROM zeroth.wait_list",
                          "DELETE FROM zeroth.run_steps",
                          "UPDATE zeroth.events SET payload = '1'",
                          "DELETE FROM zeroth.event_waits"):
            with pytest.raises(asyncpg.PostgresError) as err:
                await reader.execute(statement)
            # 42501, or 55000 for a view PostgreSQL cannot write through at all.
            assert err.value.sqlstate in ("42501", "55000"), statement
        assert await snapshot(admin) == before
        assert made
