"""Two sessions meet on the registry of deployments (zeroth.deployments): two registrations of one
deployment at once (two App instances starting together, a rolling deploy), a DBA's change
while an application registers, and enqueues while the defaults change.

What must hold: each change is applied and audited exactly once, in commit order (the second
writer waits for the first and then sees its values as the old ones); a registration never
overwrites a DBA's uncommitted-then-committed setting; an enqueue never waits on a change in
progress (it reads the committed row) and every run keeps the values it got."""

from __future__ import annotations

import json

from interleave import assert_waits_for, finished, finishes_without_waiting

REGISTER = """SELECT outcome FROM zeroth.register_deployment(deployment_ref => 'mail',
    max_attempts => $1, priority => $2)"""
SET = """SELECT outcome FROM zeroth.set_deployment_defaults(deployment_ref => 'mail',
    max_attempts => $1)"""
ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'mail')"
ENQUEUE_MANY = """SELECT array_agg(run_id) FROM zeroth.enqueue_runs(deployment_ref => 'mail',
    runs => $1::jsonb)"""


async def audit(db) -> list[tuple[int, int | None, int]]:
    rows = await db.fetch("SELECT version, old_values::text AS old, new_values::text AS new "
                          "FROM zeroth.deployment_changes WHERE deployment_ref = 'mail' "
                          "ORDER BY version")
    return [(r["version"], r["old"] and json.loads(r["old"])["max_attempts"],
             json.loads(r["new"])["max_attempts"]) for r in rows]


async def attempts(db, run_id) -> int:
    return await db.fetchval("SELECT max_attempts FROM zeroth.runs WHERE run_id = $1", run_id)  # type: ignore[no-any-return]


class TestTwoRegistrationsAtOnce:
    async def test_the_second_creation_waits_then_wins_and_both_are_audited(self, sessions):
        a, b, db = sessions
        await a.begin()
        assert (await a.call(REGISTER, 4, 0)).value == "created"
        second = b.spawn(REGISTER, 6, 0)
        await assert_waits_for(db, b, a, second)
        await a.commit()
        assert (await finished(second)).value == "updated"
        assert await db.fetchval("SELECT max_attempts FROM zeroth.deployments") == 6
        assert await audit(db) == [(1, None, 4), (2, 4, 6)]

    async def test_the_same_values_twice_are_created_once(self, sessions):
        a, b, db = sessions
        await a.begin()
        await a.call(REGISTER, 4, 0)
        second = b.spawn(REGISTER, 4, 0)
        await assert_waits_for(db, b, a, second)
        await a.commit()
        assert (await finished(second)).value == "unchanged"
        assert await audit(db) == [(1, None, 4)]

    async def test_a_rolled_back_registration_leaves_the_other_to_create(self, sessions):
        a, b, db = sessions
        await a.begin()
        await a.call(REGISTER, 4, 0)
        second = b.spawn(REGISTER, 6, 0)
        await assert_waits_for(db, b, a, second)
        await a.rollback()
        assert (await finished(second)).value == "created"
        assert await audit(db) == [(1, None, 6)]


class TestADbaAndAnApplication:
    async def test_a_registration_waiting_for_a_dbas_change_keeps_it(self, sessions):
        a, b, db = sessions
        await db.execute(REGISTER, 4, 0)
        await a.begin()
        assert (await a.call(SET, 9)).value == "updated"
        registering = b.spawn(REGISTER, 5, 0)
        await assert_waits_for(db, b, a, registering)
        await a.commit()
        assert (await finished(registering)).value == "kept"
        assert await db.fetchval("SELECT max_attempts FROM zeroth.deployments") == 9
        assert await audit(db) == [(1, None, 4), (2, 4, 9)]


class TestEnqueueWhileTheDefaultsChange:
    async def test_an_enqueue_reads_the_committed_defaults_without_waiting(self, sessions):
        a, b, db = sessions
        await db.execute(REGISTER, 4, 0)
        await a.begin()
        await a.call(SET, 9)  # the row is locked and changed, not committed
        one = await finishes_without_waiting(db, b, b.spawn(ENQUEUE))
        many = await finishes_without_waiting(db, b, b.spawn(ENQUEUE_MANY, "[{}, {}]"))
        await a.commit()
        after = await db.fetchval(ENQUEUE)
        assert await attempts(db, one.value) == 4
        assert [await attempts(db, run_id) for run_id in many.value] == [4, 4]
        assert await attempts(db, after) == 9

    async def test_a_run_keeps_its_values_when_the_change_commits_later(self, sessions):
        a, b, db = sessions
        await db.execute(REGISTER, 4, 0)
        await b.begin()
        run_id = (await b.call(ENQUEUE)).value  # enqueued in an open transaction
        await a.begin()
        await a.call(SET, 9)
        await a.commit()
        await b.commit()
        assert await attempts(db, run_id) == 4
