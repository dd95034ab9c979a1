"""Two sessions appending to one run at the last place its bound leaves (issue 34): the run's row
lock orders them, so exactly one event takes the place and the other gets ZP014 once the first
commits, never a 101st event; and when the first rolls back, the waiting one takes the place.
"""

from __future__ import annotations

import json

from helpers import DEPLOYMENT, WORKER, at, make_run
from interleave import assert_waits_for, finished

APPEND = """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => 1,
               name => 'token', data => $3::text::jsonb, now_override => $4)"""


async def bounded_run(db, bound: int):
    await db.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await db.execute("UPDATE zeroth.deployments SET max_run_events = $2 "
                     "WHERE deployment_ref = $1", DEPLOYMENT, bound)
    lease = await make_run(db, "running")
    await db.execute(
        """INSERT INTO zeroth.run_events (tenant_id, workspace_key, run_id, event_id, kind, name,
                                         data, lease_generation, created_at)
           SELECT r.tenant_id, r.workspace_key, r.run_id, g, 'event', 'token', '1', 1, now()
             FROM zeroth.runs r, generate_series(1, $2) AS g WHERE r.run_id = $1""",
        lease.run_id, bound - 1)
    return lease


async def test_two_appenders_at_the_last_place_store_one_event_and_the_other_gets_zp014(
        sessions):
    a, b, db = sessions
    lease = await bounded_run(db, 100)
    await a.begin()
    assert (await a.call(APPEND, lease.run_id, WORKER, json.dumps("a"), at(5))).value == 100
    second = b.spawn(APPEND, lease.run_id, WORKER, json.dumps("b"), at(5))
    await assert_waits_for(db, b, a, second)
    await a.commit()

    assert (await finished(second)).sqlstate == "ZP014"
    rows = await db.fetch("SELECT event_id, data::text AS data FROM zeroth.run_events "
                          "WHERE run_id = $1 AND event_id >= 99 ORDER BY event_id", lease.run_id)
    assert [(r["event_id"], r["data"]) for r in rows] == [(99, "1"), (100, '"a"')]


async def test_an_appender_whose_rival_rolled_back_takes_the_last_place(sessions):
    a, b, db = sessions
    lease = await bounded_run(db, 100)
    await a.begin()
    assert (await a.call(APPEND, lease.run_id, WORKER, json.dumps("a"), at(5))).value == 100
    second = b.spawn(APPEND, lease.run_id, WORKER, json.dumps("b"), at(5))
    await assert_waits_for(db, b, a, second)
    await a.rollback()

    assert (await finished(second)).value == 100
    assert await db.fetchval("SELECT data::text FROM zeroth.run_events WHERE run_id = $1 "
                             "AND event_id = 100", lease.run_id) == '"b"'
