"""No session can move the clock of any decision (DESIGN rule 1).

A clock a session could move (a ``zeroth._now()`` trusting a placeholder setting such as
``zeroth.allow_now_override``, which every role can SET) would let a LOGIN member of
zeroth_worker take a live lease away (claim_orphaned "an hour later"), exceed max_concurrency,
revive an expired lease or strand runs for ever. No function takes a time argument, the clock is
``clock_timestamp()`` bound when the migration created it, and only the database owner or a
superuser could replace it (the test harness does, in its own databases only).
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

DEPLOYMENT = "d"

TIME_PARAMETERS = """
    SELECT p.proname, a.name, format_type(a.type, NULL) AS type
      FROM pg_proc p
     CROSS JOIN LATERAL unnest(p.proargnames, coalesce(p.proallargtypes, p.proargtypes::oid[]),
                               coalesce(p.proargmodes, array_fill('i'::"char",
                                        ARRAY[p.pronargs]))) AS a(name, type, mode)
     WHERE p.pronamespace = 'zeroth'::regnamespace AND left(p.proname, 1) <> '_'
       AND a.mode IN ('i', 'b', 'v')
       AND (a.type IN ('timestamptz'::regtype, 'timestamp'::regtype, 'date'::regtype)
            OR a.name ~ 'now|clock|time')"""


async def sqlstate(conn: asyncpg.Connection, statement: str, *args: object) -> str | None:
    try:
        await conn.execute(statement, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate
    return None


class TestNoCallerClock:
    async def test_no_public_function_takes_a_time_but_enqueues_run_after(self, admin):
        rows = {tuple(r) for r in await admin.fetch(TIME_PARAMETERS)}
        # Business input, never the clock of a decision: when a run becomes due (run_after; a
        # durable sleep's resume_at, a past one taken as now, so it cannot jump the queue), a
        # schedule's anchor (start_at: admin functions only) and the zone its cron is read in;
        # a wait's timeout is a duration, turned into a deadline on the database clock.
        assert rows == {("enqueue_run", "run_after", "timestamp with time zone"),
                        ("sleep_run", "resume_at", "timestamp with time zone"),
                        ("wait_for_event", "timeout_seconds", "double precision"),
                        ("create_schedule", "start_at", "timestamp with time zone"),
                        ("alter_schedule", "start_at", "timestamp with time zone"),
                        ("create_schedule", "time_zone", "text"),
                        ("alter_schedule", "time_zone", "text"),
                        ("register_schedule", "time_zone", "text"),
                        # Timeouts are durations; the claim turns them into deadlines on the
                        # database clock (issue 34).
                        ("enqueue_run", "attempt_timeout_seconds", "integer"),
                        ("enqueue_run", "run_timeout_seconds", "integer"),
                        ("register_deployment", "attempt_timeout_seconds", "double precision"),
                        ("register_deployment", "run_timeout_seconds", "double precision"),
                        ("set_deployment_defaults", "attempt_timeout_seconds", "double precision"),
                        ("set_deployment_defaults", "run_timeout_seconds", "double precision")}

    async def test_a_shipped_database_has_no_test_clock(self, admin):
        assert await admin.fetchval("SELECT to_regnamespace('zeroth_test')") is None
        body = await admin.fetchval(
            "SELECT pg_get_functiondef('zeroth._now()'::regprocedure)")
        assert "clock_timestamp()" in body
        assert "current_setting" not in body

    async def test_settings_and_a_now_override_move_no_clock_and_the_owner_keeps_its_run(
            self, login, admin):
        attacker = await login("worker")
        run_id = await attacker.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)", DEPLOYMENT)
        generation = await attacker.fetchval(
            """SELECT lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
                   worker_id => 'A')""", DEPLOYMENT)
        assert generation == 1
        # Placeholder settings are still anyone's to SET; nothing reads them any more.
        await attacker.execute("SET zeroth.allow_now_override = on")
        await attacker.execute("SET zeroth_test.now = '2999-01-01'")
        assert await sqlstate(
            attacker, """SELECT * FROM zeroth.claim_orphaned(deployment_ref => $1,
                             worker_id => 'B',
                             now_override => clock_timestamp() + interval '1 hour')""",
            DEPLOYMENT) == "42883"  # no such function: there is no clock to pass
        stolen = await attacker.fetch(
            "SELECT run_id FROM zeroth.claim_orphaned(deployment_ref => $1, worker_id => 'B')",
            DEPLOYMENT)
        assert [r["run_id"] for r in stolen if r["run_id"] is not None] == []
        assert await attacker.fetchval(
            """SELECT zeroth.complete_run(run_id => $1, worker_id => 'A', generation => 1)""",
            run_id) is True

    async def test_settings_a_session_can_set_do_not_move_lease_decisions(self, login):
        worker = await login("worker")
        for setting in ("zeroth.allow_now_override = on", "zeroth_test.now = '2999-01-01'",
                        "TimeZone = 'Pacific/Kiritimati'"):
            await worker.execute(f"SET {setting}")
        await worker.execute("SELECT zeroth.enqueue_run(deployment_ref => $1)", DEPLOYMENT)
        before = await worker.fetchval("SELECT clock_timestamp()")
        row = await worker.fetchrow(
            """SELECT run_id, lease_expires_at FROM zeroth.claim_pending(deployment_ref => $1,
                   worker_id => 'w', lease_seconds => 60)""", DEPLOYMENT)
        after = await worker.fetchval("SELECT clock_timestamp()")
        assert row["run_id"] is not None
        assert before + timedelta(seconds=60) <= row["lease_expires_at"]
        assert row["lease_expires_at"] <= after + timedelta(seconds=60)

    @pytest.mark.parametrize("kind", ["nobody", "worker", "reader"])
    async def test_nobody_but_the_owner_can_replace_the_clock(self, login, kind):
        session = await login(kind)
        state = await sqlstate(session, """CREATE OR REPLACE FUNCTION zeroth._now()
                                               RETURNS timestamptz LANGUAGE sql
                                               RETURN '2999-01-01'::timestamptz""")
        assert state == "42501"  # permission denied for schema zeroth
        # Nor plant a lookalike next to it: PUBLIC has no privilege in the schema.
        assert await sqlstate(session, "CREATE TABLE zeroth.clock (t timestamptz)") == "42501"
