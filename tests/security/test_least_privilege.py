"""Roles, ownership and grants (0006_security), and the rules every later migration must keep:
no public function executable by PUBLIC, each SECURITY DEFINER with search_path pinned to
pg_catalog, pg_temp, everything owned by zeroth_owner. Then a real LOGIN member of zeroth_worker
drives a run end to end through the functions and is refused the tables and the admin functions.
"""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import pytest
from roles import dsn_as, login_role, readme_grants

from zeroth_pg import LeaseManager
from zeroth_pg.errors import DatabaseError

# Besides the pinned search_path: plan caching (0007), complete_runs' bounded wait for a row
# another session holds, and renew_leases' hashed pairing of a batch with its
# request (tests/plans/test_batch_joins.py), and the hot-path UPDATEs' TID scans of the rows they
# locked, whatever the table's statistics (tests/plans/test_fresh_database.py), and count_pending's
# index-only scan of the claim index (tests/plans/test_dirty_claim.py), and JIT off where a plan
# node is (tests/sql/test_catalog.py, TestJit).
PLANNING = {"plan_cache_mode=force_generic_plan", "lock_timeout=2s", "enable_nestloop=off",
            "enable_seqscan=off", "enable_bitmapscan=off", "enable_sort=off", "jit=off"}
PINNED = ["search_path=pg_catalog, pg_temp"]

FUNCTIONS = """
    SELECT p.oid::regprocedure::text AS signature, p.proname AS name,
           left(p.proname, 1) = '_' AS internal, p.prosecdef AS definer, p.proconfig AS config,
           pg_get_userbyid(p.proowner) AS owner,
           EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                    WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public_execute,
           has_function_privilege('zeroth_worker', p.oid, 'EXECUTE') AS worker_execute,
           has_function_privilege('zeroth_reader', p.oid, 'EXECUTE') AS reader_execute
      FROM pg_proc p
     WHERE p.pronamespace = 'zeroth'::regnamespace
     ORDER BY 1"""

RELATIONS = """
    SELECT c.oid::regclass::text AS name, c.relkind::text AS kind,
           pg_get_userbyid(c.relowner) AS owner,
           EXISTS (SELECT FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
                    WHERE a.grantee = 0) AS public_any,
           has_table_privilege('zeroth_worker', c.oid,
                               'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
               OR has_any_column_privilege('zeroth_worker', c.oid,
                                           'SELECT, INSERT, UPDATE, REFERENCES')
               AS worker_any,
           -- Column grants count: a reader may read some columns of a table only (0018).
           has_any_column_privilege('zeroth_reader', c.oid, 'SELECT') AS reader_select,
           ARRAY(SELECT a.attname::text FROM pg_attribute a
                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
                    AND has_any_column_privilege('zeroth_reader', c.oid, 'SELECT')
                    AND NOT has_column_privilege('zeroth_reader', c.oid, a.attnum, 'SELECT')
                  ORDER BY a.attnum) AS reader_hidden_columns,
           has_table_privilege('zeroth_reader', c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE')
               OR has_any_column_privilege('zeroth_reader', c.oid, 'INSERT, UPDATE, REFERENCES')
               AS reader_writes,
           coalesce('security_invoker=true' = ANY (c.reloptions), false) AS invoker,
           c.relrowsecurity AS rls
      FROM pg_class c
     WHERE c.relnamespace = 'zeroth'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
     ORDER BY 1"""


async def functions(conn: asyncpg.Connection, *, internal: bool) -> list[asyncpg.Record]:
    return [f for f in await conn.fetch(FUNCTIONS) if f["internal"] is internal]


class TestRoles:
    async def test_the_three_group_roles_exist_and_cannot_log_in(self, conn):
        rows = await conn.fetch(
            """SELECT r.rolname, r.rolcanlogin, r.rolsuper, r.rolbypassrls FROM pg_roles r
                WHERE r.rolname IN ('zeroth_owner', 'zeroth_worker', 'zeroth_reader')""")
        assert {row["rolname"]: tuple(row)[1:] for row in rows} == {
            name: (False, False, False)
            for name in ("zeroth_owner", "zeroth_worker", "zeroth_reader")}

    async def test_zeroth_owner_owns_the_schema_and_every_object_in_it(self, conn):
        schema_owner = await conn.fetchval(
            "SELECT pg_get_userbyid(n.nspowner) FROM pg_namespace n WHERE n.nspname = 'zeroth'")
        types = await conn.fetch(
            """SELECT t.oid::regtype::text AS name, pg_get_userbyid(t.typowner) AS owner
                 FROM pg_type t WHERE t.typnamespace = 'zeroth'::regnamespace""")
        objects = [*await conn.fetch(FUNCTIONS), *await conn.fetch(RELATIONS), *types]
        assert len(objects) > 50
        assert schema_owner == "zeroth_owner"
        assert [o["name"] for o in objects if o["owner"] != "zeroth_owner"] == []


class TestFunctionRules:
    async def test_public_may_execute_no_function(self, conn):
        rows = await conn.fetch(FUNCTIONS)
        assert rows
        assert [f["signature"] for f in rows if f["public_execute"]] == []

    async def test_every_public_function_is_security_definer_with_a_pinned_search_path(self, conn):
        public = await functions(conn, internal=False)
        assert len(public) >= 30
        # Besides the pinned search_path a function may only fix its plans (PLANNING).
        wrong = [(f["signature"], f["definer"], f["config"]) for f in public
                 if not f["definer"] or [c for c in f["config"] if c not in PLANNING] != PINNED]
        assert wrong == []

    async def test_internal_helpers_run_as_the_caller(self, conn):
        # They are called from inside the SECURITY DEFINER functions, so the caller is
        # zeroth_owner and the search_path the pinned one.
        helpers = await functions(conn, internal=True)
        assert helpers
        assert [f["signature"] for f in helpers if f["definer"]] == []


class TestGrants:
    async def test_worker_may_execute_exactly_the_documented_worker_functions(self, conn):
        rows = await conn.fetch(FUNCTIONS)
        granted = {f["name"] for f in rows if f["worker_execute"]}
        assert granted == readme_grants("zeroth_worker")
        assert not any(f["internal"] for f in rows if f["worker_execute"])

    async def test_the_rest_of_the_public_functions_are_the_documented_admin_functions(self, conn):
        public = await functions(conn, internal=False)
        assert {f["name"] for f in public if not f["worker_execute"]} == readme_grants("admin only")
        assert {"clear_lease", "redrive_run", "prune_runs"} <= readme_grants("admin only")

    async def test_reader_may_execute_no_function(self, conn):
        rows = await conn.fetch(FUNCTIONS)
        assert [f["signature"] for f in rows if f["reader_execute"]] == []

    async def test_worker_has_no_privilege_on_any_table_view_or_sequence(self, conn):
        relations = await conn.fetch(RELATIONS)
        assert [r["name"] for r in relations if r["worker_any"] or r["public_any"]] == []

    async def test_reader_may_select_the_views_and_the_run_tables_and_write_nothing(self, conn):
        relations = await conn.fetch(RELATIONS)
        views = {r["name"] for r in relations if r["kind"] == "v"}
        readable = {r["name"] for r in relations if r["reader_select"]}
        assert {"zeroth.queue_depth", "zeroth.dead_letters"} <= views
        assert readable == views | {"zeroth.runs", "zeroth.checkpoints", "zeroth.scope_limits",
                                    "zeroth.schedules", "zeroth.schedule_fires",
                                    "zeroth.rate_limits", "zeroth.run_steps",
                                    "zeroth.event_waits", "zeroth.events", "zeroth.run_attempts",
                                    "zeroth.run_attempt_log",
                                    "zeroth.run_events",
                                    "zeroth.child_runs", "zeroth.deployments",
                                    "zeroth.deployment_changes", "zeroth.code_versions",
                                    "zeroth.code_version_changes"}
        assert readme_grants("zeroth_reader") == readable
        assert [r["name"] for r in relations if r["reader_writes"]] == []

    async def test_reader_never_sees_the_timing_of_a_shared_rate_limit(self, conn):
        # A rate-limit key may be shared by several tenants' scopes; the time of its last claim
        # may be another tenant's (0018). Every other readable relation shows all its columns.
        relations = await conn.fetch(RELATIONS)
        hidden = {r["name"]: r["reader_hidden_columns"] for r in relations
                  if r["reader_hidden_columns"]}
        assert hidden == {"zeroth.rate_limits": ["last_start_at"]}

    async def test_every_view_over_the_run_tables_reads_as_the_caller(self, conn):
        # A view with its owner's rights would bypass the readers' row-level security.
        over_runs = await conn.fetch(
            """SELECT DISTINCT v.oid::regclass::text AS name
                 FROM pg_class v
                 JOIN pg_rewrite w ON w.ev_class = v.oid
                 JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
                WHERE v.relkind = 'v' AND v.relnamespace = 'zeroth'::regnamespace
                  AND d.refobjid IN ('zeroth.runs'::regclass, 'zeroth.checkpoints'::regclass,
                                     'zeroth.run_steps'::regclass, 'zeroth.event_waits'::regclass,
                                     'zeroth.events'::regclass, 'zeroth.scope_limits'::regclass)""")
        invoker = {r["name"] for r in await conn.fetch(RELATIONS) if r["invoker"]}
        names = {r["name"] for r in over_runs}
        assert {"zeroth.queue_depth", "zeroth.dead_letters", "zeroth.run_list",
                "zeroth.step_list", "zeroth.wait_list"} <= names
        assert names - invoker == set()

    async def test_row_level_security_is_on_for_every_table_with_run_data(self, conn):
        tables = {r["name"]: r["rls"] for r in await conn.fetch(RELATIONS)
                  if r["kind"] == "r" and r["name"] != "zeroth.alembic_version"}
        assert tables == {name: True for name in tables}
        assert {"zeroth.runs", "zeroth.checkpoints", "zeroth.admission_slots"} <= set(tables)


@pytest.fixture
def worker_dsn(database_dsn):
    with login_role(database_dsn, "zeroth_worker") as (name, password):
        yield dsn_as(database_dsn, name, password)


async def expect_refused(conn: asyncpg.Connection, statement: str, *args: object) -> None:
    with pytest.raises(asyncpg.PostgresError) as caught:
        await conn.execute(statement, *args)
    assert caught.value.sqlstate == "42501", statement


class TestWorkerLogin:
    async def test_table_and_view_access_is_refused(self, worker_dsn):
        conn = await asyncpg.connect(worker_dsn)
        try:
            assert await conn.fetchval("SELECT pg_has_role('zeroth_worker', 'MEMBER')")
            for statement in (
                "SELECT count(*) FROM zeroth.runs",
                "UPDATE zeroth.runs SET lease_generation = lease_generation + 1",
                "DELETE FROM zeroth.runs",
                "INSERT INTO zeroth.checkpoints (checkpoint_id) VALUES (gen_random_uuid())",
                "SELECT count(*) FROM zeroth.checkpoints",
                "SELECT count(*) FROM zeroth.admission_slots",
                "SELECT count(*) FROM zeroth.queue_depth",
                "SELECT count(*) FROM zeroth.dead_letters",
                "SELECT zeroth._now()",
                "SELECT secret FROM zeroth.notification_secret",
                "SELECT zeroth._notify_key('wakeup', ARRAY['default', NULL, 'd'])",
            ):
                await expect_refused(conn, statement)
        finally:
            await conn.close()

    async def test_worker_functions_work_end_to_end(self, worker_dsn, database_dsn):
        pool = await asyncpg.create_pool(worker_dsn, min_size=1, max_size=2)
        try:
            lm = LeaseManager(pool, lease_duration_seconds=30)
            enqueued = await lm.enqueue_run("sec-deploy", {"n": 1}, tenant_id="t-sec")
            claim = await lm.claim_pending_result("sec-deploy", "w1", tenant_id="t-sec")
            assert claim.run_id == enqueued.run_id
            fence = {"generation": claim.runs[0].lease_generation, "tenant_id": "t-sec"}
            assert await lm.renew_lease(claim.run_id, "w1", **fence)
            assert await lm.start_run(claim.run_id, "w1", **fence)
            checkpoint = await lm.save_checkpoint(claim.run_id, "w1", {"step": 1}, **fence)
            assert await lm.commit_fenced(claim.run_id, "w1", **fence, progress={"step": 1})
            assert await lm.current_generation(claim.run_id, tenant_id="t-sec") == 1
            assert await lm.complete_run(claim.run_id, "w1", output={"ok": True}, **fence)
        finally:
            await pool.close()
        admin = await asyncpg.connect(database_dsn)
        try:
            row = await admin.fetchrow(
                """SELECT r.status::text, r.output::text, r.progress::text,
                          (SELECT c.checkpoint_id FROM zeroth.checkpoints c
                            WHERE c.run_id = r.run_id) AS checkpoint_id
                     FROM zeroth.runs r WHERE r.run_id = $1""", enqueued.run_id)
        finally:
            await admin.close()
        assert (row[0], json.loads(row[1]), json.loads(row[2]), row[3]) == (
            "completed", {"ok": True}, {"step": 1}, checkpoint)

    async def test_admin_functions_are_refused(self, worker_dsn):
        pool = await asyncpg.create_pool(worker_dsn, min_size=1, max_size=1)
        try:
            lm = LeaseManager(pool)
            run_id = (await lm.enqueue_run("sec-deploy")).run_id
            for call in (lm.clear_lease(run_id), lm.redrive_run(run_id),
                         lm.prune_runs(timedelta(days=1))):
                with pytest.raises(DatabaseError) as caught:
                    await call
                assert caught.value.code == "42501"
        finally:
            await pool.close()
