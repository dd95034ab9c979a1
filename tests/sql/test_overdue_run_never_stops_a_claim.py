"""A pending run past its run deadline never stops a claim (issue 34 item 2 meeting issue 33).

The claim that meets one ends it (zeroth._end_past_run_deadline: failed, run_timeout) and claims
the next due run in the same call. On main that end called zeroth._free_slot, a helper the settle
path's merge dropped (internal/slots.sql): every claim of the scope that met such a run raised
42883 — one overdue run stopped every claim of its scope (and, in claim_and_start_scopes, of
every scope in the call) for ever."""

from __future__ import annotations

from helpers import DEPLOYMENT, WORKER, at, enqueue, run_row
from test_timeouts import claim_start, set_timeouts, sweep


async def test_an_overdue_pending_run_is_ended_and_the_next_one_claimed(conn):
    await set_timeouts(conn, 10, 100)
    overdue = await enqueue(conn)
    await claim_start(conn, 0)
    await sweep(conn, 11)  # attempt timed out: pending again, run deadline at(100)
    fresh = await enqueue(conn, now=at(50))

    claimed = await claim_start(conn, 101)

    assert [r["run_id"] for r in claimed] == [fresh]
    assert (await run_row(conn, overdue))["status"] == "failed"


async def test_an_overdue_lapsed_claim_frees_its_slot(conn):
    await set_timeouts(conn, None, 100)
    overdue = await enqueue(conn)
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
               max_concurrency => 1, lease_seconds => 30, now_override => $3)""",
        DEPLOYMENT, WORKER, at(0))
    assert [r["run_id"] for r in rows] == [overdue]  # a claim never started; lapses at(30)
    fresh = await enqueue(conn, now=at(50))

    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => 'w2',
               max_concurrency => 1, lease_seconds => 30, now_override => $2)""",
        DEPLOYMENT, at(101))

    assert [r["run_id"] for r in rows if r["run_id"] is not None] == [fresh]
    assert (await run_row(conn, overdue))["status"] == "failed"
    assert await conn.fetchval(
        "SELECT count(*) FROM zeroth.admission_slots WHERE run_id = $1", overdue) == 0
