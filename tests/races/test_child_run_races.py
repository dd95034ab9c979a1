"""Scripted interleavings of the child-run functions (start_child_run, wait_for_children) with a
child's end and with a second attempt of the parent.

A parent entering its wait and a child ending meet on the child's child_runs row (the wait locks
it FOR SHARE, the end updates it): whichever commits first is seen by the other, so the parent is
either told "ready" or woken by the child's trigger; no wake-up is lost. A child's end never
waits for a parent's row another session holds: it marks the wait, and wake_due_waits wakes the
parent. Two siblings ending at
once serialise on the wait's child_waits row: the second sees the first and wakes the parent. A
stale parent attempt that waited behind a takeover starts nothing; two calls of the same holder
under one key get one child. A parent's cancel and its child's end never deadlock. A child's
redrive and its parent's wait meet on the same child_runs row: either the redrive recounts the
wait or the wait counts the child as not ended, never both. A DBA's DELETE of an awaited child
waits for the parent entering its wait, then wakes it. Clocks are injected with now_override.
"""

from __future__ import annotations

import json

from child_calls import CHILD
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from interleave import assert_waits_for, finished, finishes_without_waiting, only

START = """SELECT child_run_id, created FROM zeroth_test.start_child_run(run_id => $1,
               worker_id => $2, generation => $3, step_key => $4, deployment_ref => 'child-d',
               payload => '{}', now_override => $5)"""
WAIT = """SELECT outcome, children::text AS children FROM zeroth_test.wait_for_children(
              run_id => $1, worker_id => $2, generation => $3, step_key => '#children',
              child_run_ids => $4::uuid[], mode => $5, now_override => $6)"""
CLAIM = """SELECT run_id, lease_generation FROM zeroth_test.claim_and_start(deployment_ref => $1,
               worker_id => $2, batch_size => 100, now_override => $3) WHERE run_id IS NOT NULL"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => $4::text::jsonb, now_override => $5)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
CANCEL = """SELECT outcome FROM zeroth_test.request_cancel_v2(run_id => $1, action => 'cancel',
                now_override => $2)"""
CHILDREN = "SELECT count(*) FROM zeroth.runs r WHERE r.parent_run_id = $1"
HAND_BACK = """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3, now_override => $4)"""
LOCK_ROW = "SELECT 1 FROM zeroth.runs r WHERE r.run_id = $1 FOR UPDATE"
WAKE = """SELECT zeroth_test.wake_due_waits(deployment_refs => $1::text[], batch_size => 100,
              now_override => $2)"""


async def parent_and_children(db, n):
    """A running parent (generation 1) with ``n`` children, each claimed and running."""
    lease = await make_run(db, "running")
    children = []
    for i in range(n):
        row = await db.fetchrow(START, lease.run_id, WORKER, lease.generation, f"c{i}", at(1))
        children.append(row["child_run_id"])
    claimed = {r["run_id"]: r["lease_generation"] for r in await db.fetch(CLAIM, CHILD, "cw",
                                                                         at(2))}
    assert set(claimed) == set(children)
    return lease, [(child, claimed[child]) for child in children]


async def test_a_child_ending_while_the_parent_enters_its_wait_wakes_the_parent(sessions):
    parent, child, db = sessions
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    await parent.begin()
    entered = only(await parent.rows(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))
    assert entered["outcome"] == "waiting"
    end = child.spawn(COMPLETE, kid, "cw", gen, json.dumps(7), at(4))
    await assert_waits_for(db, child, parent, end)
    await parent.commit()
    assert (await finished(end)).value is True
    row = await run_row(db, lease.run_id)
    assert (row["status"], row["wait_reason"], row["lease_worker_id"]) == ("pending", None, None)
    (again,) = await db.fetch(CLAIM, DEPLOYMENT, WORKER, at(5))
    replay = only(await parent.rows(WAIT, lease.run_id, WORKER, again["lease_generation"],
                                    [kid], "all", at(6)))
    assert replay["outcome"] == "ready"
    assert [(c["status"], c["output"]) for c in json.loads(replay["children"])] == [
        ("completed", 7)]


async def test_a_wait_that_met_an_ending_child_sees_its_outcome(sessions):
    parent, child, db = sessions
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    await child.begin()
    assert (await child.call(COMPLETE, kid, "cw", gen, json.dumps("done"), at(3))).value is True
    wait = parent.spawn(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(4), rows=True)
    await assert_waits_for(db, parent, child, wait)
    await child.commit()
    got = only(await finished(wait))
    assert got["outcome"] == "ready"
    assert json.loads(got["children"])[0]["output"] == "done"
    assert (await run_row(db, lease.run_id))["status"] == "running"


async def test_two_siblings_ending_at_once_wake_an_all_wait_once(sessions):
    a, b, db = sessions
    lease, [(k1, g1), (k2, g2)] = await parent_and_children(db, 2)
    assert only(await a.rows(WAIT, lease.run_id, WORKER, 1, [k1, k2], "all", at(3)))[
        "outcome"] == "waiting"
    await a.begin()
    assert (await a.call(COMPLETE, k1, "cw", g1, json.dumps(1), at(4))).value is True
    second = b.spawn(COMPLETE, k2, "cw", g2, json.dumps(2), at(4))
    await assert_waits_for(db, b, a, second)
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    await a.commit()
    assert (await finished(second)).value is True
    assert (await run_row(db, lease.run_id))["status"] == "pending"


async def test_a_child_ending_while_another_session_holds_the_parent_marks_the_wait(sessions):
    """The child's end never waits for its parent's row (SKIP LOCKED): the wake-up it skipped is
    marked (child_waits.met_at) and made by wake_due_waits."""
    holder, child, db = sessions
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))[
        "outcome"] == "waiting"
    await holder.begin()
    assert (await holder.call(LOCK_ROW, lease.run_id)).value == 1
    end = child.spawn(COMPLETE, kid, "cw", gen, json.dumps(1), at(4))
    assert (await finishes_without_waiting(db, child, end)).value is True
    await holder.commit()
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    assert await db.fetchval("SELECT count(*) FROM zeroth.child_waits WHERE met_at IS NOT NULL"
                             ) == 1
    assert await db.fetchval(WAKE, [DEPLOYMENT], at(5)) == 1
    assert (await run_row(db, lease.run_id))["status"] == "pending"
    assert await db.fetchval(WAKE, [DEPLOYMENT], at(6)) == 0


async def test_a_stale_parent_that_waited_for_the_takeover_starts_nothing(sessions):
    holder, sweeper, db = sessions
    lease = await make_run(db, "running")
    await sweeper.begin()
    taken = only(await sweeper.rows(CLAIM_ORPHANED, DEPLOYMENT, "worker-b", at(61)))
    assert taken["lease_generation"] == 2
    stale = holder.spawn(START, lease.run_id, WORKER, 1, "c0", at(59), rows=True)
    await assert_waits_for(db, holder, sweeper, stale)
    await sweeper.commit()
    assert only(await finished(stale)) == {"child_run_id": None, "created": None}
    assert await db.fetchval(CHILDREN, lease.run_id) == 0


async def test_two_calls_of_one_holder_under_one_key_start_one_child(sessions):
    """Two processes with the same worker id and generation (a duplicated deployment)."""
    a, b, db = sessions
    lease = await make_run(db, "running")
    await a.begin()
    first = only(await a.rows(START, lease.run_id, WORKER, 1, "c0", at(1)))
    assert first["created"] is True
    second = b.spawn(START, lease.run_id, WORKER, 1, "c0", at(1), rows=True)
    await assert_waits_for(db, b, a, second)
    await a.commit()
    assert only(await finished(second)) == {"child_run_id": first["child_run_id"],
                                            "created": False}
    assert await db.fetchval(CHILDREN, lease.run_id) == 1


async def test_a_parents_cancel_waiting_for_a_childs_end_finds_it_completed(sessions):
    """The child's end holds its rows (and wakes the waiting parent); the parent's cancel waits
    for it, then cancels the parent and leaves the completed child alone: no deadlock."""
    ender, canceller, db = sessions
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))[
        "outcome"] == "waiting"
    await ender.begin()
    assert (await ender.call(COMPLETE, kid, "cw", gen, json.dumps(1), at(4))).value is True
    cancel = canceller.spawn(CANCEL, lease.run_id, at(4))
    await assert_waits_for(db, canceller, ender, cancel)
    await ender.commit()
    assert (await finished(cancel)).value == "cancelled"
    assert (await run_row(db, lease.run_id))["status"] == "cancelled"
    assert (await run_row(db, kid))["status"] == "completed"


async def test_a_childs_end_waiting_for_its_parents_cancel_then_completes(sessions):
    """The parent's cancel holds the running child's row (its cancel request); the child's
    end waits for it and then completes: a cancel request does not undo finished work."""
    canceller, ender, db = sessions
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))[
        "outcome"] == "waiting"
    await canceller.begin()
    assert (await canceller.call(CANCEL, lease.run_id, at(4))).value == "cancelled"
    end = ender.spawn(COMPLETE, kid, "cw", gen, json.dumps(1), at(4))
    await assert_waits_for(db, ender, canceller, end)
    await canceller.commit()
    assert (await finished(end)).value is True
    assert (await run_row(db, lease.run_id))["status"] == "cancelled"
    assert (await run_row(db, kid))["status"] == "completed"


async def test_a_parents_cancel_and_a_siblings_end_do_not_deadlock(sessions):
    """Two children: the parent's cancel cancels the first (its trigger sees the parent
    cancelled and takes no wait row), then waits for the second, whose end a session holds; that
    end locks the parent's wait row, finds the parent's row held (SKIP LOCKED), marks the wait
    and commits; the cancel then finds the second child completed. Neither waits for the other."""
    ender, canceller, db = sessions
    lease, kids = await parent_and_children(db, 2)
    (first, first_gen), (second, gen) = sorted(kids)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [first, second], "all", at(3)))[
        "outcome"] == "waiting"
    # The first child is pending again (handed back), so the cancel ends it at once: its end
    # runs the child trigger inside the cancel's transaction.
    assert await db.fetchval(HAND_BACK, first, "cw", first_gen, at(3)) is True
    await ender.begin()
    assert (await ender.call(LOCK_ROW, second)).value == 1
    cancel = canceller.spawn(CANCEL, lease.run_id, at(4))
    await assert_waits_for(db, canceller, ender, cancel)
    end = ender.spawn(COMPLETE, second, "cw", gen, json.dumps(2), at(4))
    assert (await finishes_without_waiting(db, ender, end)).value is True
    await ender.commit()
    assert (await finished(cancel)).value == "cancelled"
    assert [(await run_row(db, kid))["status"] for kid in (first, second)] == [
        "cancelled", "completed"]
    assert (await run_row(db, lease.run_id))["status"] == "cancelled"


FAIL = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
              error => '"x"', retryable => false, now_override => $4)"""
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"
REMAINING = "SELECT remaining FROM zeroth.child_waits WHERE parent_run_id = $1"


async def _failed_and_running(db):
    """A parent with two running children, the first of which failed (ended)."""
    lease, kids = await parent_and_children(db, 2)
    (failed, failed_gen), (running, running_gen) = kids
    assert await db.fetchval(FAIL, failed, "cw", failed_gen, at(2)) == "failed"
    return lease, failed, (running, running_gen)


async def _then_the_children_end(db, lease, failed, running):
    """The redriven child and its sibling end: the parent wakes only after both."""
    await db.fetchval(COMPLETE, running[0], "cw", running[1], json.dumps(1), at(7))
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    (again,) = await db.fetch(CLAIM, CHILD, "cw", at(8))
    assert again["run_id"] == failed
    await db.fetchval(COMPLETE, failed, "cw", again["lease_generation"], json.dumps(2), at(9))
    assert (await run_row(db, lease.run_id))["status"] == "pending"


async def test_a_redrive_waiting_for_the_parent_entering_its_wait_recounts_it(sessions):
    """The wait holds the ended child's child_runs row FOR SHARE and counts it ended; the redrive
    (its trigger clears that copy) waits for it, then recounts the wait: nothing counted twice."""
    parent, operator, db = sessions
    lease, failed, running = await _failed_and_running(db)
    await parent.begin()
    entered = only(await parent.rows(WAIT, lease.run_id, WORKER, 1, [failed, running[0]], "all",
                                     at(3)))
    assert entered["outcome"] == "waiting"
    redrive = operator.spawn(REDRIVE, failed, at(4))
    await assert_waits_for(db, operator, parent, redrive)
    await parent.commit()
    assert (await finished(redrive)).value is True
    assert await db.fetchval(REMAINING, lease.run_id) == 2
    await _then_the_children_end(db, lease, failed, running)


async def test_a_wait_waiting_for_a_childs_redrive_counts_it_not_ended(sessions):
    operator, parent, db = sessions
    lease, failed, running = await _failed_and_running(db)
    await operator.begin()
    assert (await operator.call(REDRIVE, failed, at(3))).value is True
    wait = parent.spawn(WAIT, lease.run_id, WORKER, 1, [failed, running[0]], "all", at(4),
                        rows=True)
    await assert_waits_for(db, parent, operator, wait)
    await operator.commit()
    assert only(await finished(wait))["outcome"] == "waiting"
    assert await db.fetchval(REMAINING, lease.run_id) == 2
    await _then_the_children_end(db, lease, failed, running)


async def test_a_dba_deleting_a_child_while_the_parent_enters_its_wait_wakes_it(sessions):
    parent, dba, db = sessions
    lease, [(kid, _gen)] = await parent_and_children(db, 1)
    await parent.begin()
    assert only(await parent.rows(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))[
        "outcome"] == "waiting"
    delete = dba.spawn("DELETE FROM zeroth.runs WHERE run_id = $1", kid)
    await assert_waits_for(db, dba, parent, delete)
    await parent.commit()
    assert (await finished(delete)).sqlstate is None
    assert (await run_row(db, lease.run_id))["status"] == "pending"
