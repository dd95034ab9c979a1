"""Two firers of one schedule at once (zeroth.fire_due_schedules), with real sessions: the
second skips a schedule the first holds (FOR UPDATE SKIP LOCKED: it neither waits nor fires it),
and once the first commits nothing is left to fire for that fire time; a DBA's pause waits for a
firer holding the row and nothing fires after it; two workers registering one schedule at once
create it once; and many firers hammering one schedule on the real clock never double fire."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from helpers import T0, at, wait_until

FIRE_AT = """SELECT schedule_id, fire_at FROM zeroth_test.fire_due_schedules(
    deployment_refs => '{d}', now_override => $1)"""


async def waits_for(db: asyncpg.Connection, waiter: asyncpg.Connection,
                    holder: asyncpg.Connection, call: asyncio.Task[Any]) -> None:
    """``waiter``'s ``call`` is seen blocked on a lock ``holder``'s open transaction holds: seen
    in pg_blocking_pids, not assumed after a sleep (on a loaded machine the call may not have
    reached the lock 0.2 s after it was sent, and the test passed without any wait)."""

    async def blocked() -> bool:
        assert not call.done(), f"expected to wait for the open transaction: {call.result()}"
        return bool(await db.fetchval("SELECT $1 = ANY (pg_blocking_pids($2))",
                                      holder.get_server_pid(), waiter.get_server_pid()))

    await wait_until(blocked, "the call to wait for the open transaction", within=60)


async def create(db, *, interval: int = 1) -> None:
    await db.execute(
        "SELECT zeroth_test.create_schedule(name => 's', deployment_ref => 'd', "
        "interval_seconds => $1, missed_fire_policy => 'catch_up', catch_up_limit => 100, "
        "now_override => $2)", interval, T0)


async def test_a_second_firer_skips_the_schedule_the_first_holds(connect):
    db, a, b = await connect(), await connect(), await connect()
    await create(db)
    await a.execute("BEGIN")
    first = [r for r in await a.fetch(FIRE_AT, at(5)) if r["schedule_id"]]
    assert len(first) == 5
    await b.execute("SET lock_timeout = '2s'")  # waiting would fail the test, not hang it
    assert [r for r in await b.fetch(FIRE_AT, at(5)) if r["schedule_id"]] == []
    await a.execute("COMMIT")
    assert [r for r in await b.fetch(FIRE_AT, at(5)) if r["schedule_id"]] == []
    assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 5


async def test_a_firer_that_rolls_back_leaves_the_fire_times_to_the_next(connect):
    db, a, b = await connect(), await connect(), await connect()
    await create(db)
    await a.execute("BEGIN")
    await a.fetch(FIRE_AT, at(3))
    await a.execute("ROLLBACK")
    assert len([r for r in await b.fetch(FIRE_AT, at(3)) if r["schedule_id"]]) == 3
    assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 3


async def test_a_pause_waits_for_the_firer_and_holds_after_it(connect):
    db, a, dba = await connect(), await connect(), await connect()
    await create(db)
    await a.execute("BEGIN")
    await a.fetch(FIRE_AT, at(2))
    pause = asyncio.create_task(dba.fetch("SELECT * FROM zeroth.pause_schedule(name => 's')"))
    await waits_for(db, dba, a, pause)  # it waits for the row the firer holds
    await a.execute("COMMIT")
    await pause
    assert [r for r in await a.fetch(FIRE_AT, at(50)) if r["schedule_id"]] == []
    assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 2


async def test_an_admin_function_waits_at_most_its_lock_timeout_for_a_firer(connect):
    """A firer (or anything) holding the row for long: pause, resume, alter and delete fail with
    55P03 lock_not_available after lock_timeout (2 s) and change nothing."""
    db, holder, dba = await connect(), await connect(), await connect()
    await create(db)
    await holder.execute("BEGIN")
    await holder.execute("SELECT 1 FROM zeroth.schedules WHERE name = 's' FOR UPDATE")
    before = await db.fetchval("SELECT s::text FROM zeroth.schedules s")
    for call in ("pause_schedule(name => 's')", "resume_schedule(name => 's')",
                 "alter_schedule(name => 's', priority => 5)", "delete_schedule(name => 's')"):
        with pytest.raises(asyncpg.LockNotAvailableError):
            await dba.fetch(f"SELECT * FROM zeroth.{call}")
    await holder.execute("ROLLBACK")
    assert await db.fetchval("SELECT s::text FROM zeroth.schedules s") == before
    assert (await dba.fetchrow("SELECT * FROM zeroth.pause_schedule(name => 's')"))["paused"]


async def test_a_firer_skips_a_row_being_changed_and_fires_the_committed_change(connect):
    """A DBA's uncommitted change holds the row: the firer skips it (it never fires the version
    it can see); once committed, the run carries the new payload. (The firer reads the row's
    columns from the locked row itself, so a change committed between its snapshot and its
    lock is used too; that window cannot be held open from outside, hence this shape.)"""
    db, a, dba = await connect(), await connect(), await connect()
    await create(db)
    await a.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
    await dba.execute("BEGIN")
    await dba.fetch("SELECT * FROM zeroth.alter_schedule(name => 's', payload => '{\"v\": 2}')")
    # The firer's statement meets the row locked: it skips it (never the old version) ...
    assert [r for r in await a.fetch(FIRE_AT, at(1)) if r["schedule_id"]] == []
    await dba.execute("COMMIT")
    # ... and the next statement fires the new payload.
    assert len([r for r in await a.fetch(FIRE_AT, at(1)) if r["schedule_id"]]) == 1
    await a.execute("COMMIT")
    assert await db.fetchval("SELECT payload::text FROM zeroth.runs") == '{"v": 2}'


async def test_two_workers_registering_at_once_create_one_schedule(connect):
    a, b, db = await connect(), await connect(), await connect()
    register = ("SELECT outcome FROM zeroth.register_schedule(name => 'r', deployment_ref => 'd', "
                "cron => '*/5 * * * *')")
    await a.execute("BEGIN")
    assert await a.fetchval(register) == "created"
    other = asyncio.create_task(b.fetchval(register))
    await waits_for(db, b, a, other)  # waits on the uncommitted name
    await a.execute("COMMIT")
    assert await other == "unchanged"
    assert await db.fetchval("SELECT count(*) FROM zeroth.schedules") == 1


async def test_many_firers_on_the_real_clock_never_double_fire(connect):
    db = await connect()
    await db.execute(
        "SELECT zeroth.create_schedule(name => 's', deployment_ref => 'd', interval_seconds => 1, "
        "missed_fire_policy => 'catch_up', catch_up_limit => 100)")
    firers = [await connect() for _ in range(4)]

    async def hammer(conn) -> int:
        fired = 0
        for _ in range(60):
            rows = await conn.fetch("SELECT schedule_id FROM zeroth.fire_due_schedules("
                                    "deployment_refs => '{d}')")
            fired += sum(1 for r in rows if r["schedule_id"])
            await asyncio.sleep(0.05)
        return fired

    counts = await asyncio.gather(*(hammer(c) for c in firers))
    keys = await db.fetch("SELECT idempotency_key FROM zeroth.runs")
    assert sum(counts) == len(keys) == len({k["idempotency_key"] for k in keys})
    assert await db.fetchval("SELECT count(*) FROM zeroth.schedule_fires") == len(keys)


KEYED_NOW = """SELECT run_id, created FROM zeroth.fire_schedule_now(name => 's',
    idempotency_key => 'double-click')"""


@pytest.mark.parametrize("first_ends", ["COMMIT", "ROLLBACK"])
async def test_two_fire_now_calls_with_one_key_make_one_run(connect, first_ends):
    """An operator's double click (or a retried POST) on "Fire now": two sessions call
    fire_schedule_now with the same key at once. The second waits for the schedule row the first
    holds; after a commit it returns the first's run (created false), after a rollback it makes
    the run itself. Never two runs."""
    db, a, b = await connect(), await connect(), await connect()
    await create(db, interval=3600)
    await a.execute("BEGIN")
    first = await a.fetchrow(KEYED_NOW)
    second = asyncio.create_task(b.fetchrow(KEYED_NOW))
    await waits_for(db, b, a, second)  # it waits for the row the first holds
    await a.execute(first_ends)
    row = await second
    if first_ends == "COMMIT":
        assert (row["run_id"], row["created"]) == (first["run_id"], False)
    else:
        assert row["created"] is True
    assert await db.fetchval("SELECT count(*) FROM zeroth.runs") == 1
