"""A worker cannot pre-empt a DBA's schedule, on a database exactly as shipped (no test clock).

fire_due_schedules keys the run of each fire time ``zeroth-schedule:<id>:<fire time>``. A
zeroth_worker reads a schedule's id and next fire time from list_schedules; if it could enqueue
runs under the next keys (any payload, run_after far away), the schedule would "fire" them and look
healthy while doing nothing. So:

* every public path that takes an idempotency key (enqueue_run, enqueue_runs, admit_run) refuses
  the prefix with ZP011 and creates nothing;
* a run planted under such a key some other way (before 0018 reserved the prefix: played here by
  the superuser's INSERT) does not pass for the fire: the schedule is paused with last_error
  ZP011, records no fire and counts none.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import asyncpg
import pytest

DEADLINE = 60.0  # a bound for the clock to pass a fire time; the loop ends far sooner


def fire_key(schedule_id: object, fire_at: object) -> str:
    """The key fire_due_schedules gives a fire (UTC, microseconds)."""
    return f"zeroth-schedule:{schedule_id}:{fire_at:%Y-%m-%dT%H:%M:%S.%fZ}"


async def planted_keys(worker: asyncpg.Connection, count: int) -> list[str]:
    """What the worker learns from list_schedules: the keys of the next ``count`` fire times."""
    (row,) = await worker.fetch(
        "SELECT schedule_id, next_fire_at FROM zeroth.list_schedules(tenant_id => 'acme')")
    return [fire_key(row["schedule_id"], row["next_fire_at"] + timedelta(seconds=k))
            for k in range(count)]


async def seed(admin: asyncpg.Connection) -> None:
    await admin.execute(
        "SELECT zeroth.create_schedule(name => 'payroll', deployment_ref => 'd', "
        "tenant_id => 'acme', interval_seconds => 1, missed_fire_policy => 'catch_up', "
        "catch_up_limit => 5)")


async def sqlstate(conn: asyncpg.Connection, statement: str, *args: object) -> str:
    try:
        await conn.fetch(statement, *args)
    except asyncpg.PostgresError as exc:
        return exc.sqlstate or "?"
    return "ok"


PLANTS = {
    "enqueue_run": ("SELECT zeroth.enqueue_run(deployment_ref => 'd', tenant_id => 'acme', "
                    "payload => '{\"evil\": true}', run_after => '9999-01-01', "
                    "idempotency_key => $1)"),
    "enqueue_runs": ("SELECT * FROM zeroth.enqueue_runs(deployment_ref => 'd', tenant_id => "
                     "'acme', runs => jsonb_build_array(jsonb_build_object('idempotency_key', "
                     "'mine'), jsonb_build_object('idempotency_key', $1::text, 'run_after', "
                     "'9999-01-01')))"),
    "admit_run": ("SELECT zeroth.admit_run(deployment_ref => 'd', thread_id => 't', "
                  "tenant_id => 'acme', idempotency_key => $1)"),
}


class TestWorker:
    @pytest.mark.parametrize("path", sorted(PLANTS))
    async def test_cannot_enqueue_under_a_schedules_key(self, login, admin, path):
        await seed(admin)
        worker = await login("worker")
        for key in await planted_keys(worker, 3):
            assert await sqlstate(worker, PLANTS[path], key) == "ZP011"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_the_schedule_fires_its_own_runs_after_a_refused_plant(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        keys = await planted_keys(worker, 3)
        assert await sqlstate(worker, PLANTS["enqueue_run"], keys[0]) == "ZP011"
        deadline = time.monotonic() + DEADLINE
        while not await admin.fetchval("SELECT count(*) FROM zeroth.runs"):
            assert time.monotonic() < deadline, "the schedule never fired"
            await worker.fetch("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}')")
            await asyncio.sleep(0.2)
        runs = await admin.fetch("SELECT payload, run_after < '9999-01-01' AS due, schedule_id "
                                 "FROM zeroth.runs")
        schedule_id = await admin.fetchval("SELECT schedule_id FROM zeroth.schedules")
        assert all(json.loads(r["payload"]) == {} and r["due"] for r in runs)
        assert {r["schedule_id"] for r in runs} == {schedule_id}


class TestRunPlantedBeforeTheUpgrade:
    async def test_pauses_the_schedule_instead_of_passing_for_its_fire(self, login, admin):
        await seed(admin)
        worker = await login("worker")
        keys = await planted_keys(worker, 10)
        planted = [
            await admin.fetchval(
                "INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, run_after, "
                "created_at, updated_at, payload, idempotency_key) "
                "VALUES (gen_random_uuid(), 'acme', 'd', 'pending', '9999-01-01', now(), now(), "
                "'{\"evil\": true}', $1) RETURNING run_id", key)
            for key in keys]
        deadline = time.monotonic() + DEADLINE
        while True:
            row = await admin.fetchrow("SELECT paused, fire_count FROM zeroth.schedules")
            if row["paused"] or row["fire_count"] > 0:
                break
            assert time.monotonic() < deadline, "the schedule never came due"
            await worker.fetch("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}')")
            await asyncio.sleep(0.2)
        schedule = await admin.fetchrow(
            "SELECT paused, fire_count, last_error FROM zeroth.schedules")
        assert schedule["paused"] is True
        assert schedule["fire_count"] == 0
        assert schedule["last_error"].startswith("ZP011: ")
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.schedule_fires WHERE run_id = ANY ($1::uuid[])",
            planted) == 0
        # Nothing else was made under the schedule's name, and the planted runs are untouched.
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == len(planted)
        listed = await worker.fetchrow(
            "SELECT paused, last_error FROM zeroth.list_schedules(tenant_id => 'acme')")
        assert listed["paused"] is True
        assert listed["last_error"] == schedule["last_error"]
