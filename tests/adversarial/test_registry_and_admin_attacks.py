"""The registry of deployments and the lookups by run id under attack, on a database exactly as
shipped (no test hook): a DBA who deletes a registry row, another trust domain's worker login, an
open transaction holding a deployment's row, admit_run and schedules beside the registry, and the
dashboard's bulk page looking runs up by id without an index on run_id alone (0019).
"""

from __future__ import annotations

import asyncpg

REGISTER = ("SELECT outcome FROM zeroth.register_deployment(deployment_ref => $1, "
            "max_attempts => $2, priority => $3)")


async def sqlstate(conn: asyncpg.Connection, statement: str, *args: object) -> str:
    try:
        await conn.execute(statement, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


class TestRegistryRowDeletedByADba:
    """dba-guide: a manual change of zeroth.deployments 'works too'. A DBA who deletes a
    deployment's row (to reset it, to hand it back to the applications, to drop a retired
    deployment) leaves its audit rows behind; the next registration creates the row again at
    version 1, whose audit row (deployment_ref, 1) already exists: unique violation 23505, for
    ever. The App registers all its deployments in one transaction when it opens its pool, so
    that one row stops every deployment of the App from opening."""

    async def test_an_application_can_register_a_deployment_whose_row_a_dba_deleted(
            self, login, admin):
        worker = await login("worker")
        assert await worker.fetchval(REGISTER, "mail", 3, 0) == "created"
        await admin.execute("DELETE FROM zeroth.deployments WHERE deployment_ref = 'mail'")
        assert await sqlstate(worker, REGISTER, "mail", 5, 0) == "ok"
        assert await admin.fetchval("SELECT max_attempts FROM zeroth.deployments "
                                    "WHERE deployment_ref = 'mail'") == 5

    async def test_a_dba_can_set_the_defaults_of_a_deployment_whose_row_was_deleted(
            self, login, admin):
        worker = await login("worker")
        assert await worker.fetchval(REGISTER, "mail", 3, 0) == "created"
        await admin.execute("DELETE FROM zeroth.deployments WHERE deployment_ref = 'mail'")
        assert await sqlstate(admin, "SELECT zeroth.set_deployment_defaults("
                                     "deployment_ref => 'mail', max_attempts => 8)") == "ok"

    async def test_one_deleted_row_does_not_stop_the_registration_of_the_others(
            self, login, admin):
        """What App._register does: every deployment in one transaction."""
        worker = await login("worker")
        for ref in ("mail", "report"):
            assert await worker.fetchval(REGISTER, ref, 3, 0) == "created"
        await admin.execute("DELETE FROM zeroth.deployments WHERE deployment_ref = 'mail'")
        try:
            async with worker.transaction():
                await worker.fetchval(REGISTER, "report", 6, 1)
                await worker.fetchval(REGISTER, "mail", 3, 0)
        except asyncpg.PostgresError:
            pass
        assert await admin.fetchval("SELECT max_attempts FROM zeroth.deployments "
                                    "WHERE deployment_ref = 'report'") == 6

    async def test_an_app_whose_deployment_row_a_dba_deleted_still_enqueues(
            self, admin, database_dsn):
        """The same through the Python App: it registers when it opens its pool, and a 23505 is
        not one of the codes it tolerates, so every enqueue of every deployment fails."""
        from zeroth_pg import App

        await admin.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail')")
        await admin.execute("DELETE FROM zeroth.deployments WHERE deployment_ref = 'mail'")
        app = App(database_dsn)

        @app.deployment("mail", max_attempts=5)
        async def mail(run, n: int) -> int: ...

        @app.deployment("report", max_attempts=6)
        async def report(run, n: int) -> int: ...

        try:
            enqueued = await report.enqueue(n=1)
        finally:
            await app.close()
        assert await admin.fetchval("SELECT max_attempts FROM zeroth.runs WHERE run_id = $1",
                                    enqueued.run_id) == 6


class TestRegistryAcrossTrustDomains:
    """security.md: 'Run one worker role per trust domain when tenants must not be able to touch
    each other's runs.' The registry is global and the last registration wins, so the worker
    login of one trust domain sets the attempts and priority of the runs another trust domain's
    producers enqueue without values: max_attempts 1 (a transient error dead-letters them) and
    the lowest priority (starved behind everything), on runs of a tenant it never named."""

    async def test_another_logins_registration_does_not_change_the_defaults_of_my_runs(
            self, login, admin):
        beta = await login("worker")      # tenant beta's App and producers
        alpha = await login("worker")     # another trust domain: tenant alpha's worker role
        assert await beta.fetchval(REGISTER, "mail", 5, 10) == "created"
        await alpha.fetchval(REGISTER, "mail", 1, -2147483648)
        run_id = await beta.fetchval("SELECT run_id FROM zeroth.enqueue_run("
                                     "deployment_ref => 'mail', tenant_id => 'beta')")
        row = await admin.fetchrow("SELECT max_attempts, priority FROM zeroth.runs "
                                   "WHERE run_id = $1", run_id)
        assert tuple(row) == (5, 10)


class TestScheduleRunsAndTheRegistry:
    """A schedule stores its own max_attempts and priority (create_schedule's defaults 3 / 0, or
    what its creator named): its runs carry them, whatever the registry says later, as the
    comment of zeroth.deployments and the dba-guide say (a schedule is a standing enqueue with
    its values fixed when it was made)."""

    async def test_a_schedules_runs_carry_the_schedules_own_values(self, admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                            "max_attempts => 8, priority => 4)")
        await admin.execute("SELECT zeroth.create_schedule(name => 's', deployment_ref => 'mail',"
                            " interval_seconds => 3600, tenant_id => 't', max_attempts => 5, "
                            "priority => 1)")
        fired = await admin.fetchrow("SELECT * FROM zeroth.fire_schedule_now(name => 's', "
                                     "tenant_id => 't')")
        row = await admin.fetchrow("SELECT max_attempts, priority FROM zeroth.runs "
                                   "WHERE run_id = $1", fired["run_id"])
        assert tuple(row) == (5, 1)


class TestAdmitRunAndTheRegistry:
    """dba-guide: 'the max_attempts and priority a run gets when its enqueue passes none — from
    psql, Node, the CLI or Python alike'. admit_run (the thread admission path, granted to
    zeroth_worker) still defaults to priority 0 / max_attempts 3: a run admitted without values
    ignores the registry, a DBA's pinned setting included."""

    async def test_a_run_admitted_without_values_gets_the_registry_defaults(self, login, admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                            "max_attempts => 8, priority => 4)")
        worker = await login("worker")
        run_id = await worker.fetchval("SELECT run_id FROM zeroth.admit_run("
                                       "deployment_ref => 'mail', thread_id => 'th')")
        row = await admin.fetchrow("SELECT max_attempts, priority FROM zeroth.runs "
                                   "WHERE run_id = $1", run_id)
        assert tuple(row) == (8, 4)


class TestRegistryLocks:
    """_change_deployment locks the deployment's row (INSERT … ON CONFLICT, then SELECT … FOR
    UPDATE) on every registration, even one that changes nothing ('unchanged') or that a DBA's
    pin refuses ('kept'), and register_deployment sets no lock_timeout. One worker login that
    registers inside a transaction it keeps open holds up every other App that starts with that
    deployment (App.open registers before its first enqueue, so it waits, for ever) — another
    trust domain's included — and the DBA's set_deployment_defaults. security.md: 'A session
    can only ever hold up its own threads and scopes.'"""

    async def test_a_registration_is_not_held_up_by_another_logins_open_transaction(
            self, login, admin):
        import asyncio

        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                            "max_attempts => 4)")
        hostile = await login("worker")
        other = await login("worker")
        other_pid = await other.fetchval("SELECT pg_backend_pid()")
        holding = hostile.transaction()
        await holding.start()
        try:
            assert await hostile.fetchval(REGISTER, "mail", 3, 0) == "kept"
            task = asyncio.ensure_future(other.fetchval(REGISTER, "mail", 3, 0))
            blocked = False
            while not task.done():
                blocked = await admin.fetchval(
                    "SELECT cardinality(pg_blocking_pids($1)) > 0", other_pid)
                if blocked:
                    break
                await asyncio.sleep(0.05)
        finally:
            await holding.rollback()
        await task
        assert not blocked, "another login's registration waited on the hostile transaction"


class TestRunByIdAfterTheIndexChange:
    """0019 dropped runs_run_id_idx. The dashboard's bulk page reads the status of the runs an
    action skipped by id alone: `run_list WHERE run_id = ANY($1)` read the whole table (a
    sequential scan on PostgreSQL 15). It now finds each as the run page does
    (zeroth_pg._calls.run_by_id): since 0023 one probe of runs_pkey, which leads with run_id,
    whatever the number of scopes (100 tenants here): index reads, never a scan of the table."""

    async def test_the_bulk_pages_status_lookup_reads_runs_by_index(self, admin):
        import json

        from zeroth_pg.web.bulk import _STATUS_BY_ID

        await admin.execute(
            """INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, run_after,
                                        attempts, created_at, updated_at, started_at,
                                        finished_at, lease_generation)
               SELECT gen_random_uuid(), 't' || (g % 100), 'd', 'completed', t, 1, t, t, t, t, 1
                 FROM generate_series(1, 50000) AS g,
                      LATERAL (SELECT clock_timestamp() - g * interval '1 s' AS t) AS s""")
        await admin.execute("VACUUM ANALYZE zeroth.runs")
        run_id = await admin.fetchval("SELECT run_id FROM zeroth.runs LIMIT 1")
        raw = await admin.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + _STATUS_BY_ID, run_id)
        plan = json.loads(raw)[0]["Plan"]

        def nodes(p):
            return [p, *(n for c in p.get("Plans", []) for n in nodes(c))]

        scans = [n["Node Type"] for n in nodes(plan) if n.get("Relation Name") == "runs"]
        blocks = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        assert "Seq Scan" not in scans, (scans, blocks)
        assert set(scans) <= {"Index Scan", "Index Only Scan"}, scans
        assert blocks < 20, (scans, blocks)


REGISTER_POLICY = """SELECT outcome FROM zeroth.register_deployment(deployment_ref => $1,
    retry_base_seconds => $2, retry_max_seconds => $3, lease_seconds => $4)"""
POLICY = """SELECT retry_base_seconds, retry_max_seconds, lease_seconds, version
    FROM zeroth.deployments WHERE deployment_ref = $1"""


class TestRetryPolicyAndLeaseAcrossRoles:
    """The registry's retry policy and lease (migration 0020) decide how soon a failed run is
    retried and how long a crashed worker's run stays stuck: a lease of a day strands a
    tenant's runs for a day after a crash, a zero backoff hammers its downstream. Only the login
    whose application registered a deployment (registered_by) or a DBA may change them."""

    async def test_another_logins_registration_does_not_change_the_policy_of_my_runs(
            self, login, admin):
        beta = await login("worker")
        alpha = await login("worker")  # another trust domain's worker role
        assert await beta.fetchval(REGISTER_POLICY, "mail", 5.0, 60.0, 120.0) == "created"
        assert await alpha.fetchval(REGISTER_POLICY, "mail", 0.0, 0.0, 86400.0) == "kept"
        assert await alpha.fetchval(REGISTER_POLICY, "mail", None, None, None) == "kept"
        assert tuple(await admin.fetchrow(POLICY, "mail")) == (5, 60, 120, 1)
        await beta.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail', "
                           "tenant_id => 'beta')")
        await beta.fetch("SELECT * FROM zeroth.claim_pending(deployment_ref => 'mail', "
                         "worker_id => 'w', tenant_id => 'beta')")
        leased = await admin.fetchval("SELECT lease_expires_at - lease_acquired_at "
                                      "FROM zeroth.runs WHERE deployment_ref = 'mail'")
        assert leased.total_seconds() == 120

    async def test_a_worker_cannot_set_nor_unset_a_policy_as_a_dba(self, login, admin):
        worker = await login("worker")
        assert await worker.fetchval(REGISTER_POLICY, "mail", 5.0, 60.0, 120.0) == "created"
        for statement in (
                "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                "lease_seconds => 86400)",
                "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                "unset => ARRAY['retry_base_seconds', 'retry_max_seconds'])",
                "UPDATE zeroth.deployments SET retry_base_seconds = 0, retry_max_seconds = 0",
                "SELECT zeroth._deployment_lease('mail', NULL)",
                "SELECT zeroth._check_deployment_policy(1, 2, 3)"):
            assert await sqlstate(worker, statement) == "42501", statement
        assert tuple(await admin.fetchrow(POLICY, "mail")) == (5, 60, 120, 1)

    async def test_a_registration_keeps_the_policy_a_dba_pinned(self, login, admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
                            "lease_seconds => 30)")
        worker = await login("worker")
        assert await worker.fetchval(REGISTER_POLICY, "mail", 0.0, 0.0, 86400.0) == "kept"
        assert tuple(await admin.fetchrow(POLICY, "mail")) == (None, None, 30, 1)

    async def test_a_reader_and_a_login_without_a_grant_change_no_policy(self, login, admin):
        await admin.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                            "retry_base_seconds => 5, retry_max_seconds => 60, "
                            "lease_seconds => 120)")
        before = tuple(await admin.fetchrow(POLICY, "mail"))
        audit = await admin.fetchval("SELECT count(*) FROM zeroth.deployment_changes")
        for who in ("reader", "nobody"):
            conn = await login(who)
            for statement, args in (
                    (REGISTER_POLICY, ("mail", 0.0, 0.0, 86400.0)),
                    ("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                     "lease_seconds => 1)", ("mail",)),
                    ("UPDATE zeroth.deployments SET lease_seconds = 1", ())):
                assert await sqlstate(conn, statement, *args) == "42501", (who, statement)
        assert tuple(await admin.fetchrow(POLICY, "mail")) == before
        assert await admin.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == audit

    async def test_a_dbas_manual_update_applies_to_the_next_claim_and_bad_values_are_refused(
            self, login, admin):
        worker = await login("worker")
        await worker.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                             "lease_seconds => 120)")
        await admin.execute("UPDATE zeroth.deployments SET lease_seconds = 45 "
                            "WHERE deployment_ref = 'mail'")
        for bad in ("lease_seconds = 'Infinity'", "lease_seconds = -1",
                    "retry_base_seconds = 'NaN'", "retry_max_seconds = 1e12"):
            assert await sqlstate(admin, f"UPDATE zeroth.deployments SET {bad}") == "23514", bad
        await worker.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail')")
        await worker.fetch("SELECT * FROM zeroth.claim_and_start(deployment_ref => 'mail', "
                           "worker_id => 'w')")
        leased = await admin.fetchval("SELECT lease_expires_at - lease_acquired_at "
                                      "FROM zeroth.runs WHERE deployment_ref = 'mail'")
        assert leased.total_seconds() == 45


class TestARegisteredLeaseTooShortToHoldARun:
    """A registered lease applies to every claim of the deployment that names none, by every
    worker. 0 < lease let 1e-9 s through: the claim's interval rounds to no time at all
    (lease_expires_at = now), so no run of the deployment can be started before its lease has
    lapsed, and each lapsed claim counts an attempt until the run is dead-lettered. The registry
    takes 1 <= lease <= 86400 (an explicit lease of a claim keeps its own bound)."""

    async def test_a_worker_cannot_register_a_lease_under_a_second(self, login, admin):
        worker = await login("worker")
        for lease in (1e-9, 0.5):
            assert await sqlstate(worker, REGISTER_POLICY, "mail", None, None, lease) == "ZP008"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.deployments") == 0
        assert await admin.fetchval("SELECT count(*) FROM zeroth.deployment_changes") == 0

    async def test_a_dba_cannot_set_a_lease_under_a_second(self, admin):
        await admin.execute("SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                            "lease_seconds => 120)")
        assert await sqlstate(admin, "SELECT zeroth.set_deployment_defaults("
                                     "deployment_ref => 'mail', lease_seconds => 1e-9)") == "ZP008"
        assert await sqlstate(admin, "UPDATE zeroth.deployments SET lease_seconds = 1e-9") \
            == "23514"
        assert tuple(await admin.fetchrow(POLICY, "mail")) == (None, None, 120, 1)

    async def test_a_one_second_registered_lease_is_a_lease_of_one_second(self, login, admin):
        worker = await login("worker")
        assert await worker.fetchval(REGISTER_POLICY, "mail", None, None, 1.0) == "created"
        await worker.execute("SELECT zeroth.enqueue_run(deployment_ref => 'mail')")
        await worker.fetch("SELECT * FROM zeroth.claim_pending(deployment_ref => 'mail', "
                           "worker_id => 'w')")
        leased = await admin.fetchval("SELECT lease_expires_at - lease_acquired_at "
                                      "FROM zeroth.runs WHERE deployment_ref = 'mail'")
        assert leased.total_seconds() == 1


class TestAnotherLoginsRegistrationDoesNotSetMyRunsPolicy:
    """A worker login that registers a deployment name first (another team's, before that team's
    application starts) owns the row: the team's registration is then 'kept'. Its retry policy
    and lease used to apply to every caller passing none, the team's own workers included (the
    Python worker passes none for a deployment declared without retry=): a 30-day backoff parked
    the team's failed runs for weeks. A registration binds its own login's sessions only; a DBA's
    row (managed_by sql, or handed back) binds every session."""

    SQUAT = """SELECT outcome FROM zeroth.register_deployment(deployment_ref => 'billing',
        retry_base_seconds => 2592000, retry_max_seconds => 2592000, lease_seconds => 86400)"""

    @staticmethod
    async def failed_run(team: asyncpg.Connection, admin: asyncpg.Connection,
                         lease: float | None = 60) -> tuple[float, float]:
        """(the lease the team's claim got, the delay of its retry), in seconds."""
        await team.execute("SELECT zeroth.enqueue_run(deployment_ref => 'billing', "
                           "max_attempts => 3)")
        run = await team.fetchrow("SELECT * FROM zeroth.claim_and_start("
                                  "deployment_ref => 'billing', worker_id => 'w', "
                                  "lease_seconds => $1)", lease)
        leased = await admin.fetchval("SELECT lease_expires_at - lease_acquired_at "
                                      "FROM zeroth.runs WHERE run_id = $1", run["run_id"])
        assert await team.fetchval(
            "SELECT zeroth.fail_run(run_id => $1, worker_id => 'w', generation => $2, "
            "error => '{}')", run["run_id"], run["lease_generation"]) == "retry_scheduled"
        delay = await admin.fetchval("SELECT extract(epoch FROM run_after - updated_at) "
                                     "FROM zeroth.runs WHERE run_id = $1", run["run_id"])
        return leased.total_seconds(), float(delay)

    async def test_a_squatted_registration_sets_neither_backoff_nor_lease_of_my_runs(
            self, login, admin):
        rogue, team = await login("worker"), await login("worker")
        assert await rogue.fetchval(self.SQUAT) == "created"
        assert await team.fetchval("SELECT outcome FROM zeroth.register_deployment("
                                   "deployment_ref => 'billing')") == "kept"
        leased, delay = await self.failed_run(team, admin, lease=None)
        assert leased == 60  # not the squatter's day
        assert delay <= 1  # 1 s doubling: not the squatter's 30 days

    async def test_a_squatted_registration_sets_no_backoff_of_my_settle_runs_retries(
            self, login, admin):
        rogue, team = await login("worker"), await login("worker")
        assert await rogue.fetchval(self.SQUAT) == "created"
        await team.execute("SELECT zeroth.enqueue_run(deployment_ref => 'billing', "
                           "max_attempts => 3)")
        run = await team.fetchrow("SELECT * FROM zeroth.claim_and_start("
                                  "deployment_ref => 'billing', worker_id => 'w', "
                                  "lease_seconds => 60)")
        assert await team.fetchval(
            "SELECT outcome FROM zeroth.settle_runs(worker_id => 'w', run_ids => $1::uuid[], "
            "generations => $2::bigint[], outcomes => '{retry}')",
            [run["run_id"]], [run["lease_generation"]]) == "retry_scheduled"
        delay = await admin.fetchval("SELECT extract(epoch FROM run_after - updated_at) "
                                     "FROM zeroth.runs WHERE run_id = $1", run["run_id"])
        assert float(delay) <= 1  # 1 s doubling: not the squatter's 30 days

    async def test_my_own_registration_and_a_dbas_pin_still_apply(self, login, admin):
        team = await login("worker")
        assert await team.fetchval(self.SQUAT) == "created"
        leased, delay = await self.failed_run(team, admin, lease=None)
        assert (leased, delay > 86400) == (86400, True)
        other = await login("worker")
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'billing', "
                            "retry_base_seconds => 600, retry_max_seconds => 600, "
                            "lease_seconds => 90)")
        leased, delay = await self.failed_run(other, admin, lease=None)
        assert (leased, 300 <= delay <= 600) == (90, True)
