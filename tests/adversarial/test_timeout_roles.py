"""Attempt and run deadlines (issue 34, item 2) against the roles the product keeps out, on a
database exactly as shipped (no test hook):

* a zeroth_worker holding a run cannot move its deadline: renewing with any lease stops at the
  deadline, and neither a write to zeroth.runs, the admin functions nor the internal helpers are
  open to it; past the deadline its renewal is refused with ZP013;
* a timeout a worker login registers binds its own sessions only (zeroth._policy_binds_caller),
  never another login's claims; a DBA's binds every worker;
* a zeroth_reader and a LOGIN role with no grant change nothing;
* a waiting run is ended at its run deadline by any worker's sweep (wake_due_waits), on the
  database clock: no worker ends it before, nor keeps it waiting after, and another tenant's
  worker cannot resume it.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg
import pytest

DEPLOYMENT = "mail"
MOVES = (
    "UPDATE zeroth.runs SET attempt_deadline_at = NULL, run_deadline_at = NULL",
    "UPDATE zeroth.runs SET attempt_timeout_seconds = 86400",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
    "attempt_timeout_seconds => 86400)",
    "SELECT zeroth.set_deployment_defaults(deployment_ref => 'mail', "
    "unset => ARRAY['attempt_timeout_seconds', 'run_timeout_seconds'])",
    "UPDATE zeroth.deployments SET attempt_timeout_seconds = NULL",
    "SELECT zeroth._end_timed_out('default', '', gen_random_uuid(), now())",
    "SELECT zeroth._end_past_run_deadline('default', '', gen_random_uuid(), now())",
    "SELECT zeroth._end_past_run_deadline_isolated('default', '', gen_random_uuid(), now())",
    "SELECT zeroth._deployment_claim_policy('mail', NULL)",
    "SELECT zeroth.redrive_run(run_id => gen_random_uuid())",
)


async def sqlstate(conn: asyncpg.Connection, statement: str, *args: object) -> str:
    try:
        await conn.execute(statement, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


async def claimed(worker: asyncpg.Connection, worker_id: str = "w1") -> asyncpg.Record:
    await worker.execute("SELECT zeroth.enqueue_run(deployment_ref => $1)", DEPLOYMENT)
    row = await worker.fetchrow(
        """SELECT run_id, lease_generation, lease_expires_at, deadline_at, deadline_in
             FROM zeroth.claim_and_start(deployment_ref => $1, worker_id => $2,
                                         lease_seconds => 60)""", DEPLOYMENT, worker_id)
    assert row is not None
    assert row["run_id"] is not None
    return row


async def deadlines(admin: asyncpg.Connection, run_id: UUID) -> tuple[object, ...]:
    row = await admin.fetchrow(
        """SELECT attempt_deadline_at, run_deadline_at, lease_expires_at, status::text
             FROM zeroth.runs WHERE run_id = $1""", run_id)
    return tuple(row)


class TestWorker:
    async def test_renewing_with_any_lease_stops_at_the_dbas_deadline(self, login, admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                            "attempt_timeout_seconds => 30)", DEPLOYMENT)
        worker = await login("worker")
        run = await claimed(worker)
        assert run["deadline_at"] is not None
        assert run["lease_expires_at"] == run["deadline_at"]
        assert 29 < run["deadline_in"] <= 30
        assert await worker.fetchval(
            """SELECT zeroth.renew_lease(run_id => $1, worker_id => 'w1', generation => $2,
                   lease_seconds => 86400)""", run["run_id"], run["lease_generation"])
        renewed = await worker.fetchrow(
            """SELECT renewed, lease_expires_at FROM zeroth.renew_leases(worker_id => 'w1',
                   run_ids => ARRAY[$1]::uuid[], generations => ARRAY[$2]::bigint[],
                   lease_seconds => 86400)""", run["run_id"], run["lease_generation"])
        assert (renewed["renewed"], renewed["lease_expires_at"]) == (True, run["deadline_at"])
        assert await deadlines(admin, run["run_id"]) == (
            run["deadline_at"], None, run["deadline_at"], "running")

    @pytest.mark.parametrize("statement", MOVES)
    async def test_no_statement_moves_a_deadline(self, login, admin, statement):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                            "attempt_timeout_seconds => 30, run_timeout_seconds => 600)",
                            DEPLOYMENT)
        worker = await login("worker")
        run = await claimed(worker)
        before = await deadlines(admin, run["run_id"])
        assert await sqlstate(worker, statement) == "42501"
        assert await deadlines(admin, run["run_id"]) == before

    async def test_a_renewal_past_the_deadline_is_refused_with_deadline_passed(self, login,
                                                                               admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                            "attempt_timeout_seconds => 30)", DEPLOYMENT)
        worker = await login("worker")
        run = await claimed(worker)
        # A DBA's manual UPDATE (the owner may move a deadline): due a moment ago.
        await admin.execute(
            """UPDATE zeroth.runs SET attempt_deadline_at = clock_timestamp() - interval '1 ms',
                   lease_expires_at = clock_timestamp() - interval '1 ms' WHERE run_id = $1""",
            run["run_id"])
        assert await sqlstate(
            worker, """SELECT zeroth.renew_lease(run_id => $1, worker_id => 'w1',
                           generation => $2)""", run["run_id"], run["lease_generation"]) == "ZP013"
        # Another worker, or another generation, learns nothing: refused as any lost lease.
        assert await worker.fetchval(
            """SELECT zeroth.renew_lease(run_id => $1, worker_id => 'w2', generation => $2)""",
            run["run_id"], run["lease_generation"]) is False

    async def test_a_timeout_a_worker_login_registers_binds_only_its_own_sessions(self, login,
                                                                                  admin):
        first = await login("worker")
        registered = await first.fetchrow(
            """SELECT outcome, attempt_timeout_seconds FROM zeroth.register_deployment(
                   deployment_ref => $1, attempt_timeout_seconds => 5)""", DEPLOYMENT)
        assert tuple(registered) == ("created", 5)
        other = await login("worker")
        theirs = await claimed(other, "w2")
        assert (theirs["deadline_at"], theirs["deadline_in"]) == (None, None)
        mine = await claimed(first, "w1")
        assert mine["deadline_at"] is not None
        assert 4 < mine["deadline_in"] <= 5


class TestReaderAndNobody:
    @pytest.mark.parametrize("kind", ["reader", "nobody"])
    async def test_they_set_no_timeout_and_renew_nothing(self, login, admin, kind):
        someone = await login(kind)
        for statement in MOVES:
            assert await sqlstate(someone, statement) == "42501", statement
        assert await sqlstate(
            someone, "SELECT zeroth.register_deployment(deployment_ref => 'mail', "
                     "attempt_timeout_seconds => 5)") == "42501"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.deployments") == 0


class TestAWaitingRunsDeadline:
    async def paused(self, worker: asyncpg.Connection) -> UUID:
        run = await claimed(worker)
        assert await worker.fetchval(
            """SELECT zeroth.pause_run(run_id => $1, worker_id => 'w1', generation => $2,
                   reason => 'approval')""", run["run_id"], run["lease_generation"])
        return run["run_id"]  # type: ignore[no-any-return]

    async def test_a_workers_sweep_ends_it_only_once_the_database_clock_passed_it(
            self, login, admin):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                            "run_timeout_seconds => 600)", DEPLOYMENT)
        worker = await login("worker")
        run_id = await self.paused(worker)
        assert await worker.fetchval("SELECT zeroth.wake_due_waits()") == 0
        assert (await deadlines(admin, run_id))[3] == "waiting"
        # Another tenant's worker keeps nothing alive: the run is not in its scope.
        assert await sqlstate(worker, "SELECT zeroth.resume_run(run_id => $1, tenant_id => 't2')",
                              run_id) == "ZP001"
        # A DBA's manual UPDATE (the owner may move a deadline): due a moment ago.
        await admin.execute("UPDATE zeroth.runs SET run_deadline_at = clock_timestamp() "
                            "- interval '1 ms' WHERE run_id = $1", run_id)
        assert await worker.fetchval("SELECT zeroth.wake_due_waits()") == 1
        row = await admin.fetchrow(
            "SELECT status::text, error ->> 'stop_reason' AS stop FROM zeroth.runs "
            "WHERE run_id = $1", run_id)
        assert tuple(row) == ("failed", "run_timeout")

    @pytest.mark.parametrize("kind", ["reader", "nobody"])
    async def test_a_reader_or_nobody_cannot_sweep(self, login, admin, kind):
        await admin.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                            "run_timeout_seconds => 600)", DEPLOYMENT)
        run_id = await self.paused(await login("worker"))
        await admin.execute("UPDATE zeroth.runs SET run_deadline_at = clock_timestamp() "
                            "- interval '1 ms' WHERE run_id = $1", run_id)
        someone = await login(kind)
        assert await sqlstate(someone, "SELECT zeroth.wake_due_waits()") == "42501"
        assert (await deadlines(admin, run_id))[3] == "waiting"
