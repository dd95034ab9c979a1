"""Scripted interleavings of real sessions on the children a parent waits for: the wait's count
stays the truth and the parent is woken once, after the last awaited end.

* two siblings ending at once while a third is redriven (and a redrive holding the wait while a
  sibling ends);
* a DBA's DELETE of an awaited child against that child's completion, in either order: the
  child is counted once;
* a child's redrive and a DBA's DELETE of it, in either order: counted once;
* a child's redrive against prune_runs deleting its ended (cancelled) parent, lined up by a
  third session, does not deadlock (the reopen trigger takes wait rows only while the parent
  waits for children).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import DEPLOYMENT, WORKER, at, run_row
from interleave import DEADLINE, Outcome, Session, assert_waits_for, blockers, finished, only
from test_child_run_races import (
    CLAIM,
    COMPLETE,
    FAIL,
    REDRIVE,
    REMAINING,
    WAIT,
    parent_and_children,
)

ENDED = """SELECT lease_generation, worker_id, outcome FROM zeroth.run_attempts
            WHERE run_id = $1 ORDER BY lease_generation, ended_at"""


async def blocked(db, waiter, task):
    """The waiter's call is blocked on a lock (held by the open transaction, or queued behind
    another waiter of it)."""
    deadline = asyncio.get_running_loop().time() + DEADLINE
    while not await blockers(db, waiter):
        assert not task.done(), f"expected to wait, got {task.result()}"
        assert asyncio.get_running_loop().time() < deadline, "the call never blocked"
        await asyncio.sleep(0.005)


async def ended(db, run_id):
    return [tuple(r) for r in await db.fetch(ENDED, run_id)]


@pytest.mark.parametrize("queued_first", ["end", "redrive"])
async def test_two_siblings_ending_while_a_third_is_redriven_count_the_truth(
        sessions, connect, queued_first):
    """c3 failed before the wait (counted ended); c1's end holds the wait row; c2's end and c3's
    redrive queue behind it, in the order given. After all three commit, c3 alone is open:
    remaining is 1 in either order. c2's end first: all three had ended then, so it wakes the
    parent, whose replay waits for the redriven c3. The redrive first: it recounts (c2's end is
    not committed yet) and c2's end counts down after it, the parent still waiting. Either way
    c3's end wakes the parent, and its replay is ready with the three outcomes."""
    a, b, db = sessions
    c = Session(await connect())
    lease, [(k1, g1), (k2, g2), (k3, g3)] = await parent_and_children(db, 3)
    assert await db.fetchval(FAIL, k3, "cw", g3, at(2)) == "failed"
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [k1, k2, k3], "all", at(3)))[
        "outcome"] == "waiting"
    assert await db.fetchval(REMAINING, lease.run_id) == 2
    await a.begin()
    assert (await a.call(COMPLETE, k1, "cw", g1, json.dumps(1), at(4))).value is True
    calls = {"end": (b, COMPLETE, k2, "cw", g2, json.dumps(2), at(4)),
             "redrive": (c, REDRIVE, k3, at(4))}
    order = [queued_first, "redrive" if queued_first == "end" else "end"]
    tasks = {}
    for name in order:  # the second queues behind the first (the wait row's tuple lock)
        session, *call = calls[name]
        tasks[name] = session.spawn(*call)
        await blocked(db, session, tasks[name])
    await a.commit()
    assert (await finished(tasks["end"])).value is True
    assert (await finished(tasks["redrive"])).value is True
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    woken = (await run_row(db, lease.run_id))["status"]
    assert woken == ("pending" if queued_first == "end" else "waiting")
    if woken == "pending":
        (again,) = await db.fetch(CLAIM, DEPLOYMENT, WORKER, at(5))
        assert only(await a.rows(WAIT, lease.run_id, WORKER, again["lease_generation"],
                                 [k1, k2, k3], "all", at(5)))["outcome"] == "waiting"
        assert await db.fetchval(REMAINING, lease.run_id) == 1
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    (rerun,) = await db.fetch(CLAIM, "child-d", "cw", at(6))
    assert rerun["run_id"] == k3
    assert await db.fetchval(COMPLETE, k3, "cw", rerun["lease_generation"], json.dumps(3),
                             at(7)) is True
    assert (await run_row(db, lease.run_id))["status"] == "pending"
    (again,) = await db.fetch(CLAIM, DEPLOYMENT, WORKER, at(8))
    ready = only(await a.rows(WAIT, lease.run_id, WORKER, again["lease_generation"],
                              [k1, k2, k3], "all", at(8)))
    assert ready["outcome"] == "ready"
    assert [(x["status"], x["output"]) for x in json.loads(ready["children"])] == [
        ("completed", 1), ("completed", 2), ("completed", 3)]


async def test_a_redrive_holding_the_wait_then_a_sibling_ends(sessions):
    operator, ender, db = sessions
    lease, [(k1, g1), (k2, g2)] = await parent_and_children(db, 2)
    assert await db.fetchval(FAIL, k2, "cw", g2, at(2)) == "failed"
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [k1, k2], "all", at(3)))[
        "outcome"] == "waiting"
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    await operator.begin()
    assert (await operator.call(REDRIVE, k2, at(4))).value is True
    end = ender.spawn(COMPLETE, k1, "cw", g1, json.dumps(1), at(4))
    await assert_waits_for(db, ender, operator, end)
    await operator.commit()
    assert (await finished(end)).value is True
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    (rerun,) = await db.fetch(CLAIM, "child-d", "cw", at(5))
    assert await db.fetchval(COMPLETE, k2, "cw", rerun["lease_generation"], json.dumps(2),
                             at(6)) is True
    assert (await run_row(db, lease.run_id))["status"] == "pending"


@pytest.mark.parametrize("first", ["completion", "delete"])
async def test_a_dba_deleting_a_child_as_it_completes_counts_it_once(sessions, first):
    worker, dba, db = sessions
    lease, [(k1, g1), (k2, g2)] = await parent_and_children(db, 2)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [k1, k2], "all", at(3)))[
        "outcome"] == "waiting"
    assert await db.fetchval(REMAINING, lease.run_id) == 2
    delete = "DELETE FROM zeroth.runs WHERE run_id = $1"
    if first == "completion":
        await worker.begin()
        assert (await worker.call(COMPLETE, k1, "cw", g1, json.dumps(1), at(4))).value is True
        late = dba.spawn(delete, k1)
        await assert_waits_for(db, dba, worker, late)
        await worker.commit()
        assert (await finished(late)).sqlstate is None
    else:
        await dba.begin()
        await dba.call(delete, k1)
        late = worker.spawn(COMPLETE, k1, "cw", g1, json.dumps(1), at(4))
        await assert_waits_for(db, worker, dba, late)
        await dba.commit()
        result = await finished(late)
        assert result.value is False or (result.sqlstate or "").startswith("ZP"), result
        assert await db.fetchval("SELECT count(*) FROM zeroth.run_attempts WHERE run_id = $1",
                                 k1) == 0
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    assert await db.fetchval(COMPLETE, k2, "cw", g2, json.dumps(2), at(5)) is True
    assert (await run_row(db, lease.run_id))["status"] == "pending"


PRUNE = """SELECT zeroth_test.prune_runs(older_than => interval '100 seconds',
               now_override => $1)"""

CANCEL_PARENT = """SELECT outcome FROM zeroth_test.request_cancel_v2(run_id => $1,
                       action => 'cancel', now_override => $2)"""


async def test_a_childs_redrive_and_the_prune_of_its_ended_parent_do_not_deadlock(
        sessions, connect):
    """A cancelled parent keeps the wait it was cancelled in (child_waits). Its child is
    redriven while prune_runs deletes the parent: the redrive's trigger locks the child's
    child_runs row, prune deletes the parent's wait row and then (ON DELETE CASCADE) the child's
    child_runs row. A third session holding that child_runs row lines the two up: once it lets
    go, the redrive must not go on to wait for the wait row prune deleted while prune waits for
    the child_runs row the redrive holds (a deadlock, 40P01 after deadlock_timeout)."""
    operator, pruner, db = sessions
    holder = Session(await connect())
    lease, [(kid, gen)] = await parent_and_children(db, 1)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [kid], "all", at(3)))[
        "outcome"] == "waiting"
    assert await db.fetchval(CANCEL_PARENT, lease.run_id, at(4)) == "cancelled"
    assert await db.fetchval(FAIL, kid, "cw", gen, at(5)) == "failed"
    assert await db.fetchval(REMAINING, lease.run_id) == 1  # the cancelled parent's wait stays
    await holder.begin()
    assert (await holder.call("SELECT 1 FROM zeroth.child_runs WHERE child_run_id = $1 "
                              "FOR UPDATE", kid)).value == 1
    redrive = operator.spawn(REDRIVE, kid, at(1000))
    await assert_waits_for(db, operator, holder, redrive)
    prune = pruner.spawn(PRUNE, at(1000))
    await blocked(db, pruner, prune)
    await holder.commit()
    assert (await finished(redrive)) == Outcome(value=True)
    assert (await finished(prune)) == Outcome(value=1)  # the parent (the child was held)
    assert await db.fetchval("SELECT count(*) FROM zeroth.child_waits WHERE parent_run_id = $1",
                             lease.run_id) == 0
    assert (await run_row(db, kid))["status"] == "pending"


@pytest.mark.parametrize("first", ["redrive", "delete"])
async def test_a_redrive_and_a_dba_delete_of_one_child_count_it_once(sessions, first):
    """Parent waiting for [k1, k2], k1 failed (counted). The redrive reopens k1 (recount: 2
    left), the DELETE reports it cancelled (1 left): in either order k1 ends up counted once and
    k2's end wakes the parent; a redrive that waited for the DELETE finds no run (ZP001)."""
    operator, dba, db = sessions
    lease, [(k1, g1), (k2, g2)] = await parent_and_children(db, 2)
    assert (await db.fetchrow(WAIT, lease.run_id, WORKER, 1, [k1, k2], "all", at(3)))[
        "outcome"] == "waiting"
    assert await db.fetchval(FAIL, k1, "cw", g1, at(4)) == "failed"
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    delete = "DELETE FROM zeroth.runs WHERE run_id = $1"
    if first == "redrive":
        await operator.begin()
        assert (await operator.call(REDRIVE, k1, at(5))).value is True
        late = dba.spawn(delete, k1)
        await assert_waits_for(db, dba, operator, late)
        await operator.commit()
        assert (await finished(late)).sqlstate is None
    else:
        await dba.begin()
        await dba.call(delete, k1)
        late = operator.spawn(REDRIVE, k1, at(5))
        await assert_waits_for(db, operator, dba, late)
        await dba.commit()
        assert (await finished(late)).sqlstate == "ZP001"
    assert await db.fetchval("SELECT count(*) FROM zeroth.runs WHERE run_id = $1", k1) == 0
    assert await db.fetchval(REMAINING, lease.run_id) == 1
    assert (await run_row(db, lease.run_id))["status"] == "waiting"
    assert await db.fetchval(COMPLETE, k2, "cw", g2, json.dumps(2), at(6)) is True
    assert (await run_row(db, lease.run_id))["status"] == "pending"
