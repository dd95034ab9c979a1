"""What each role can do, read and trigger, found by calling every public function and reading
every relation as a real LOGIN role (not by reading ACLs, which tests/security does).

* a role with no grant: nothing in the schema (it can still LISTEN and NOTIFY: see
  test_notifications.py);
* a zeroth_worker member: exactly the worker functions; no table, no view, no admin function;
* a zeroth_reader member: the views and the run tables, one tenant at a time (the tenant it
  names), and no function at all.
"""

from __future__ import annotations

import asyncpg
import pytest
from catalog import CATALOG_SQL, function_from_row
from roles import readme_grants


async def outcome(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def call_every_function(admin: asyncpg.Connection, session: asyncpg.Connection
                              ) -> dict[str, str]:
    """Each public function called with NULL for every argument: the permission check comes
    first, so 42501 means the role may not run it; anything else means it may."""
    functions = [function_from_row(row) for row in await admin.fetch(CATALOG_SQL)]
    assert len(functions) >= 30
    results = {}
    for function in functions:
        required = [p for p in function.parameters if not p.has_default]
        args = ", ".join(f"{p.name} => NULL::{p.type}" for p in required)
        results[function.name] = await outcome(
            session, f"SELECT * FROM zeroth.{function.name}({args})")
    return results


RELATIONS = ("runs", "checkpoints", "admission_slots", "notification_secret", "thread_locks",
             "code_version", "scope_limits", "schedules", "schedule_fires",
             "rate_limits", "rate_limit_starts", "run_steps", "events", "event_waits",
             "child_runs", "child_waits", "run_attempts", "run_attempt_log", "run_events",
             "alembic_version",
             "queue_depth", "dead_letters",
             "live_leases", "expired_leases", "table_health", "scope_overview", "run_list",
             "run_activity", "checkpoint_list", "step_list", "wait_list", "attempt_history",
             "child_list", "deployments", "deployment_changes", "run_transitions",
             "code_versions", "code_version_changes", "pinned_runs")


async def test_the_relations_tried_here_are_every_relation_of_the_schema(admin):
    names = {row["relname"] for row in await admin.fetch(
        """SELECT c.relname FROM pg_class c
            WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p')""")}
    assert names == set(RELATIONS)


async def seed(admin: asyncpg.Connection) -> None:
    for tenant in ("acme", "globex"):
        await admin.execute(
            "SELECT zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1)", tenant)


class TestNoGrant:
    async def test_can_run_no_function(self, login, admin):
        results = await call_every_function(admin, await login("nobody"))
        assert {name: state for name, state in results.items() if state != "42501"} == {}

    async def test_can_read_no_relation(self, login, admin):
        await seed(admin)
        nobody = await login("nobody")
        for relation in RELATIONS:
            assert await outcome(nobody, f"SELECT * FROM zeroth.{relation}") == "42501", relation


class TestWorker:
    async def test_can_run_exactly_the_worker_functions(self, login, admin):
        results = await call_every_function(admin, await login("worker"))
        runnable = {name for name, state in results.items() if state != "42501"}
        assert runnable == readme_grants("zeroth_worker")
        assert {name for name, state in results.items() if state == "42501"} == readme_grants(
            "admin only")

    async def test_can_read_and_write_no_relation(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        for relation in RELATIONS:
            assert await outcome(worker, f"SELECT * FROM zeroth.{relation}") == "42501", relation
        for statement in ("UPDATE zeroth.runs SET lease_expires_at = now()",
                          "DELETE FROM zeroth.admission_slots",
                          "UPDATE zeroth.notification_secret SET secret = repeat('x', 64)"):
            assert await outcome(worker, statement) == "42501", statement


class TestReader:
    async def test_can_run_no_function(self, login, admin):
        results = await call_every_function(admin, await login("reader"))
        assert {name: state for name, state in results.items() if state != "42501"} == {}

    async def test_reads_one_named_tenant_and_nothing_without_one(self, login, admin):
        await seed(admin)
        reader = await login("reader")
        assert await reader.fetchval("SELECT count(*) FROM zeroth.runs") == 0
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        assert [r["tenant_id"] for r in await reader.fetch(
            "SELECT tenant_id FROM zeroth.queue_depth")] == ["acme"]
        assert await reader.fetchval("SELECT count(*) FROM zeroth.runs") == 1
        # Steps, event waits and events (0015: the dashboard's run page): its tenant's only.
        for relation in ("run_steps", "event_waits", "events", "step_list", "wait_list",
                         "child_runs", "child_list", "run_events", "run_attempts",
                         "run_attempt_log", "attempt_history"):
            assert await reader.fetchval(
                f"SELECT count(*) FROM zeroth.{relation} WHERE tenant_id <> 'acme'") == 0

    @pytest.mark.parametrize("relation", ["admission_slots", "notification_secret",
                                          "thread_locks", "code_version", "rate_limit_starts",
                                          "child_waits"])
    async def test_cannot_read_the_slots_the_secret_or_the_locks(self, login, relation):
        reader = await login("reader")
        assert await outcome(reader, f"SELECT * FROM zeroth.{relation}") == "42501"
