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
KEYED = """SELECT * FROM zeroth_test.fire_schedule_now(name => $1, tenant_id => $2,
    idempotency_key => $3, now_override => $4)"""
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
                "SELECT has_function_privilege($1, "
                "'zeroth.fire_schedule_now(text, text, text, text)', 'EXECUTE')", role) is False


class TestIdempotencyKey:
    """issue 31: an operator's double click on "Fire now", or a retried POST or command, carries
    the same key and must not fire twice."""

    async def test_a_repeat_with_the_same_key_returns_the_first_run(self, conn):
        created = await create(conn)
        first = await conn.fetchrow(KEYED, "s", None, "form-1", at(10))
        again = await conn.fetchrow(KEYED, "s", None, "form-1", at(12))
        assert first["created"] is True
        assert (again["run_id"], again["created"]) == (first["run_id"], False)
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 1
        key = await conn.fetchval("SELECT idempotency_key FROM zeroth.runs")
        assert key == f"zeroth-schedule:{created['schedule_id']}:manual:key:form-1"
        # Another key (another form, another command) is another run.
        other = await conn.fetchrow(KEYED, "s", None, "form-2", at(13))
        assert other["created"] is True
        assert other["run_id"] != first["run_id"]

    async def test_one_key_on_two_schedules_is_two_runs(self, conn):
        await create(conn, "a")
        await create(conn, "b")
        a = await conn.fetchrow(KEYED, "a", None, "same", at(10))
        b = await conn.fetchrow(KEYED, "b", None, "same", at(10))
        assert a["run_id"] != b["run_id"]
        assert a["created"]
        assert b["created"]

    async def test_the_three_argument_call_still_works_and_has_one_signature(self, conn):
        await create(conn)
        fired = await conn.fetchrow("SELECT * FROM zeroth.fire_schedule_now('s')")
        assert fired["created"] is True
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'zeroth' AND p.proname = 'fire_schedule_now'") == 1

    @pytest.mark.parametrize("key", ["", "k" * 201, "a\nb", "tab\there", "nul\x7f"])
    async def test_a_bad_key_is_zp008_and_makes_no_run(self, conn, key):
        await create(conn)
        before = await schedule_row(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetchrow(KEYED, "s", None, key, at(10))
        assert caught.value.sqlstate == "ZP008"
        assert "idempotency_key" in str(caught.value)
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0
        assert await schedule_row(conn) == before

    async def test_the_longest_key_is_accepted(self, conn):
        await create(conn)
        fired = await conn.fetchrow(KEYED, "s", None, "k" * 200, at(10))
        assert fired["created"] is True
