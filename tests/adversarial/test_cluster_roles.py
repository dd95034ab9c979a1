"""The zeroth group roles span the cluster: two databases of one server, both migrated, as shipped.

zeroth_worker, zeroth_reader and zeroth_owner are cluster-wide roles, so a LOGIN member made for
one database is a member in every other database of the cluster too. With PostgreSQL's default
(PUBLIC holds CONNECT on every database) the worker made for db1 claims db2's payroll runs and the
reader made for db1 reads them (the hazard, documented in docs/security.md, "Three group roles");
after the documented recipe — ``REVOKE CONNECT ON DATABASE … FROM PUBLIC`` on each database and
``GRANT CONNECT`` to the roles that use it — neither can open a session on db2, and both still
work on db1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import asyncpg
import pytest
from roles import dsn_as, login_role

from zeroth_pg import migrate

CLAIM = """SELECT run_id FROM zeroth.claim_and_start(deployment_ref => 'pay', worker_id => 'w',
               tenant_id => 'payroll') WHERE run_id IS NOT NULL"""
ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'pay', tenant_id => 'payroll')"


@pytest.fixture
async def cluster(pg_server_dsn: str, database_dsn: str, empty_database_dsn: str
                  ) -> AsyncIterator[dict[str, Any]]:
    """db1 and db2 migrated on the test server, a superuser connection to each, and a worker and
    a reader LOGIN role "made for db1" (both dropped at the end)."""
    migrate.upgrade(empty_database_dsn)
    async with AsyncExitStack() as stack:
        admins = {}
        for label, dsn in (("db1", database_dsn), ("db2", empty_database_dsn)):
            admins[label] = await asyncpg.connect(dsn)
            stack.push_async_callback(admins[label].close)
        names = {label: await conn.fetchval("SELECT quote_ident(current_database())")
                 for label, conn in admins.items()}
        roles = {}
        for kind, group in (("worker", "zeroth_worker"), ("reader", "zeroth_reader")):
            roles[kind] = stack.enter_context(login_role(pg_server_dsn, group))
        dsns = {"db1": database_dsn, "db2": empty_database_dsn}

        async def connect_as(kind: str, label: str) -> asyncpg.Connection:
            name, password = roles[kind]
            conn = await asyncpg.connect(dsn_as(dsns[label], name, password))
            stack.push_async_callback(conn.close)
            return conn

        yield {"admin": admins, "name": names, "role": roles, "connect": connect_as}


async def apply_recipe(cluster: dict[str, Any]) -> None:
    """The documented recipe, on each database: only the roles granted CONNECT may connect."""
    admin, name, role = cluster["admin"], cluster["name"], cluster["role"]
    for label in ("db1", "db2"):
        await admin[label].execute(f"REVOKE CONNECT ON DATABASE {name[label]} FROM PUBLIC")
    for kind in ("worker", "reader"):
        await admin["db1"].execute(
            f'GRANT CONNECT ON DATABASE {name["db1"]} TO "{role[kind][0]}"')


async def connect_sqlstate(connect: Callable[..., Any], kind: str, label: str) -> str:
    try:
        await connect(kind, label)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


class TestWithoutTheRecipe:
    async def test_a_worker_made_for_db1_claims_db2s_runs(self, cluster):
        """The hazard the docs name: membership of zeroth_worker is not per database."""
        run_id = await cluster["admin"]["db2"].fetchval(ENQUEUE)
        worker = await cluster["connect"]("worker", "db2")
        assert [r["run_id"] for r in await worker.fetch(CLAIM)] == [run_id]

    async def test_a_reader_made_for_db1_reads_db2s_runs(self, cluster):
        run_id = await cluster["admin"]["db2"].fetchval(ENQUEUE)
        reader = await cluster["connect"]("reader", "db2")
        await reader.execute("SET zeroth.tenant_id = 'payroll'")
        assert await reader.fetchval("SELECT run_id FROM zeroth.runs") == run_id


class TestWithTheRecipe:
    @pytest.mark.parametrize("kind", ["worker", "reader"])
    async def test_a_role_granted_connect_on_db1_only_cannot_connect_to_db2(self, cluster, kind):
        run_id = await cluster["admin"]["db2"].fetchval(ENQUEUE)
        await apply_recipe(cluster)
        assert await connect_sqlstate(cluster["connect"], kind, "db2") == "42501"
        row = await cluster["admin"]["db2"].fetchrow(
            "SELECT status, lease_worker_id FROM zeroth.runs WHERE run_id = $1", run_id)
        assert tuple(row) == ("pending", None)

    async def test_the_worker_still_works_on_its_own_database(self, cluster):
        run_id = await cluster["admin"]["db1"].fetchval(ENQUEUE)
        await apply_recipe(cluster)
        worker = await cluster["connect"]("worker", "db1")
        assert [r["run_id"] for r in await worker.fetch(CLAIM)] == [run_id]
