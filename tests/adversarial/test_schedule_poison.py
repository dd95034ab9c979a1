"""A DBA's manual UPDATE against the schedule firer (zeroth.fire_due_schedules), on the shipped
database (no test clock).

fire_due_schedules fires many schedules in one statement. A row its functions would refuse (a
cron typo, a time zone tzdata no longer knows) fails that schedule only: it is paused with
last_error and the others of the batch fire. What a CHECK can refuse is refused at the UPDATE:
an identifier longer than enqueue_run takes, an infinite instant (which would have made the
fire-time walk loop for ever). The high-water mark (last_fire_at) keeps a fire time from firing
twice after its fire record and its run were pruned, and max_fires bounds one call's runs.
"""

from __future__ import annotations

import asyncpg
import pytest

FIRE = "SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}')"


async def seed(admin: asyncpg.Connection) -> None:
    """Two due schedules of deployment d in two tenants: 'bad' (older, fired first), 'good'."""
    # 'good' is due at its anchor (a fire time on its own grid, whatever time passes between
    # these statements on a loaded machine; "now - 1 s" fell between two fire times when the
    # create and the UPDATE were more than a second apart).
    await admin.execute(
        "SELECT zeroth.create_schedule(name => 'good', deployment_ref => 'd', "
        "interval_seconds => 3600, tenant_id => 'acme', misfire_grace_seconds => 3600, "
        "start_at => clock_timestamp() - interval '30 seconds')")
    await admin.execute(
        "SELECT zeroth.create_schedule(name => 'bad', deployment_ref => 'd', "
        "cron => '* * * * *', tenant_id => 'globex')")
    await admin.execute(
        "UPDATE zeroth.schedules SET next_fire_at = anchor_at WHERE name = 'good'")
    await admin.execute(
        "UPDATE zeroth.schedules SET next_fire_at = date_trunc('minute', clock_timestamp()) "
        "- interval '1 minute', misfire_grace_seconds = 3600 WHERE name = 'bad'")


@pytest.mark.parametrize(("dba_update", "error"), [
    ("UPDATE zeroth.schedules SET cron = '*/0 * * * *' WHERE name = 'bad'", "ZP008: cron minute"),
    ("UPDATE zeroth.schedules SET time_zone = 'Nowhere/Atlantis' WHERE name = 'bad'", "22023: "),
])
async def test_one_bad_schedule_is_paused_and_the_others_fire(
        admin: asyncpg.Connection, login: object, dba_update: str, error: str) -> None:
    await seed(admin)
    await admin.execute(dba_update)
    worker = await login("worker")  # type: ignore[operator]
    rows = await worker.fetch(FIRE)
    assert {r["name"] for r in rows if r["schedule_id"] is not None} == {"good"}
    bad = await admin.fetchrow(
        "SELECT paused, last_error, last_error_at, fire_count FROM zeroth.schedules "
        "WHERE name = 'bad'")
    assert (bad["paused"], bad["fire_count"]) == (True, 0)
    assert bad["last_error_at"] is not None
    assert bad["last_error"].startswith(error), bad["last_error"]
    assert await admin.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE tenant_id = 'globex'") == 0
    # The DBA sees why (list_schedules), fixes the row and resumes: the error is cleared.
    listed = await admin.fetchrow(
        "SELECT last_error FROM zeroth.list_schedules(tenant_id => 'globex')")
    assert listed["last_error"] == bad["last_error"]
    await admin.execute(
        "UPDATE zeroth.schedules SET cron = '* * * * *', time_zone = 'UTC' WHERE name = 'bad'")
    resumed = await admin.fetchrow(
        "SELECT paused, last_error FROM zeroth.resume_schedule(name => 'bad', "
        "tenant_id => 'globex')")
    assert (resumed["paused"], resumed["last_error"]) == (False, None)


@pytest.mark.parametrize("dba_update", [
    "UPDATE zeroth.schedules SET tenant_id = repeat('x', 300) WHERE name = 'bad'",
    "UPDATE zeroth.schedules SET workspace_id = repeat('x', 201) WHERE name = 'bad'",
    "UPDATE zeroth.schedules SET next_fire_at = '-infinity' WHERE name = 'bad'",
    "UPDATE zeroth.schedules SET next_fire_at = 'infinity' WHERE name = 'bad'",
    "UPDATE zeroth.schedules SET anchor_at = 'infinity' WHERE name = 'bad'",
    "UPDATE zeroth.schedules SET last_fire_at = '-infinity' WHERE name = 'bad'",
])
async def test_a_row_no_run_could_carry_is_refused_at_the_update(
        admin: asyncpg.Connection, dba_update: str) -> None:
    await seed(admin)
    with pytest.raises(asyncpg.CheckViolationError):
        await admin.execute(dba_update)


@pytest.mark.parametrize("instant", ["infinity", "-infinity"])
async def test_the_fire_time_walks_refuse_an_infinite_instant(
        admin: asyncpg.Connection, instant: str) -> None:
    """They used to loop for ever (infinity + 1 day is infinity); now ZP008 at once."""
    await admin.execute("SET statement_timeout = '5s'")  # a regression fails, it does not hang
    for call in ("zeroth._cron_next('0 0 * * *', 'UTC', $1::text::timestamptz)",
                 "zeroth._schedule_next('0 0 * * *', NULL, now(), 'UTC',"
                 " $1::text::timestamptz)",
                 "zeroth._schedule_next(NULL, 60, $1::text::timestamptz, 'UTC', now())",
                 "zeroth._schedule_due('0 0 * * *', NULL, now(), 'UTC', $1::text::timestamptz,"
                 " now(), 1)",
                 "zeroth._schedule_due('0 0 * * *', NULL, now(), 'UTC', now(),"
                 " $1::text::timestamptz, 1)"):
        with pytest.raises(asyncpg.PostgresError) as raised:
            await admin.fetch(f"SELECT * FROM {call}", instant)
        assert raised.value.sqlstate == "ZP008", (call, raised.value)


async def test_a_fire_time_never_fires_twice_after_its_records_were_pruned(
        admin: asyncpg.Connection, login: object) -> None:
    """scratch: a daily schedule backfilled over 10 days, its fire records pruned (7 days) and
    its finished runs pruned (prune_runs); the DBA moves next_fire_at back again: nothing fires
    a second time (last_fire_at, the high-water mark, is never pruned)."""
    await admin.execute(
        "SELECT zeroth.create_schedule(name => 'daily', deployment_ref => 'd', "
        "interval_seconds => 86400, tenant_id => 'acme', missed_fire_policy => 'catch_up', "
        "catch_up_limit => 20, "
        "start_at => date_trunc('second', clock_timestamp()) - interval '10 days')")
    backfill = "UPDATE zeroth.schedules SET next_fire_at = anchor_at WHERE name = 'daily'"
    await admin.execute(backfill)
    worker = await login("worker")  # type: ignore[operator]
    first = [r for r in await worker.fetch(FIRE) if r["schedule_id"] is not None]
    assert len(first) == 11
    assert await admin.fetchval("SELECT count(*) FROM zeroth.schedule_fires") < 11  # pruned
    await admin.execute(
        "UPDATE zeroth.runs SET status = 'completed', "
        "finished_at = clock_timestamp() - interval '1 day' WHERE deployment_ref = 'd'")
    await admin.execute("SELECT zeroth.prune_runs(older_than => interval '1 hour')")
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0
    await admin.execute(backfill)
    again = [r for r in await worker.fetch(FIRE) if r["schedule_id"] is not None]
    assert again == []
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0
    row = await admin.fetchrow(
        "SELECT last_fire_at, next_fire_at, fire_count FROM zeroth.schedules")
    assert row["last_fire_at"] == max(r["fire_at"] for r in first)
    assert row["next_fire_at"] > row["last_fire_at"]
    assert row["fire_count"] == 11


async def test_max_fires_bounds_one_call_and_the_rest_fire_next(
        admin: asyncpg.Connection, login: object) -> None:
    await admin.execute(
        "SELECT zeroth.create_schedule(name => 'minutely', deployment_ref => 'd', "
        "interval_seconds => 60, tenant_id => 'acme', missed_fire_policy => 'catch_up', "
        "catch_up_limit => 5, "
        "start_at => clock_timestamp() - interval '4 minutes 30 seconds')")
    await admin.execute("UPDATE zeroth.schedules SET next_fire_at = anchor_at")
    worker = await login("worker")  # type: ignore[operator]
    fired: list[object] = []
    for expected in (2, 2, 1):
        rows = [r for r in await worker.fetch(
            "SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}', max_fires => 2)")
            if r["schedule_id"] is not None]
        assert len(rows) == expected
        fired += [r["fire_at"] for r in rows]
    assert fired == sorted(set(fired))  # oldest first, each once
    assert len(fired) == 5
    assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 5
    assert await admin.fetchval("SELECT skipped_count FROM zeroth.schedules") == 0
    with pytest.raises(asyncpg.PostgresError) as raised:
        await worker.fetch(
            "SELECT * FROM zeroth.fire_due_schedules(deployment_refs => '{d}', max_fires => 0)")
    assert raised.value.sqlstate == "ZP008"
