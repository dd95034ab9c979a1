"""Code versions (issue 34, item 3) against the roles the product keeps out, on a database exactly
as shipped (no test hook):

* only a DBA sets a deployment's version policy (set_version_policy) or retires a version
  (retire_code_version): a zeroth_worker, a zeroth_reader and a LOGIN role with no grant can do
  neither, nor write the policy columns, runs.code_version_id, zeroth.code_versions or the
  audit log by hand;
* a zeroth_worker declares its code version through the claims only, bounded (ZP008 for a bad
  one, nothing changed), and cannot make a run of another version claimable to itself by
  declaring a version the policy lets resume nothing of it;
* a zeroth_reader reads zeroth.pinned_runs (its tenant's rows) and the audit log.
"""

from __future__ import annotations

import asyncpg
import pytest

ADMIN_ONLY = (
    "SELECT * FROM zeroth.set_version_policy(deployment_ref => 'mail', version_policy => 'any')",
    "SELECT * FROM zeroth.set_version_policy(deployment_ref => 'mail', "
    "version_policy => 'compatible', compatible_versions => ARRAY['v1', 'v2'])",
    "SELECT * FROM zeroth.retire_code_version(deployment_ref => 'mail', code_version => 'v1', "
    "action => 'move', to_version => 'v2')",
    "SELECT * FROM zeroth.retire_code_version(deployment_ref => 'mail', code_version => 'v1', "
    "action => 'fail')",
    "SELECT zeroth._version_serves('mail', 'v2')",
    "UPDATE zeroth.deployments SET version_policy = 'any', compatible_versions = NULL",
    "UPDATE zeroth.runs SET code_version_id = NULL",
    "INSERT INTO zeroth.code_versions (version_id, code_version, first_seen_at) "
    "VALUES (9, 'v9', now())",
    "DELETE FROM zeroth.code_versions",
    "INSERT INTO zeroth.code_version_changes (deployment_ref, changed_at, changed_by, action) "
    "VALUES ('mail', now(), 'x', 'move')",
    "DELETE FROM zeroth.code_version_changes",
    "TRUNCATE zeroth.code_version_changes",
)


async def sqlstate(conn: asyncpg.Connection, statement: str) -> str:
    try:
        await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def state(admin: asyncpg.Connection) -> tuple[object, ...]:
    deployments = await admin.fetch("SELECT deployment_ref, version_policy, compatible_versions "
                                    "FROM zeroth.deployments ORDER BY 1")
    runs = await admin.fetch("SELECT run_id, status, code_version_id, lease_generation "
                             "FROM zeroth.runs ORDER BY 1")
    versions = await admin.fetch("SELECT version_id, code_version FROM zeroth.code_versions "
                                 "ORDER BY 1")
    audit = await admin.fetch("SELECT change_id, action FROM zeroth.code_version_changes "
                              "ORDER BY 1")
    return ([tuple(r) for r in deployments], [tuple(r) for r in runs],
            [tuple(r) for r in audit], [tuple(r) for r in versions])


async def pinned_run(admin: asyncpg.Connection) -> None:
    """'mail' under policy same, one run started by v1 and handed back: pending, pinned to v1."""
    await admin.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail')")
    await admin.execute("SELECT * FROM zeroth.set_version_policy(deployment_ref => 'mail', "
                        "version_policy => 'same')")
    run_id = await admin.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'mail', "
                                  "tenant_id => 'acme')")
    row = await admin.fetchrow(
        "SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => 'mail', "
        "worker_id => 'old', tenant_id => 'acme', code_version => 'v1')")
    assert row["run_id"] == run_id
    assert await admin.fetchval(
        "SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => 'old', generation => $2, "
        "tenant_id => 'acme')", run_id, row["lease_generation"])


class TestOnlyADbaSetsThePolicy:
    @pytest.mark.parametrize("kind", ["worker", "reader", "nobody"])
    @pytest.mark.parametrize("statement", ADMIN_ONLY)
    async def test_other_roles_are_refused_and_change_nothing(self, login, admin, kind,
                                                              statement):
        await pinned_run(admin)
        conn = await login(kind)
        before = await state(admin)
        assert await sqlstate(conn, statement) == "42501"
        assert await state(admin) == before

    async def test_a_dba_sets_it_and_is_audited_under_its_login(self, admin):
        await pinned_run(admin)
        row = await admin.fetchrow("SELECT changed_by, action, version_policy "
                                   "FROM zeroth.code_version_changes")
        assert tuple(row) == (await admin.fetchval("SELECT session_user"), "set_policy", "same")


class TestAWorkerDeclaresItsVersionThroughTheClaimsOnly:
    async def test_another_version_cannot_claim_a_pinned_run(self, login, admin):
        await pinned_run(admin)
        worker = await login("worker")
        for version in ("v2", None):
            rows = await worker.fetch(
                "SELECT run_id FROM zeroth.claim_and_start(deployment_ref => 'mail', "
                "worker_id => 'new', tenant_id => 'acme', code_version => $1)", version)
            assert [r["run_id"] for r in rows if r["run_id"]] == []
        rows = await worker.fetch(
            "SELECT run_id FROM zeroth.claim_and_start(deployment_ref => 'mail', "
            "worker_id => 'old-again', tenant_id => 'acme', code_version => 'v1')")
        assert len([r for r in rows if r["run_id"]]) == 1

    @pytest.mark.parametrize("version", ["", "v1 ; DROP TABLE x", "x" * 129, "v1\n", "<b>",
                                         "v1'--"])
    async def test_a_bad_version_is_refused_and_changes_nothing(self, login, admin, version):
        await pinned_run(admin)
        worker = await login("worker")
        before = await state(admin)
        with pytest.raises(asyncpg.PostgresError) as raised:
            await worker.fetch("SELECT * FROM zeroth.claim_and_start(deployment_ref => 'mail', "
                               "worker_id => 'w', tenant_id => 'acme', code_version => $1)",
                               version)
        assert raised.value.sqlstate == "ZP008"
        assert await state(admin) == before


class TestAReaderLooks:
    async def test_it_reads_its_tenants_pinned_runs_and_the_audit(self, login, admin):
        await pinned_run(admin)
        reader = await login("reader")
        assert await reader.fetch("SELECT * FROM zeroth.pinned_runs") == []  # no tenant set
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        rows = await reader.fetch("SELECT code_version, pending FROM zeroth.pinned_runs")
        assert [tuple(r) for r in rows] == [("v1", 1)]
        await reader.execute("SET zeroth.tenant_id = 'other'")
        assert await reader.fetch("SELECT * FROM zeroth.pinned_runs") == []
        assert await reader.fetchval("SELECT count(*) FROM zeroth.code_version_changes") == 1

    @pytest.mark.parametrize("kind", ["worker", "nobody"])
    async def test_others_read_neither(self, login, admin, kind):
        await pinned_run(admin)
        conn = await login(kind)
        for statement in ("SELECT * FROM zeroth.pinned_runs",
                          "SELECT * FROM zeroth.code_version_changes",
                          "SELECT * FROM zeroth.code_versions"):
            assert await sqlstate(conn, statement) == "42501"
