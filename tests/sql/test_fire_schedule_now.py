"""zeroth.fire_schedule_now: an operator's "run it now" (the dashboard's schedules page): one run
of the schedule at once, as a fire makes it, and the schedule's own cadence untouched, so no
regular fire is skipped or repeated; bad input and unknown names are refused and change nothing."""

from __future__ import annotations

import json

import asyncpg
import pytest
from helpers import T0, at

NOW = """SELECT * FROM zeroth_test.fire_schedule_now(name => $1, tenant_id => $2,
    now_override => $3)"""
FIRE = """SELECT * FROM zeroth_test.fire_due_schedules(deployment_refs => '{d}',
    now_override => $1)"""


async def create(conn: asyncpg.Connection, name: str = "s", *, tenant: str | None = None,
                 paused: bool = False) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth_test.create_schedule(name => $1, deployment_ref => 'd',
               interval_seconds => 60, tenant_id => $2, payload => '{"job": "report"}',
               priority => 3, max_attempts => 5, paused => $3, now_override => $4)""",
        name, tenant, paused, T0)


async def schedule_row(conn: asyncpg.Connection, name: str = "s") -> tuple[object, ...]:
    row = await conn.fetchrow(
        """SELECT next_fire_at, last_fire_at, fire_count, paused, updated_at
             FROM zeroth.schedules WHERE name = $1""", name)
    return tuple(row)


class TestFireScheduleNow:
    async def test_one_run_now_as_a_fire_makes_it_and_the_cadence_is_untouched(self, conn):
        created = await create(conn)
        before = await schedule_row(conn)
        fired = await conn.fetchrow(NOW, "s", None, at(10))
        assert (fired["schedule_id"], fired["fire_at"], fired["created"],
                fired["next_due_at"]) == (created["schedule_id"], at(10), True, at(60))
        run = await conn.fetchrow(
            """SELECT deployment_ref, status::text AS status, priority, max_attempts,
                      payload::text AS payload, metadata::text AS metadata, schedule_id,
                      idempotency_key
                 FROM zeroth.runs WHERE run_id = $1""", fired["run_id"])
        assert (run["deployment_ref"], run["status"], run["priority"], run["max_attempts"],
                run["schedule_id"]) == ("d", "pending", 3, 5, created["schedule_id"])
        assert json.loads(run["payload"]) == {"job": "report"}
        assert json.loads(run["metadata"])["zeroth_schedule"]["manual"] is True
        key = f"zeroth-schedule:{created['schedule_id']}:manual:"
        assert run["idempotency_key"].startswith(key)
        assert await schedule_row(conn) == before
        # The regular fire at 60 s still happens, once.
        regular = [r for r in await conn.fetch(FIRE, at(61)) if r["run_id"]]
        assert [r["fire_at"] for r in regular] == [at(60)]
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 2

    async def test_a_paused_schedule_can_be_fired_by_hand_and_stays_paused(self, conn):
        await create(conn, paused=True)
        fired = await conn.fetchrow(NOW, "s", None, at(10))
        assert fired["run_id"] is not None
        assert (await schedule_row(conn))[3] is True

    async def test_each_call_is_its_own_run(self, conn):
        await create(conn)
        first = await conn.fetchrow(NOW, "s", None, at(10))
        second = await conn.fetchrow(NOW, "s", None, at(11))
        assert first["run_id"] != second["run_id"]

    @pytest.mark.parametrize(("name", "tenant", "code"), [
        ("missing", None, "ZP009"),
        ("s", "another-tenant", "ZP009"),
        ("", None, "ZP008"),
        (None, None, "ZP008"),
    ])
    async def test_an_unknown_schedule_or_bad_name_is_refused_and_makes_no_run(
            self, conn, name, tenant, code):
        await create(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetchrow(NOW, name, tenant, at(10))
        assert caught.value.sqlstate == code
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_no_role_but_the_owner_may_call_it(self, conn):
        for role in ("zeroth_worker", "zeroth_reader"):
            assert await conn.fetchval(
                "SELECT has_function_privilege($1, 'zeroth.fire_schedule_now(text, text, text)', "
                "'EXECUTE')", role) is False
