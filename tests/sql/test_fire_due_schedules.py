"""zeroth.fire_due_schedules: due fire times become runs exactly once, on the database clock (the
test clock here; tests/adversarial/test_schedule_roles.py and tests/races run on the real one).

The missed-fire policies after an outage (catch_up fires exactly its limit, skip the most recent
fire time within the grace or nothing), a clock stepped back, a DBA moving next_fire_at back,
pauses, scopes, DST nights, and what a run of a schedule carries."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import asyncpg
import pytest
from helpers import T0, at

FIRE = """SELECT * FROM zeroth_test.fire_due_schedules(deployment_refs => $1, tenant_ids => $2,
    now_override => $3)"""


async def schedule(conn: asyncpg.Connection, name: str = "s", *, interval: int | None = 1,
                   cron: str | None = None, policy: str = "catch_up", limit: int | None = 100,
                   tenant: str | None = None, zone: str = "UTC", grace: int = 60,
                   now: datetime = T0, deployment: str = "d") -> asyncpg.Record:
    if cron is not None:
        interval = None
    if policy == "skip":
        limit = None
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth_test.create_schedule(name => $1, deployment_ref => $2,
               cron => $3, interval_seconds => $4, tenant_id => $5, time_zone => $6,
               missed_fire_policy => $7, catch_up_limit => $8, misfire_grace_seconds => $9,
               payload => '{"job": "report"}', metadata => '{"owner": "dba"}',
               now_override => $10)""",
        name, deployment, cron, interval, tenant, zone, policy, limit, grace, now)


async def fire(conn: asyncpg.Connection, now: datetime, *, deployments: tuple[str, ...] = ("d",),
               tenants: list[str] | None = None) -> list[asyncpg.Record]:
    return await conn.fetch(FIRE, list(deployments), tenants, now)  # type: ignore[no-any-return]


def pairwise_steps(times: list[datetime]) -> list[timedelta]:
    return [b - a for a, b in pairwise(times)]


def fired(rows: list[asyncpg.Record]) -> list[datetime]:
    return [r["fire_at"] for r in rows if r["schedule_id"] is not None]


async def run_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM zeroth.runs")  # type: ignore[no-any-return]


class TestFiring:
    async def test_a_due_fire_time_becomes_one_pending_run(self, conn):
        await schedule(conn)
        rows = await fire(conn, at(1))
        assert fired(rows) == [at(1)]
        run = await conn.fetchrow("SELECT * FROM zeroth.runs WHERE run_id = $1", rows[0]["run_id"])
        assert (run["status"], run["deployment_ref"], run["run_after"]) == ("pending", "d", at(1))
        assert json.loads(run["payload"]) == {"job": "report"}
        meta = json.loads(run["metadata"])
        assert meta["owner"] == "dba"
        assert meta["zeroth_schedule"]["name"] == "s"
        assert datetime.fromisoformat(meta["zeroth_schedule"]["fire_at"]) == at(1)
        assert run["idempotency_key"].startswith("zeroth-schedule:")

    async def test_a_second_call_fires_nothing_and_says_when_to_come_back(self, conn):
        await schedule(conn)
        await fire(conn, at(1.5))
        (row,) = await fire(conn, at(1.5))
        assert (row["schedule_id"], row["next_due_at"]) == (None, at(2))
        assert await run_count(conn) == 1

    async def test_nothing_fires_before_its_time(self, conn):
        await schedule(conn, interval=10)
        (row,) = await fire(conn, at(9.999))
        assert (row["schedule_id"], row["next_due_at"]) == (None, at(10))

    async def test_every_row_carries_the_next_due_time(self, conn):
        await schedule(conn, "a", interval=1)
        await schedule(conn, "b", interval=7)
        rows = await fire(conn, at(1))
        assert {r["next_due_at"] for r in rows} == {at(2)}

    async def test_next_fire_at_moves_past_now_and_counts(self, conn):
        await schedule(conn)
        await fire(conn, at(3))
        row = await conn.fetchrow("SELECT * FROM zeroth.schedules")
        assert (row["next_fire_at"], row["last_fire_at"], row["fire_count"]) == (at(4), at(3), 3)

    async def test_a_paused_schedule_never_fires(self, conn):
        await schedule(conn)
        await conn.fetch("SELECT * FROM zeroth.pause_schedule(name => 's')")
        (row,) = await fire(conn, at(100))
        assert (row["schedule_id"], row["next_due_at"]) == (None, None)
        assert await run_count(conn) == 0

    async def test_only_the_deployments_named_are_fired(self, conn):
        await schedule(conn, deployment="other")
        (row,) = await fire(conn, at(5))
        assert row["schedule_id"] is None
        assert fired(await fire(conn, at(5), deployments=("other",)))


class TestMissedFires:
    async def test_catch_up_after_a_ten_second_outage_fires_exactly_its_limit(self, conn):
        await schedule(conn, limit=3)
        assert fired(await fire(conn, at(1))) == [at(1)]
        rows = await fire(conn, at(12))  # nobody fired 2..12: 11 fire times were due
        assert fired(rows) == [at(10), at(11), at(12)]
        assert {r["skipped"] for r in rows} == {8}
        assert await conn.fetchval("SELECT skipped_count FROM zeroth.schedules") == 8
        assert await run_count(conn) == 4

    async def test_skip_fires_the_most_recent_due_time_within_the_grace(self, conn):
        await schedule(conn, cron="0 * * * *", policy="skip", grace=60)
        rows = await fire(conn, T0 + timedelta(hours=4, seconds=10))
        assert fired(rows) == [T0 + timedelta(hours=4)]
        assert rows[0]["skipped"] == 3

    async def test_skip_fires_nothing_when_even_the_latest_is_older_than_the_grace(self, conn):
        await schedule(conn, cron="0 * * * *", policy="skip", grace=60)
        (row,) = await fire(conn, T0 + timedelta(hours=4, seconds=61))
        assert (row["schedule_id"], row["next_due_at"]) == (None, T0 + timedelta(hours=5))
        assert await conn.fetchval("SELECT skipped_count FROM zeroth.schedules") == 4

    async def test_catch_up_of_a_cron_schedule_after_a_long_outage_is_bounded(self, conn):
        await schedule(conn, cron="* * * * *", limit=5)
        rows = await fire(conn, T0 + timedelta(days=3, seconds=30))  # 4320 minutes missed
        assert fired(rows) == [T0 + timedelta(days=3, minutes=-m) for m in (4, 3, 2, 1, 0)]

    async def test_a_long_outage_of_a_dense_cron_schedule_catches_up_the_latest(self, conn):
        # 3600 fire times missed: more than one walk holds, and a one-day window (720) fewer
        # than the limit, so the window must widen (to two days) and stop there.
        await conn.execute("SET LOCAL statement_timeout = '20s'")
        await schedule(conn, cron="*/2 * * * *", limit=1000)
        rows = await fire(conn, T0 + timedelta(days=5))
        times = fired(rows)
        assert len(times) == 1000
        assert times[-1] == T0 + timedelta(days=5)
        assert set(pairwise_steps(times)) == {timedelta(minutes=2)}
        assert rows[0]["skipped"] >= 1000

    async def test_a_clock_stepped_back_fires_nothing_twice(self, conn):
        await schedule(conn)
        await fire(conn, at(10))
        assert fired(await fire(conn, at(5))) == []
        assert fired(await fire(conn, at(11))) == [at(11)]
        assert await run_count(conn) == 11

    async def test_a_dba_moving_next_fire_at_back_cannot_double_fire(self, conn):
        await schedule(conn)
        await fire(conn, at(10))
        await conn.execute("UPDATE zeroth.schedules SET next_fire_at = $1", at(1))
        assert fired(await fire(conn, at(10))) == []
        # With the fire records gone, the high-water mark (last_fire_at, never pruned) holds.
        await conn.execute("DELETE FROM zeroth.schedule_fires")
        await conn.execute("UPDATE zeroth.schedules SET next_fire_at = $1", at(1))
        assert fired(await fire(conn, at(10))) == []
        assert await run_count(conn) == 10
        # And with the mark erased too, each fire time's run is found by its idempotency key.
        await conn.execute("UPDATE zeroth.schedules SET next_fire_at = $1, last_fire_at = NULL",
                           at(1))
        rows = await fire(conn, at(10))
        assert len(fired(rows)) == 10
        assert not any(r["created"] for r in rows)
        assert await run_count(conn) == 10
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.schedule_fires f JOIN zeroth.runs r USING (run_id)") == 10

    async def test_a_run_the_schedule_did_not_make_never_passes_for_its_fire(self, conn):
        # Planted under the key of a future fire time (a worker, before 0018 reserved the
        # prefix): the schedule is paused with ZP011 instead of recording it as fired.
        row = await schedule(conn)
        key = f"zeroth-schedule:{row['schedule_id']}:{at(2):%Y-%m-%dT%H:%M:%S.%fZ}"
        planted = await conn.fetchval(
            "INSERT INTO zeroth.runs (run_id, tenant_id, deployment_ref, status, run_after, "
            "created_at, updated_at, payload, metadata, idempotency_key) "
            "VALUES (gen_random_uuid(), 'default', 'd', 'pending', '9999-01-01', $1, $1, '{}', "
            "jsonb_build_object('zeroth_schedule', jsonb_build_object('schedule_id', $2::uuid)), "
            "$3) RETURNING run_id", T0, row["schedule_id"], key)
        assert fired(await fire(conn, at(1))) == [at(1)]
        assert fired(await fire(conn, at(3))) == []
        state = await conn.fetchrow("SELECT paused, last_error, fire_count, last_fire_at "
                                    "FROM zeroth.schedules")
        assert state["paused"] is True
        assert state["last_error"].startswith("ZP011: the idempotency key of fire time ")
        assert str(planted) in state["last_error"]
        assert (state["fire_count"], state["last_fire_at"]) == (1, at(1))
        assert await conn.fetchval("SELECT count(*) FROM zeroth.schedule_fires "
                                   "WHERE run_id = $1", planted) == 0
        assert await run_count(conn) == 2

    async def test_its_runs_carry_the_schedule_id_which_no_caller_can_set(self, conn):
        row = await schedule(conn)
        await fire(conn, at(2))
        ids = await conn.fetch("SELECT schedule_id FROM zeroth.runs")
        assert [r["schedule_id"] for r in ids] == [row["schedule_id"]] * 2

    async def test_fire_records_older_than_a_week_are_pruned(self, conn):
        await schedule(conn, interval=3600, policy="skip")
        await fire(conn, at(3600))
        await fire(conn, at(3600 * 24 * 8))
        rows = await conn.fetch("SELECT fire_at FROM zeroth.schedule_fires")
        times = [r["fire_at"] for r in rows]
        assert times == [at(3600 * 24 * 8)]


class TestDaylightSaving:
    async def test_a_spring_night_fires_the_missing_time_once_at_the_end_of_the_gap(self, conn):
        start = datetime(2030, 3, 30, 12, tzinfo=UTC)
        await schedule(conn, cron="30 2 * * *", zone="Europe/Berlin", now=start)
        rows = []
        for minute in range(0, 24 * 60, 10):  # a firer every 10 minutes through the night
            rows += fired(await fire(conn, start + timedelta(minutes=minute)))
        assert rows == [datetime(2030, 3, 31, 1, tzinfo=UTC)]

    async def test_an_autumn_night_fires_the_repeated_time_once(self, conn):
        start = datetime(2030, 10, 26, 12, tzinfo=UTC)
        await schedule(conn, cron="30 2 * * *", zone="Europe/Berlin", now=start)
        rows = []
        for minute in range(0, 24 * 60, 10):
            rows += fired(await fire(conn, start + timedelta(minutes=minute)))
        assert rows == [datetime(2030, 10, 27, 0, 30, tzinfo=UTC)]


class TestScope:
    async def test_listed_scopes_fire_only_their_own_schedules(self, conn):
        await schedule(conn, tenant="acme")
        await schedule(conn, tenant="globex")
        rows = await fire(conn, at(1), tenants=["acme"])
        assert [r["tenant_id"] for r in rows] == ["acme"]
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE tenant_id = 'globex'") == 0

    async def test_every_scope_when_no_tenant_is_listed(self, conn):
        await schedule(conn, tenant="acme")
        await schedule(conn, tenant="globex")
        assert sorted(r["tenant_id"] for r in await fire(conn, at(1))) == ["acme", "globex"]


class TestArguments:
    @pytest.mark.parametrize(("sql", "code"), [
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => NULL)", "ZP008"),
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{}')", "ZP008"),
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{\"\"}')", "ZP008"),
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}', max_schedules => 0)",
         "ZP008"),
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}', "
         "workspace_ids => '{w}')",
         "ZP008"),
        ("SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}', "
         "tenant_ids => '{NULL}', workspace_ids => '{w}')", "ZP006"),
    ])
    async def test_bad_arguments_are_refused(self, conn, sql, code):
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await conn.fetch(sql)
        assert caught.value.sqlstate == code
