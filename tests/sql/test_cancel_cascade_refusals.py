"""A run's cancel cascades to its children (trigger runs_cancel_children → zeroth._cancel, the
settle path's kind revoke). A child whose cancel is refused — the edge a DBA removed from
zeroth.run_transitions — must not stop its parent's own end, nor, in settle_runs, the other runs
of the batch ("a refused row never stops the others")."""

from __future__ import annotations

from child_calls import claim_start, start_child
from helpers import DEPLOYMENT, T0, WORKER, enqueue

NO_PENDING_CANCEL = (
    "DELETE FROM zeroth.run_transitions "
    "WHERE from_status = 'pending' AND outcome = 'cancel_requested'")


async def test_a_refused_child_cancel_stops_neither_the_parent_nor_the_batch(conn):
    parent = await enqueue(conn, now=T0)
    other = await enqueue(conn, now=T0)
    held = await claim_start(conn, DEPLOYMENT, now=T0)
    assert set(held) == {parent, other}
    child = (await start_child(conn, parent, held[parent], "step-1", now=T0))["child_run_id"]
    await conn.execute(NO_PENDING_CANCEL)

    rows = await conn.fetch(
        """SELECT run_id, outcome, sqlstate FROM zeroth_test.settle_runs(worker_id => $1,
               run_ids => $2::uuid[], generations => $3::bigint[],
               outcomes => ARRAY['cancel', 'complete'], now_override => $4)""",
        WORKER, [parent, other], [held[parent], held[other]], T0)

    outcomes = {r["run_id"]: (r["outcome"], r["sqlstate"]) for r in rows}
    assert outcomes[other] == ("completed", None)
    assert outcomes[parent] == ("cancelled", None)
    # The child's cancel was refused by the missing edge: it is left as it was, for its own end.
    assert await conn.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                               child) == "pending"
