"""The registry of deployments (zeroth.deployments): register_deployment (an application's
declaration), set_deployment_defaults (a DBA's), list_deployments, the audit log
zeroth.deployment_changes, and the defaults enqueue_run / enqueue_runs take from it when the
caller passes NULL. Bad input changes nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, T0, WORKER, at, claim, enqueue, make_run, run_row, wait_until

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


# -- the retry policy and default lease (migration 0020) ----------------------------------------

REGISTER_POLICY = """SELECT * FROM zeroth.register_deployment(deployment_ref => $1,
    max_attempts => 3, priority => 0, retry_base_seconds => $2, retry_max_seconds => $3,
    lease_seconds => $4)"""
SET_POLICY = """SELECT * FROM zeroth.set_deployment_defaults(deployment_ref => $1,
    retry_base_seconds => $2, retry_max_seconds => $3, lease_seconds => $4, unset => $5)"""
DAYS_30 = 30 * 86400.0


async def register_policy(conn: asyncpg.Connection, base: float | None = None,
                          cap: float | None = None, lease: float | None = None,
                          deployment: str = DEPLOYMENT) -> asyncpg.Record:
    return await conn.fetchrow(REGISTER_POLICY, deployment, base, cap, lease)  # type: ignore[no-any-return]


async def set_policy(conn: asyncpg.Connection, base: float | None = None,
                     cap: float | None = None, lease: float | None = None,
                     unset: list[str] | None = None,
                     deployment: str = DEPLOYMENT) -> asyncpg.Record:
    return await conn.fetchrow(SET_POLICY, deployment, base, cap, lease, unset)  # type: ignore[no-any-return]


async def policy(conn: asyncpg.Connection, deployment: str = DEPLOYMENT) -> tuple[Any, ...]:
    row = await conn.fetchrow(
        "SELECT retry_base_seconds, retry_max_seconds, lease_seconds "
        "FROM zeroth.list_deployments(deployment_ref => $1)", deployment)
    return tuple(row) if row else ()


class TestRetryPolicyAndLeaseInTheRegistry:
    async def test_a_registration_stores_the_policy_and_the_audit_records_it(self, conn):
        result = await register_policy(conn, 5, 60, 120)
        assert (result["outcome"], result["retry_base_seconds"], result["retry_max_seconds"],
                result["lease_seconds"]) == ("created", 5, 60, 120)
        assert await policy(conn) == (5, 60, 120)
        assert (await changes(conn))[0]["new"] == {
            "max_attempts": 3, "priority": 0, "managed_by": "app", "retry_base_seconds": 5,
            "retry_max_seconds": 60, "lease_seconds": 120}

    async def test_a_registration_without_a_policy_sets_it_back_to_not_set(self, conn):
        await register_policy(conn, 5, 60, 120)
        again = await register_policy(conn)
        assert (again["outcome"], again["version"]) == ("updated", 2)
        assert await policy(conn) == (None, None, None)
        last = (await changes(conn))[-1]
        assert (last["old"]["lease_seconds"], "lease_seconds" in last["new"]) == (120, False)
        assert json.loads(again["previous"])["retry_base_seconds"] == 5

    async def test_the_same_policy_again_changes_nothing(self, conn):
        await register_policy(conn, 5, 60, 120)
        assert (await register_policy(conn, 5, 60, 120))["outcome"] == "unchanged"
        assert len(await changes(conn)) == 1

    async def test_the_old_three_argument_call_still_works(self, conn):
        await register_policy(conn, 5, 60, 120)
        result = await register(conn, 3, 0)
        # A registration states the whole policy: the older client declares none.
        assert (result["outcome"], result["lease_seconds"]) == ("updated", None)

    async def test_a_dba_sets_keeps_and_unsets_single_values_each_audited(self, conn):
        await register_policy(conn, 5, 60, 120)
        lease = await set_policy(conn, lease=30)
        assert (lease["outcome"], lease["managed_by"], lease["version"]) == ("updated", "sql", 2)
        assert await policy(conn) == (5, 60, 30)  # NULL kept the retry policy
        unset = await set_policy(conn, unset=["retry_base_seconds", "retry_max_seconds"])
        assert (unset["outcome"], unset["version"]) == ("updated", 3)
        assert await policy(conn) == (None, None, 30)
        audit = await changes(conn)
        assert [c["version"] for c in audit] == [1, 2, 3]
        assert [c["via"] for c in audit] == ["register_deployment", "set_deployment_defaults",
                                             "set_deployment_defaults"]
        assert (audit[1]["old"]["lease_seconds"], audit[1]["new"]["lease_seconds"]) == (120, 30)
        assert audit[2]["old"]["retry_max_seconds"] == 60
        assert "retry_max_seconds" not in audit[2]["new"]
        assert (await set_policy(conn, lease=30))["outcome"] == "unchanged"
        assert len(await changes(conn)) == 3

    async def test_a_dba_sets_a_policy_on_a_new_row(self, conn):
        result = await set_policy(conn, base=2, cap=20)
        assert (result["outcome"], result["max_attempts"], result["priority"],
                result["lease_seconds"]) == ("created", 3, 0, None)
        assert await policy(conn) == (2, 20, None)

    @pytest.mark.parametrize("policy_args", [
        pytest.param((-1.0, 60.0, None), id="base-negative"),
        pytest.param((61.0, 60.0, None), id="base-above-max"),
        pytest.param((600.0, None, None), id="base-above-the-300-max-it-falls-back-to"),
        pytest.param((None, 0.5, None), id="max-below-the-1-base-it-falls-back-to"),
        pytest.param((None, DAYS_30 + 1, None), id="max-above-30-days"),
        pytest.param((float("nan"), None, None), id="base-nan"),
        pytest.param((None, float("nan"), None), id="max-nan"),
        pytest.param((None, float("inf"), None), id="max-infinite"),
        pytest.param((None, None, 0.0), id="lease-0"),
        pytest.param((None, None, -5.0), id="lease-negative"),
        pytest.param((None, None, 86401.0), id="lease-above-a-day"),
        pytest.param((None, None, float("nan")), id="lease-nan"),
    ])
    async def test_a_bad_policy_raises_zp008_and_changes_nothing(self, conn, policy_args):
        await register_policy(conn, 5, 60, 120)
        before = await snapshot(conn), await policy(conn)
        for statement in (REGISTER_POLICY, SET_POLICY):
            args = (DEPLOYMENT, *policy_args) + ((None,) if statement is SET_POLICY else ())
            with pytest.raises(asyncpg.PostgresError) as caught:
                async with conn.transaction():
                    await conn.fetchrow(statement, *args)
            assert caught.value.sqlstate == "ZP008", statement
            assert (await snapshot(conn), await policy(conn)) == before

    @pytest.mark.parametrize("call", [
        pytest.param((None, None, None, ["priority"]), id="unset-a-column-it-may-not"),
        pytest.param((None, None, None, ["lease_seconds", None]), id="unset-null-element"),
        pytest.param((None, None, 30.0, ["lease_seconds"]), id="set-and-unset-one-column"),
        pytest.param((70.0, None, None, None), id="merged-base-above-the-kept-max"),
        pytest.param((None, 2.0, None, None), id="merged-max-below-the-kept-base"),
        pytest.param((None, None, None, ["retry_max_seconds"]), id="unset-leaves-base-above-300"),
    ])
    async def test_a_bad_set_raises_zp008_and_changes_nothing(self, conn, call):
        await set_policy(conn, base=5, cap=60, lease=120)
        await set_policy(conn, base=400, cap=500, deployment="high")
        before = await snapshot(conn), await policy(conn), await policy(conn, "high")
        deployment = "high" if call[3] == ["retry_max_seconds"] else DEPLOYMENT
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetchrow(SET_POLICY, deployment, *call)
        assert caught.value.sqlstate == "ZP008"
        assert (await snapshot(conn), await policy(conn), await policy(conn, "high")) == before

    async def test_the_table_refuses_a_bad_policy_a_dba_writes_by_hand(self, conn):
        await register_policy(conn, 5, 60, 120)
        for assignment in ("lease_seconds = 0", "retry_base_seconds = 61",
                           "retry_max_seconds = 'NaN'"):
            with pytest.raises(asyncpg.CheckViolationError):
                async with conn.transaction():
                    await conn.execute(f"UPDATE zeroth.deployments SET {assignment}")


FAIL_NULL = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
    error => '{"reason": "boom"}', retryable => true, retry_base_seconds => $4,
    retry_max_seconds => $5, now_override => $6)"""
FAIL_OMITTED = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
    error => '{"reason": "boom"}', now_override => $4)"""


async def delay_after_failure(conn: asyncpg.Connection, run_id: Any, generation: int,
                              base: float | None = None, cap: float | None = None,
                              omitted: bool = False) -> float:
    """Fail the running run (lease of WORKER at generation) at T0; the retry's delay."""
    if omitted:
        outcome = await conn.fetchval(FAIL_OMITTED, run_id, WORKER, generation, T0)
    else:
        outcome = await conn.fetchval(FAIL_NULL, run_id, WORKER, generation, base, cap, T0)
    assert outcome == "retry_scheduled"
    return float((await run_row(conn, run_id))["run_after"].timestamp() - T0.timestamp())


async def rerun(conn: asyncpg.Connection, run_id: Any) -> int:
    """Claim and start the (retry of the) run at its run_after; its new generation."""
    row = await run_row(conn, run_id)
    claimed = [r for r in await claim(conn, now=row["run_after"], batch_size=10)
               if r["run_id"] == run_id]
    await conn.fetchval("""SELECT zeroth_test.start_run(run_id => $1, worker_id => $2,
        generation => $3, now_override => $4)""", run_id, WORKER,
                        claimed[0]["lease_generation"], row["run_after"])
    return int(claimed[0]["lease_generation"])


class TestFailRunTakesTheRegisteredRetryPolicy:
    """The first retry's delay is base * 2^0 with equal jitter: in [base / 2, base]."""

    async def test_a_failure_without_a_policy_uses_the_registered_one(self, conn):
        await register_policy(conn, 100, 200)
        lease = await make_run(conn, "running", lease_seconds=3600)
        assert 50 <= await delay_after_failure(conn, lease.run_id, lease.generation,
                                               omitted=True) <= 100

    async def test_null_arguments_use_the_registered_policy_and_its_cap(self, conn):
        await register_policy(conn, 100, 100)
        lease = await make_run(conn, "running", lease_seconds=3600, max_attempts=5)
        assert 50 <= await delay_after_failure(conn, lease.run_id, lease.generation) <= 100
        generation = await rerun(conn, lease.run_id)
        row = await run_row(conn, lease.run_id)
        assert await conn.fetchval(FAIL_NULL, lease.run_id, WORKER, generation, None, None,
                                   row["lease_acquired_at"]) == "retry_scheduled"
        delay = ((await run_row(conn, lease.run_id))["run_after"]
                 - row["lease_acquired_at"]).total_seconds()
        assert 50 <= delay <= 100  # base 100 * 2 capped at the registered 100

    async def test_without_a_registered_policy_the_fallback_is_1_and_300(self, conn):
        await register_policy(conn, lease=600)  # a row, with no retry policy
        lease = await make_run(conn, "running", lease_seconds=3600)
        assert 0.5 <= await delay_after_failure(conn, lease.run_id, lease.generation) <= 1
        unregistered = await make_run(conn, "running", deployment_ref="nobody",
                                      lease_seconds=3600)
        assert 0.5 <= await delay_after_failure(conn, unregistered.run_id,
                                                unregistered.generation) <= 1

    async def test_an_explicit_policy_wins_over_the_registered_one(self, conn):
        await register_policy(conn, 100, 200)
        explicit = await make_run(conn, "running", lease_seconds=3600)
        assert 5 <= await delay_after_failure(conn, explicit.run_id, explicit.generation,
                                              10, 20) <= 10

    async def test_a_change_of_policy_applies_to_the_next_failure_of_a_run_enqueued_before(
            self, conn):
        await register_policy(conn, 100, 100000)
        lease = await make_run(conn, "running", lease_seconds=3600, max_attempts=5)
        assert 50 <= await delay_after_failure(conn, lease.run_id, lease.generation) <= 100
        await set_policy(conn, base=1000)
        generation = await rerun(conn, lease.run_id)
        row = await run_row(conn, lease.run_id)
        outcome = await conn.fetchval(FAIL_NULL, lease.run_id, WORKER, generation, None, None,
                                      row["lease_acquired_at"])
        assert outcome == "retry_scheduled"
        delay = ((await run_row(conn, lease.run_id))["run_after"]
                 - row["lease_acquired_at"]).total_seconds()
        assert 1000 <= delay <= 2000  # the second attempt: base 1000 * 2, with jitter

    async def test_one_null_side_takes_the_registered_one_and_a_bad_pair_raises_zp008(self, conn):
        await register_policy(conn, 100, 200)
        lease = await make_run(conn, "running", lease_seconds=3600)
        before = dict(await run_row(conn, lease.run_id))
        # max 50 against the registered base 100; base 250 against the registered max 200
        # (either would pass against the fallbacks 1 / 300, so the registered side was read).
        for base, cap in ((None, 50), (250, None)):
            with pytest.raises(asyncpg.PostgresError) as caught:
                async with conn.transaction():
                    await conn.fetchval(FAIL_NULL, lease.run_id, WORKER, lease.generation, base,
                                        cap, T0)
            assert caught.value.sqlstate == "ZP008"
            assert dict(await run_row(conn, lease.run_id)) == before


CLAIMS = {
    "claim_pending": """SELECT run_id, lease_expires_at FROM zeroth_test.claim_pending(
        deployment_ref => $1, worker_id => 'w', now_override => $2 LEASE)""",
    "claim_and_start": """SELECT run_id, lease_expires_at FROM zeroth_test.claim_and_start(
        deployment_ref => $1, worker_id => 'w', now_override => $2 LEASE)""",
    "complete_and_claim": """SELECT (claimed).run_id, (claimed).lease_expires_at
        FROM zeroth_test.complete_and_claim(deployment_ref => $1, worker_id => 'w',
        run_ids => '{}', generations => '{}', outputs => '{}', now_override => $2 LEASE)""",
    "claim_and_start_scopes": """SELECT run_id, lease_expires_at
        FROM zeroth_test.claim_and_start_scopes(deployment_refs => ARRAY[$1], worker_id => 'w',
        now_override => $2 LEASE)""",
}


def claim_query(function: str, lease: float | None = None) -> str:
    given = "" if lease is None else f", lease_seconds => {lease}"
    return CLAIMS[function].replace(" LEASE", given)


def lease_length(rows: list[asyncpg.Record]) -> float:
    claimed = [r for r in rows if r["run_id"] is not None]
    assert len(claimed) == 1, rows
    return float((claimed[0]["lease_expires_at"] - T0).total_seconds())


class TestClaimsTakeTheRegisteredLease:
    @pytest.mark.parametrize("function", list(CLAIMS))
    async def test_a_claim_without_a_lease_gets_the_registered_one(self, conn, function):
        await register_policy(conn, lease=900)
        await enqueue(conn)
        assert lease_length(await conn.fetch(claim_query(function), DEPLOYMENT, T0)) == 900

    @pytest.mark.parametrize("function", list(CLAIMS))
    async def test_an_explicit_lease_wins(self, conn, function):
        await register_policy(conn, lease=900)
        await enqueue(conn)
        query = claim_query(function, 45)
        assert lease_length(await conn.fetch(query, DEPLOYMENT, T0)) == 45

    @pytest.mark.parametrize("function", list(CLAIMS))
    async def test_without_a_registered_lease_a_claim_gets_60_seconds(self, conn, function):
        await register_policy(conn, 5, 60)
        await enqueue(conn)
        assert lease_length(await conn.fetch(claim_query(function), DEPLOYMENT, T0)) == 60

    @pytest.mark.parametrize("function", list(CLAIMS))
    async def test_a_bad_explicit_lease_still_raises_zp008(self, conn, function):
        await enqueue(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            await conn.fetch(claim_query(function, 0), DEPLOYMENT, T0)
        assert caught.value.sqlstate == "ZP008"

    async def test_a_fleet_claim_gives_each_deployment_its_own_lease(self, conn):
        await register_policy(conn, lease=900, deployment="slow")
        await register_policy(conn, lease=30, deployment="fast")
        for deployment in ("slow", "fast", "plain"):
            await enqueue(conn, deployment_ref=deployment)
        rows = await conn.fetch(
            """SELECT deployment_ref, lease_expires_at FROM zeroth_test.claim_and_start_scopes(
                   deployment_refs => ARRAY['slow', 'fast', 'plain'], worker_id => 'w',
                   batch_size => 10, now_override => $1) WHERE run_id IS NOT NULL""", T0)
        assert {r["deployment_ref"]: (r["lease_expires_at"] - T0).total_seconds()
                for r in rows} == {"slow": 900, "fast": 30, "plain": 60}

    async def test_an_orphan_recovery_without_a_lease_gets_the_registered_one(self, conn):
        await register_policy(conn, lease=900)
        lease = await make_run(conn, "running", lease_seconds=10)
        later = at(100)
        one = await conn.fetch(
            """SELECT run_id, lease_expires_at FROM zeroth_test.claim_orphaned(
                   deployment_ref => $1, worker_id => 'w2', now_override => $2)""",
            DEPLOYMENT, later)
        assert [(r["run_id"], (r["lease_expires_at"] - later).total_seconds())
                for r in one if r["run_id"]] == [(lease.run_id, 900)]
        again = at(2000)
        many = await conn.fetch(
            """SELECT run_id, lease_expires_at FROM zeroth_test.claim_orphaned_scopes(
                   deployment_refs => ARRAY[$1], worker_id => 'w3', now_override => $2)""",
            DEPLOYMENT, again)
        assert [(r["run_id"], (r["lease_expires_at"] - again).total_seconds())
                for r in many if r["run_id"]] == [(lease.run_id, 900)]

    async def test_an_admitted_and_owned_run_gets_the_registered_lease(self, conn):
        await register_policy(conn, lease=900)
        row = await conn.fetchrow(
            """SELECT * FROM zeroth_test.admit_run(deployment_ref => $1, thread_id => 't',
                   worker_id => 'w', now_override => $2)""", DEPLOYMENT, T0)
        assert (row["lease_expires_at"] - T0).total_seconds() == 900


class TestConcurrentPolicyChanges:
    async def test_two_sessions_changing_one_deployments_policy_are_both_audited_in_turn(
            self, connect):
        first, second, watcher = await connect(), await connect(), await connect()
        await first.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'raced', "
                            "lease_seconds => 10)")
        # The first session holds the row (its change is not committed) while the second asks
        # for another change: the second waits for the row, then changes what the first left.
        transaction = first.transaction()
        await transaction.start()
        await first.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'raced', "
                            "lease_seconds => 20)")
        waiting = asyncio.ensure_future(second.execute(
            "SELECT zeroth.set_deployment_defaults(deployment_ref => 'raced', "
            "retry_base_seconds => 7)"))
        await wait_until_waiting(watcher, "raced")
        assert not waiting.done()
        await transaction.commit()
        await waiting
        rows = await first.fetch(
            "SELECT version, old_values::text AS old, new_values::text AS new "
            "FROM zeroth.deployment_changes WHERE deployment_ref = 'raced' ORDER BY version")
        audit = [(r["version"], json.loads(r["old"] or "null"), json.loads(r["new"]))
                 for r in rows]
        assert [version for version, _, _ in audit] == [1, 2, 3]
        assert (audit[1][1]["lease_seconds"], audit[1][2]["lease_seconds"]) == (10, 20)
        # The second change saw the first's result: its old values hold lease 20.
        assert (audit[2][1]["lease_seconds"], audit[2][2]["lease_seconds"],
                audit[2][2]["retry_base_seconds"]) == (20, 20, 7)
        row = await first.fetchrow("SELECT version, lease_seconds, retry_base_seconds "
                                   "FROM zeroth.deployments WHERE deployment_ref = 'raced'")
        assert tuple(row) == (3, 20, 7)


async def wait_until_waiting(watcher: asyncpg.Connection, deployment: str) -> None:
    """Until another session waits for a lock (the registry row): pg_stat_activity says so.

    ``watcher`` is in no transaction: a session reads pg_stat_activity once per transaction, so
    one polling inside its open transaction sees its first answer for ever (on a loaded machine,
    taken before the other session had started to wait)."""
    async def waiting() -> bool:
        return bool(await watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%set_deployment_defaults%' AND pid <> pg_backend_pid()"))

    await wait_until(waiting, f"a session to wait for the row of {deployment}", within=60)
