"""The registry of deployments (zeroth.deployments, zeroth.deployment_changes) against the roles
the product keeps out, on a database exactly as shipped (no test hook):

* a zeroth_worker registers (the App runs as one) and lists, but cannot override a DBA's setting
  through register_deployment, call set_deployment_defaults, nor read, write or truncate the
  tables — so it can neither change defaults a DBA pinned nor erase or forge the audit log; what
  it registers is audited under its own login name, whatever SET ROLE it claims;
* a zeroth_reader reads both tables and changes nothing, and calls no function;
* a LOGIN role with no grant can do none of it;
* a DBA's manual UPDATE of the registry takes effect on the next enqueue.
"""

from __future__ import annotations

import asyncpg
import pytest

WRITES = (
    "UPDATE zeroth.deployments SET max_attempts = 1000",
    "DELETE FROM zeroth.deployments",
    "INSERT INTO zeroth.deployments (deployment_ref, max_attempts, priority, managed_by, "
    "created_at, updated_at, updated_by) VALUES ('x', 1, 0, 'sql', now(), now(), 'me')",
    "TRUNCATE zeroth.deployments",
    "DELETE FROM zeroth.deployment_changes",
    "UPDATE zeroth.deployment_changes SET changed_by = 'somebody else'",
    "INSERT INTO zeroth.deployment_changes (deployment_ref, version, changed_at, changed_by, via, "
    "new_values) VALUES ('mail', 99, now(), 'x', 'register_deployment', '{}')",
    "TRUNCATE zeroth.deployment_changes",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', max_attempts => 1000)",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', managed_by => 'app')",
    # The internal writer's signature since 0021 (with the two timeouts).
    "SELECT zeroth._change_deployment('mail', 1000, 0, NULL, NULL, NULL, NULL, NULL, NULL, "
    "'sql', 'set_deployment_defaults')",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', lease_seconds => 1)",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
    "unset => ARRAY['lease_seconds'])",
    "UPDATE zeroth.deployments SET lease_seconds = 1, retry_base_seconds = 0",
)
REGISTER = """SELECT outcome FROM zeroth.register_deployment(deployment_ref => 'mail',
    max_attempts => 1000, priority => 5)"""


async def sqlstate(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def state(admin: asyncpg.Connection) -> tuple[object, ...]:
    registry = await admin.fetch("SELECT deployment_ref, max_attempts, priority, managed_by, "
                                 "version, retry_base_seconds, retry_max_seconds, lease_seconds "
                                 "FROM zeroth.deployments ORDER BY 1")
    changes = await admin.fetch("SELECT change_id, changed_by, new_values::text "
                                "FROM zeroth.deployment_changes ORDER BY 1")
    return [tuple(r) for r in registry], [tuple(r) for r in changes]


async def pinned(admin: asyncpg.Connection) -> None:
    """'mail' registered by an application, then pinned by a DBA at 4 attempts."""
    await admin.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                        "max_attempts => 3)")
    await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                        "max_attempts => 4)")


class TestWorker:
    @pytest.mark.parametrize("statement", [*WRITES, "SELECT * FROM zeroth.deployments",
                                           "SELECT * FROM zeroth.deployment_changes"])
    async def test_cannot_read_the_tables_nor_change_a_dbas_defaults(self, login, admin,
                                                                      statement):
        await pinned(admin)
        worker = await login("worker")
        before = await state(admin)
        assert await sqlstate(worker, statement) == "42501"
        assert await state(admin) == before

    async def test_a_registration_keeps_what_a_dba_pinned(self, login, admin):
        await pinned(admin)
        worker = await login("worker")
        before = await state(admin)
        assert await worker.fetchval(REGISTER) == "kept"
        assert await state(admin) == before
        run_id = await worker.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'mail')")
        assert await admin.fetchval("SELECT max_attempts FROM zeroth.runs WHERE run_id = $1",
                                    run_id) == 4

    async def test_what_it_registers_is_audited_under_its_own_login(self, login, admin):
        worker = await login("worker")
        name = await worker.fetchval("SELECT session_user::text")
        await worker.execute("SET ROLE zeroth_worker")
        assert await worker.fetchval(REGISTER) == "created"
        row = await admin.fetchrow("SELECT changed_by, acting_role FROM zeroth.deployment_changes")
        assert (row["changed_by"], row["acting_role"]) == (name, "zeroth_worker")
        listed = await worker.fetch("SELECT deployment_ref, max_attempts "
                                    "FROM zeroth.list_deployments()")
        assert [tuple(r) for r in listed] == [("mail", 1000)]

    async def test_bad_input_is_refused_and_changes_nothing(self, login, admin):
        await pinned(admin)
        worker = await login("worker")
        before = await state(admin)
        for statement in (
                "SELECT zeroth.register_deployment(deployment_ref => '', max_attempts => 3)",
                "SELECT zeroth.register_deployment(deployment_ref => 'y', max_attempts => 0)",
                "SELECT zeroth.register_deployment(deployment_ref => repeat('y', 201))",
                "SELECT zeroth.register_deployment(deployment_ref => 'y', priority => NULL)"):
            assert await sqlstate(worker, statement) == "ZP008", statement
        assert await state(admin) == before


class TestReader:
    async def test_reads_every_row_and_changes_nothing(self, login, admin):
        await pinned(admin)
        reader = await login("reader")
        rows = await reader.fetch("SELECT deployment_ref, max_attempts FROM zeroth.deployments")
        assert [tuple(r) for r in rows] == [("mail", 4)]
        assert await reader.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == 2
        before = await state(admin)
        for statement in (*WRITES, REGISTER, "SELECT * FROM zeroth.list_deployments()"):
            assert await sqlstate(reader, statement) == "42501", statement
        assert await state(admin) == before


class TestNobody:
    @pytest.mark.parametrize("statement", [
        *WRITES, REGISTER, "SELECT * FROM zeroth.list_deployments()",
        "SELECT * FROM zeroth.deployments", "SELECT * FROM zeroth.deployment_changes"])
    async def test_can_do_nothing(self, login, admin, statement):
        await pinned(admin)
        nobody = await login("nobody")
        before = await state(admin)
        assert await sqlstate(nobody, statement) == "42501"
        assert await state(admin) == before


class TestDba:
    async def test_a_manual_update_takes_effect_on_the_next_enqueue(self, login, admin):
        await pinned(admin)
        await admin.execute("UPDATE zeroth.deployments SET max_attempts = 7, priority = 2 "
                            "WHERE deployment_ref = 'mail'")
        worker = await login("worker")
        run_id = await worker.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'mail')")
        row = await admin.fetchrow("SELECT max_attempts, priority FROM zeroth.runs "
                                   "WHERE run_id = $1", run_id)
        assert tuple(row) == (7, 2)
