"""Managing schedules in SQL: create_schedule, alter_schedule, pause_schedule, resume_schedule,
delete_schedule (a DBA's), register_schedule (an application's, at worker start) and
list_schedules. Each refuses bad input with a ZP error that says what is wrong and changes
nothing; a scope sees only its own schedules; a DBA's pause or edit survives a worker's
registration."""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import pytest
from helpers import T0, at

CREATE = """SELECT * FROM zeroth_test.create_schedule(name => $1, deployment_ref => 'd',
    cron => $2, interval_seconds => $3, tenant_id => $4, time_zone => $5, now_override => $6)"""


async def create(conn: asyncpg.Connection, name: str = "s", *, cron: str | None = None,
                 interval: int | None = None, tenant: str | None = None, zone: str = "UTC",
                 now: object = T0) -> asyncpg.Record:
    if cron is None and interval is None:
        cron = "*/5 * * * *"
    return await conn.fetchrow(CREATE, name, cron, interval, tenant, zone, now)  # type: ignore[no-any-return]


async def register(conn: asyncpg.Connection, name: str = "s", cron: str = "*/5 * * * *",
                   now: object = T0, **extra: object) -> asyncpg.Record:
    names = ", ".join(f"{k} => ${i + 4}" for i, k in enumerate(extra))
    sql = ("SELECT * FROM zeroth_test.register_schedule(name => $1, deployment_ref => 'd', "
           f"cron => $2, now_override => $3{', ' + names if names else ''})")
    return await conn.fetchrow(sql, name, cron, now, *extra.values())  # type: ignore[no-any-return]


async def error(conn: asyncpg.Connection, sql: str, *args: object) -> tuple[str, str]:
    with pytest.raises(asyncpg.PostgresError) as caught:
        async with conn.transaction():  # a savepoint: the test's transaction goes on
            await conn.fetch(sql, *args)
    return caught.value.sqlstate or "", caught.value.message


class TestCreate:
    async def test_a_cron_schedule_gets_its_next_fire_time(self, conn):
        row = await create(conn, now=at(61))
        assert (row["next_fire_at"], row["managed_by"], row["paused"]) == (at(300), "sql", False)

    async def test_an_interval_schedule_is_anchored_at_the_second_it_was_created(self, conn):
        row = await create(conn, interval=10, now=at(3.25))
        assert (row["anchor_at"], row["next_fire_at"]) == (at(3), at(13))

    async def test_start_at_sets_the_first_fire_time(self, conn):
        row = await conn.fetchrow(
            "SELECT * FROM zeroth_test.create_schedule(name => 's', deployment_ref => 'd', "
            "interval_seconds => 60, start_at => $1, now_override => $2)", at(3600), T0)
        assert row["next_fire_at"] == at(3600)

    async def test_the_time_zone_is_stored_by_its_canonical_name(self, conn):
        assert (await create(conn, zone="europe/berlin"))["time_zone"] == "Europe/Berlin"

    async def test_a_name_is_unique_per_scope_only(self, conn):
        await create(conn, tenant="acme")
        await create(conn, tenant="globex")
        code, message = await error(conn, CREATE, "s", "* * * * *", None, "acme", "UTC", T0)
        assert (code, "already exists in this scope" in message) == ("ZP008", True)

    @pytest.mark.parametrize(("cron", "interval", "zone", "fragment"), [
        (None, None, "UTC", "exactly one of cron and interval_seconds"),
        ("* * * * *", 60, "UTC", "exactly one of cron and interval_seconds"),
        (None, 0, "UTC", "interval_seconds must be between 1"),
        ("@daily", None, "UTC", "is not supported"),
        ("* * * * *", None, "Mars/Olympus", 'unknown time zone "Mars/Olympus"'),
        ("* * * * *", None, "UTC+3", "unknown time zone"),
        ("* * * * *", None, "", "time_zone must be an IANA time zone name"),
    ])
    async def test_bad_definitions_are_refused_and_nothing_is_written(
            self, conn, cron, interval, zone, fragment):
        code, message = await error(conn, CREATE, "s", cron, interval, None, zone, T0)
        assert (code, fragment in message) == ("ZP008", True), message
        assert await conn.fetchval("SELECT count(*) FROM zeroth.schedules") == 0

    @pytest.mark.parametrize(("arguments", "fragment"), [
        ("missed_fire_policy => 'all'", "missed_fire_policy must be skip or catch_up"),
        ("missed_fire_policy => 'catch_up'", "needs catch_up_limit between 1 and 1000"),
        ("missed_fire_policy => 'catch_up', catch_up_limit => 1001", "between 1 and 1000"),
        ("catch_up_limit => 3", "catch_up_limit needs missed_fire_policy catch_up"),
        ("misfire_grace_seconds => 0", "misfire_grace_seconds must be between 1 and 86400"),
        ("payload => '[]'", "payload must be a JSON object"),
        ("max_attempts => 0", "max_attempts must be between 1 and 1000"),
        ("start_at => 'infinity'", "start_at must be a finite timestamp"),
    ])
    async def test_bad_options_are_refused(self, conn, arguments, fragment):
        code, message = await error(
            conn, "SELECT * FROM zeroth.create_schedule(name => 's', deployment_ref => 'd', "
                  f"cron => '* * * * *', {arguments})")
        assert (code, fragment in message) == ("ZP008", True), message

    async def test_a_workspace_without_a_tenant_is_an_invalid_scope(self, conn):
        code, _ = await error(conn, "SELECT * FROM zeroth.create_schedule(name => 's', "
                                    "deployment_ref => 'd', cron => '* * * * *', "
                                    "workspace_id => 'w')")
        assert code == "ZP006"


class TestAlter:
    async def test_a_new_cron_replaces_the_interval_and_moves_the_next_fire_time(self, conn):
        await create(conn, interval=10)
        row = await conn.fetchrow(
            "SELECT * FROM zeroth_test.alter_schedule(name => 's', cron => '0 12 * * *', "
            "time_zone => 'Asia/Tokyo', now_override => $1)", at(5))
        assert (row["cron"], row["interval_seconds"], row["time_zone"]) == (
            "0 12 * * *", None, "Asia/Tokyo")
        assert row["next_fire_at"] == T0 + timedelta(hours=3)  # 12:00 JST = 03:00 UTC

    async def test_null_arguments_keep_their_value(self, conn):
        before = await create(conn)
        row = await conn.fetchrow("SELECT * FROM zeroth.alter_schedule(name => 's', "
                                  "payload => '{\"k\": 1}')")
        assert json.loads(row["payload"]) == {"k": 1}
        assert (row["cron"], row["next_fire_at"]) == (before["cron"], before["next_fire_at"])

    async def test_a_bad_change_changes_nothing(self, conn):
        before = await create(conn)
        code, _ = await error(conn, "SELECT * FROM zeroth.alter_schedule(name => 's', "
                                    "cron => '61 * * * *')")
        assert code == "ZP008"
        assert await conn.fetchval("SELECT cron FROM zeroth.schedules") == before["cron"]

    async def test_a_missing_schedule_is_zp009(self, conn):
        code, message = await error(conn, "SELECT * FROM zeroth.alter_schedule(name => 'nope')")
        assert (code, message) == ("ZP009", 'no schedule named "nope" in this scope')

    async def test_another_tenants_schedule_is_not_found(self, conn):
        await create(conn, tenant="acme")
        for fn in ("alter_schedule", "pause_schedule", "resume_schedule", "delete_schedule"):
            code, _ = await error(
                conn, f"SELECT * FROM zeroth.{fn}(name => 's', tenant_id => 'globex')")
            assert code == "ZP009"
        assert await conn.fetchval("SELECT paused FROM zeroth.schedules") is False


class TestPauseResumeDelete:
    async def test_pause_is_idempotent_and_resume_starts_after_now(self, conn):
        await create(conn)
        await conn.fetch(
            "SELECT * FROM zeroth_test.pause_schedule(name => 's', now_override => $1)", at(1))
        row = await conn.fetchrow("SELECT * FROM zeroth.pause_schedule(name => 's')")
        assert row["paused"] is True
        row = await conn.fetchrow(
            "SELECT * FROM zeroth_test.resume_schedule(name => 's', now_override => $1)",
            at(3600 + 1))
        assert (row["paused"], row["next_fire_at"]) == (False, at(3600 + 300))

    async def test_resume_of_a_running_schedule_changes_nothing(self, conn):
        before = await create(conn)
        row = await conn.fetchrow(
            "SELECT * FROM zeroth_test.resume_schedule(name => 's', now_override => $1)", at(3600))
        assert row["next_fire_at"] == before["next_fire_at"]

    async def test_delete_removes_the_schedule_and_its_fires_but_not_its_runs(self, conn):
        await create(conn, interval=1)
        await conn.fetch("SELECT * FROM zeroth_test.fire_due_schedules(deployment_refs => '{d}', "
                         "now_override => $1)", at(1))
        schedule_id = await conn.fetchval("SELECT zeroth.delete_schedule(name => 's')")
        assert schedule_id is not None
        assert await conn.fetchval("SELECT count(*) FROM zeroth.schedule_fires") == 0
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 1
        code, _ = await error(conn, "SELECT zeroth.delete_schedule(name => 's')")
        assert code == "ZP009"


class TestRegister:
    async def test_created_then_unchanged_then_updated(self, conn):
        first = await register(conn)
        assert first["outcome"] == "created"
        assert (await register(conn, now=at(10)))["outcome"] == "unchanged"
        updated = await register(conn, cron="0 * * * *", now=at(10))
        assert (updated["outcome"], updated["next_fire_at"]) == ("updated", at(3600))
        assert await conn.fetchval("SELECT managed_by FROM zeroth.schedules") == "app"

    async def test_a_payload_change_keeps_the_next_fire_time(self, conn):
        first = await register(conn)
        again = await register(conn, now=at(100), payload=json.dumps({"v": 2}))
        assert (again["outcome"], again["next_fire_at"]) == ("updated", first["next_fire_at"])

    async def test_a_dba_pause_survives_a_worker_restart(self, conn):
        await register(conn)
        await conn.fetch("SELECT * FROM zeroth.pause_schedule(name => 's')")
        again = await register(conn, cron="* * * * *")
        assert (again["outcome"], again["paused"]) == ("kept", True)
        assert await conn.fetchval("SELECT cron FROM zeroth.schedules") == "*/5 * * * *"

    async def test_a_dba_edit_survives_a_worker_restart(self, conn):
        await register(conn)
        await conn.fetch("SELECT * FROM zeroth.alter_schedule(name => 's', cron => '0 0 * * *')")
        assert (await register(conn))["outcome"] == "kept"
        assert await conn.fetchval("SELECT cron FROM zeroth.schedules") == "0 0 * * *"

    async def test_a_dba_created_schedule_is_kept(self, conn):
        await create(conn, cron="0 1 * * *")
        assert (await register(conn))["outcome"] == "kept"

    async def test_bad_input_is_refused(self, conn):
        code, message = await error(
            conn, "SELECT * FROM zeroth.register_schedule(name => 's', deployment_ref => 'd', "
                  "cron => '* * * *')")
        assert (code, "must have 5 fields" in message) == ("ZP008", True)


class TestList:
    async def test_lists_one_scope_by_name(self, conn):
        for name, tenant in (("b", None), ("a", None), ("c", "acme")):
            await create(conn, name, tenant=tenant)
        rows = await conn.fetch("SELECT name FROM zeroth.list_schedules()")
        assert [r["name"] for r in rows] == ["a", "b"]
        rows = await conn.fetch("SELECT name FROM zeroth.list_schedules(tenant_id => 'acme')")
        assert [r["name"] for r in rows] == ["c"]

    async def test_filters_by_deployment(self, conn):
        await create(conn)
        assert await conn.fetch(
            "SELECT name FROM zeroth.list_schedules(deployment_refs => '{other}')") == []

    async def test_a_workspace_without_a_tenant_is_zp006(self, conn):
        code, _ = await error(conn, "SELECT * FROM zeroth.list_schedules(workspace_id => 'w')")
        assert code == "ZP006"
