"""Code versions (issue 34, item 3) on the dashboard, over HTTP against a real database: the run
page shows the version that started the run (or that it is unversioned, or not started), the
scope page shows the deployment's version policy and the scope's runs pinned to a version,
waiting for a worker of it; a zeroth_reader sees only its tenant's."""

from __future__ import annotations

import asyncpg
from helpers import dashboard
from roles import dsn_as, login_role

from zeroth_pg.web import create_app


async def _fleet(conn: asyncpg.Connection) -> dict[str, object]:
    """'mail' under policy compatible {v1, v2}: one run started by v1 and handed back (pending,
    pinned), one never started; 'mail' in tenant 'initech' has one pinned run too."""
    await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail')")
    await conn.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => 'mail', "
                       "version_policy => 'compatible', compatible_versions => ARRAY['v2', 'v1'])")
    runs: dict[str, object] = {}
    for tenant in ("acme", "initech"):
        run_id = await conn.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => "
                                     "'mail', tenant_id => $1)", tenant)
        row = await conn.fetchrow(
            "SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => "
            "'mail', worker_id => 'w1', tenant_id => $1, code_version => 'v1')", tenant)
        assert row["run_id"] == run_id
        assert await conn.fetchval(
            "SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'w1', "
            "generation => $2, tenant_id => $3)", run_id, row["lease_generation"], tenant)
        runs[tenant] = run_id
    runs["fresh"] = await conn.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => "
                                        "'mail', tenant_id => 'acme')")
    return runs


class TestCodeVersionsOnTheDashboard:
    async def test_run_page_and_scope_page_show_versions_and_the_policy(self, database_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            runs = await _fleet(conn)
        finally:
            await conn.close()
        with dashboard(create_app(database_dsn)) as client:
            pinned = client.get(f"/runs/{runs['acme']}").text
            fresh = client.get(f"/runs/{runs['fresh']}").text
            scope = client.get("/deployments/scope?deployment=mail&tenant=acme").text
            other = client.get("/deployments/scope?deployment=other&tenant=acme").text
        assert '<dd id="code-version"><span class="mono">v1</span></dd>' in pinned
        assert '<dd id="code-version"><span class="muted">not started</span></dd>' in fresh
        policy = scope[scope.index('id="version-policy"'):]
        assert "compatible" in policy
        assert '<span class="mono">v1, v2</span>' in policy
        table = scope[scope.index('id="pinned-runs"'):]
        assert '<td class="mono">v1</td><td class="n">1</td>' in table
        assert "retire_code_version" in scope
        assert 'id="pinned-runs"' not in other
        assert "any <span" in other[other.index('id="version-policy"'):]

    async def test_a_tenant_reader_sees_only_its_tenants_pinned_runs(self, database_dsn,
                                                                     pg_server_dsn):
        conn = await asyncpg.connect(database_dsn)
        try:
            await _fleet(conn)
            with login_role(pg_server_dsn, "zeroth_reader") as (name, password):
                await conn.execute(f"ALTER ROLE {name} SET zeroth.tenant_id = 'initech'")
                with dashboard(create_app(dsn_as(database_dsn, name, password))) as client:
                    own = client.get("/deployments/scope?deployment=mail&tenant=initech").text
                    foreign = client.get("/deployments/scope?deployment=mail&tenant=acme").text
        finally:
            await conn.close()
        assert 'id="pinned-runs"' in own
        assert 'id="pinned-runs"' not in foreign
