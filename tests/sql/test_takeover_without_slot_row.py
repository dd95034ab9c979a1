"""A run a takeover can never take: zeroth._take_over locks the run's admission slot first
(SKIP LOCKED) and gives up when it gets none — also when there is no such row at all (a DBA
deleted admission_slots rows, e.g. after lowering a scope's max_concurrency by hand). The run then
stays running with an expired lease for ever: claim_for_takeover returns nothing, and every sweep
meets it again. A slot row that does not exist is no one's: the takeover goes on without it."""

from __future__ import annotations

from helpers import DEPLOYMENT, LEASE, at, enqueue

LATER = at(1000)


async def test_a_run_whose_slot_row_is_gone_is_still_taken_over(conn):
    run_id = await enqueue(conn)
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => 'w',
               max_concurrency => 1, lease_seconds => $2, now_override => $3)""",
        DEPLOYMENT, LEASE, at(0))
    assert [r["run_id"] for r in rows] == [run_id]
    assert await conn.fetchval("SELECT admission_slot FROM zeroth.runs WHERE run_id = $1",
                               run_id) is not None
    await conn.execute("DELETE FROM zeroth.admission_slots")  # a DBA's clean-up

    taken = await conn.fetch(
        """SELECT run_id, outcome FROM zeroth_test.claim_for_takeover(run_id => $1,
               grace_seconds => 0, now_override => $2)""", run_id, LATER)

    assert [(r["run_id"], r["outcome"]) for r in taken] == [(run_id, "requeued")]
    row = await conn.fetchrow(
        "SELECT status::text AS status, lease_worker_id, admission_slot FROM zeroth.runs "
        "WHERE run_id = $1", run_id)
    assert tuple(row) == ("pending", None, None)
