"""The registry of deployments (zeroth.deployments): register_deployment (an application's
declaration), set_deployment_defaults (a DBA's), list_deployments, the audit log
zeroth.deployment_changes, and the defaults enqueue_run / enqueue_runs take from it when the
caller passes NULL. Bad input changes nothing."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, T0, enqueue, make_run, run_row

REGISTER = """SELECT * FROM zeroth.register_deployment(deployment_ref => $1, max_attempts => $2,
    priority => $3)"""
SET = """SELECT * FROM zeroth.set_deployment_defaults(deployment_ref => $1, max_attempts => $2,
    priority => $3, managed_by => $4)"""


async def register(conn: asyncpg.Connection, max_attempts: int = 5, priority: int = 7,
                   deployment: str = DEPLOYMENT) -> asyncpg.Record:
    return await conn.fetchrow(REGISTER, deployment, max_attempts, priority)  # type: ignore[no-any-return]


async def set_defaults(conn: asyncpg.Connection, max_attempts: int | None = None,
                       priority: int | None = None, managed_by: str = "sql",
                       deployment: str = DEPLOYMENT) -> asyncpg.Record:
    return await conn.fetchrow(SET, deployment, max_attempts, priority, managed_by)  # type: ignore[no-any-return]


async def registry(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in await conn.fetch(
        "SELECT deployment_ref, max_attempts, priority, managed_by, version "
        "FROM zeroth.deployments ORDER BY 1")]


async def changes(conn: asyncpg.Connection, deployment: str = DEPLOYMENT) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        "SELECT version, via, changed_by, acting_role, old_values::text AS old, "
        "new_values::text AS new FROM zeroth.deployment_changes WHERE deployment_ref = $1 "
        "ORDER BY version", deployment)
    return [{**dict(r), "old": r["old"] and json.loads(r["old"]), "new": json.loads(r["new"])}
            for r in rows]


async def snapshot(conn: asyncpg.Connection) -> tuple[Any, ...]:
    return (await registry(conn),
            await conn.fetchval("SELECT count(*) FROM zeroth.deployment_changes"),
            await conn.fetchval("SELECT count(*) FROM zeroth.runs"))


class TestRegisterDeployment:
    async def test_a_first_registration_creates_the_row_and_audits_it(self, conn):
        result = await register(conn, 5, 7)
        assert (result["outcome"], result["max_attempts"], result["priority"],
                result["managed_by"], result["version"], result["previous"]) == (
            "created", 5, 7, "app", 1, None)
        assert await registry(conn) == [{"deployment_ref": DEPLOYMENT, "max_attempts": 5,
                                         "priority": 7, "managed_by": "app", "version": 1}]
        user = await conn.fetchval("SELECT session_user::text")
        assert await changes(conn) == [{
            "version": 1, "via": "register_deployment", "changed_by": user, "acting_role": None,
            "old": None, "new": {"max_attempts": 5, "priority": 7, "managed_by": "app"}}]

    async def test_the_same_registration_again_changes_nothing_and_writes_no_audit_row(self, conn):
        await register(conn, 5, 7)
        again = await register(conn, 5, 7)
        assert (again["outcome"], again["version"]) == ("unchanged", 1)
        assert len(await changes(conn)) == 1

    async def test_a_registration_with_other_values_wins_and_records_old_and_new(self, conn):
        await register(conn, 5, 7)
        second = await register(conn, 2, 1)
        assert (second["outcome"], second["max_attempts"], second["priority"],
                second["version"]) == ("updated", 2, 1, 2)
        assert json.loads(second["previous"]) == {"max_attempts": 5, "priority": 7,
                                                  "managed_by": "app"}
        last = (await changes(conn))[-1]
        assert (last["version"], last["old"], last["new"]) == (
            2, {"max_attempts": 5, "priority": 7, "managed_by": "app"},
            {"max_attempts": 2, "priority": 1, "managed_by": "app"})

    async def test_a_row_a_dba_set_is_kept(self, conn):
        await register(conn, 5, 7)
        await set_defaults(conn, max_attempts=9)
        kept = await register(conn, 5, 7)
        assert (kept["outcome"], kept["max_attempts"], kept["priority"], kept["managed_by"]) == (
            "kept", 9, 7, "sql")
        assert len(await changes(conn)) == 2

    async def test_the_acting_role_of_a_set_role_is_recorded(self, conn):
        await conn.execute("SET LOCAL ROLE zeroth_owner")
        await register(conn)
        assert (await changes(conn))[0]["acting_role"] == "zeroth_owner"

    @pytest.mark.parametrize("args", [
        pytest.param((None, 3, 0), id="deployment-null"),
        pytest.param(("", 3, 0), id="deployment-empty"),
        pytest.param(("d" * 201, 3, 0), id="deployment-201-chars"),
        pytest.param((DEPLOYMENT, 0, 0), id="max-attempts-0"),
        pytest.param((DEPLOYMENT, 1001, 0), id="max-attempts-1001"),
        pytest.param((DEPLOYMENT, None, 0), id="max-attempts-null"),
        pytest.param((DEPLOYMENT, 3, None), id="priority-null"),
    ])
    async def test_bad_input_raises_zp008_and_changes_nothing(self, conn, args):
        await register(conn, 5, 7)
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetchrow(REGISTER, *args)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before


class TestSetDeploymentDefaults:
    async def test_a_dba_creates_a_row_with_the_sql_fallbacks_for_what_it_leaves_null(self, conn):
        result = await set_defaults(conn, priority=4)
        assert (result["outcome"], result["max_attempts"], result["priority"],
                result["managed_by"]) == ("created", 3, 4, "sql")
        assert (await changes(conn))[0]["via"] == "set_deployment_defaults"

    async def test_null_keeps_the_current_value(self, conn):
        await register(conn, 5, 7)
        result = await set_defaults(conn, max_attempts=8)
        assert (result["outcome"], result["max_attempts"], result["priority"],
                result["version"]) == ("updated", 8, 7, 2)

    async def test_managed_by_app_hands_the_row_back_to_registrations(self, conn):
        await set_defaults(conn, max_attempts=8)
        handed = await set_defaults(conn, managed_by="app")
        assert (handed["outcome"], handed["max_attempts"], handed["managed_by"]) == (
            "updated", 8, "app")
        assert (await register(conn, 5, 7))["outcome"] == "updated"
        assert (await registry(conn))[0]["max_attempts"] == 5

    async def test_setting_the_same_values_changes_nothing(self, conn):
        await set_defaults(conn, max_attempts=8, priority=1)
        again = await set_defaults(conn, max_attempts=8, priority=1)
        assert (again["outcome"], again["version"]) == ("unchanged", 1)
        assert len(await changes(conn)) == 1

    @pytest.mark.parametrize("args", [
        pytest.param((None, 3, 0, "sql"), id="deployment-null"),
        pytest.param(("", 3, 0, "sql"), id="deployment-empty"),
        pytest.param((DEPLOYMENT, 0, 0, "sql"), id="max-attempts-0"),
        pytest.param((DEPLOYMENT, 1001, 0, "sql"), id="max-attempts-1001"),
        pytest.param((DEPLOYMENT, 3, 0, "dba"), id="managed-by-unknown"),
        pytest.param((DEPLOYMENT, 3, 0, None), id="managed-by-null"),
    ])
    async def test_bad_input_raises_zp008_and_changes_nothing(self, conn, args):
        await register(conn, 5, 7)
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetchrow(SET, *args)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before


class TestListDeployments:
    async def test_lists_every_deployment_by_name_or_the_one_named(self, conn):
        await register(conn, 5, 7, deployment="b")
        await register(conn, 2, 0, deployment="a")
        listed = await conn.fetch(
            "SELECT deployment_ref, max_attempts FROM zeroth.list_deployments()")
        assert [tuple(r) for r in listed] == [("a", 2), ("b", 5)]
        one = await conn.fetch(
            "SELECT deployment_ref FROM zeroth.list_deployments(deployment_ref => 'b')")
        assert [r[0] for r in one] == ["b"]
        assert await conn.fetch(
            "SELECT * FROM zeroth.list_deployments(deployment_ref => 'c')") == []

    async def test_a_bad_name_raises_zp008(self, conn):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetch("SELECT * FROM zeroth.list_deployments(deployment_ref => '')")
        assert caught.value.sqlstate == "ZP008"


class TestEnqueueTakesTheRegisteredDefaults:
    async def test_a_run_enqueued_without_values_gets_the_registered_ones(self, conn):
        await register(conn, 5, 7)
        run = await run_row(conn, await enqueue(conn))
        assert (run["max_attempts"], run["priority"]) == (5, 7)

    async def test_an_explicit_value_wins_over_the_registry(self, conn):
        await register(conn, 5, 7)
        run = await run_row(conn, await enqueue(conn, max_attempts=2, priority=-1))
        assert (run["max_attempts"], run["priority"]) == (2, -1)
        mixed = await run_row(conn, await enqueue(conn, max_attempts=2))
        assert (mixed["max_attempts"], mixed["priority"]) == (2, 7)

    async def test_an_unregistered_deployment_gets_three_attempts_and_priority_zero(self, conn):
        await register(conn, 5, 7, deployment="other")
        run = await run_row(conn, await enqueue(conn))
        assert (run["max_attempts"], run["priority"]) == (3, 0)

    async def test_a_thread_run_gets_the_registered_defaults(self, conn):
        await register(conn, 5, 7)
        first = await run_row(conn, await enqueue(conn, thread_id="t1"))
        queued = await run_row(conn, await enqueue(conn, thread_id="t1"))
        assert (first["max_attempts"], first["priority"]) == (5, 7)
        assert (queued["status"], queued["max_attempts"], queued["priority"]) == ("waiting", 5, 7)

    async def test_a_run_keeps_its_values_when_the_registry_changes_later(self, conn):
        await register(conn, 5, 7)
        run_id = await enqueue(conn)
        await set_defaults(conn, max_attempts=9, priority=1)
        run = await run_row(conn, run_id)
        assert (run["max_attempts"], run["priority"]) == (5, 7)
        assert (await run_row(conn, await enqueue(conn)))["max_attempts"] == 9

    async def test_enqueue_runs_gives_items_without_values_the_registered_defaults(self, conn):
        await register(conn, 5, 7)
        items = [{}, {"max_attempts": 2}, {"priority": 1}, {"max_attempts": None},
                 {"thread_id": "t2"}]
        rows = await conn.fetch(
            "SELECT run_id FROM zeroth_test.enqueue_runs(deployment_ref => $1, runs => $2::jsonb, "
            "now_override => $3) ORDER BY ordinality", DEPLOYMENT, json.dumps(items), T0)
        got = [await run_row(conn, r["run_id"]) for r in rows]
        assert [(r["max_attempts"], r["priority"]) for r in got] == [
            (5, 7), (2, 7), (5, 1), (5, 7), (5, 7)]

    async def test_enqueue_runs_of_an_unregistered_deployment_gets_three_and_zero(self, conn):
        rows = await conn.fetch(
            "SELECT run_id FROM zeroth_test.enqueue_runs(deployment_ref => $1, runs => $2::jsonb, "
            "now_override => $3)", DEPLOYMENT, json.dumps([{}]), T0)
        run = await run_row(conn, rows[0]["run_id"])
        assert (run["max_attempts"], run["priority"]) == (3, 0)

    async def test_a_schedules_fire_keeps_the_schedules_own_values(self, conn):
        # fire_due_schedules passes the schedule's max_attempts and priority: explicit, so they
        # win over the registry (a schedule states its runs' values itself).
        await register(conn, 5, 7)
        await conn.execute(
            "SELECT zeroth_test.create_schedule(name => 's', deployment_ref => $1, "
            "interval_seconds => 60, max_attempts => 2, priority => 0, now_override => $2)",
            DEPLOYMENT, T0)
        await conn.fetch("SELECT * FROM zeroth_test.fire_due_schedules(deployment_refs => $1, "
                         "now_override => $2)", [DEPLOYMENT], T0.replace(minute=5))
        rows = await conn.fetch("SELECT max_attempts, priority FROM zeroth.runs")
        assert [tuple(r) for r in rows] == [(2, 0)]


class TestChildRunsTakeTheRegisteredDefaults:
    async def test_a_child_started_without_values_gets_its_deployments_defaults(self, conn):
        await register(conn, 5, 7, deployment="child")
        parent = await make_run(conn, "running")
        start = ("SELECT child_run_id FROM zeroth_test.start_child_run(run_id => $1, "
                 "worker_id => $2, generation => $3, step_key => $4, deployment_ref => 'child', "
                 "now_override => $5{})")
        default = await conn.fetchval(start.format(""), parent.run_id, parent.worker_id,
                                      parent.generation, "a", T0)
        explicit = await conn.fetchval(start.format(", max_attempts => 2"), parent.run_id,
                                       parent.worker_id, parent.generation, "b", T0)
        assert (await run_row(conn, default))["max_attempts"] == 5
        assert (await run_row(conn, default))["priority"] == 7
        assert ((await run_row(conn, explicit))["max_attempts"],
                (await run_row(conn, explicit))["priority"]) == (2, 7)
