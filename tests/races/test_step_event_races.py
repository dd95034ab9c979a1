"""Scripted interleavings of the step and event functions with the calls they can meet.

Two sessions recording one step: the second waits for the first's run-row lock and returns the
first's result (exactly one recorded). A stale holder whose record waited behind a takeover
records nothing. A wait and an emit of one name serialise on the event's row, in either order:
the emit that commits first is seen by the wait (received), and the wait that commits first is
woken by the emit (woken = 1); no wake-up is lost. Clocks are injected with now_override.
"""

from __future__ import annotations

import json

from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from interleave import assert_waits_for, finished, only

RECORD = """SELECT recorded, recorded_result::text AS result FROM zeroth_test.record_step(
                run_id => $1, worker_id => $2, generation => $3, step_key => 'charge',
                result => $4::text::jsonb, now_override => $5)"""
WAIT = """SELECT outcome, payload::text AS payload FROM zeroth_test.wait_for_event(run_id => $1,
              worker_id => $2, generation => $3, step_key => '#event:e', name => 'e',
              now_override => $4)"""
EMIT = """SELECT emitted, woken FROM zeroth_test.emit_event(name => 'e', payload => $1::text::jsonb,
              now_override => $2)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => $2, now_override => $3)
                     WHERE run_id IS NOT NULL"""
STEPS = "SELECT count(*) FROM zeroth.run_steps s WHERE s.run_id = $1"


async def test_two_sessions_racing_one_step_record_exactly_one_result(sessions):
    a, b, db = sessions
    lease = await make_run(db, "running")
    await a.begin()
    first = only(await a.rows(RECORD, lease.run_id, WORKER, 1, json.dumps("a"), at(1)))
    assert first["recorded"] is True
    second = b.spawn(RECORD, lease.run_id, WORKER, 1, json.dumps("b"), at(1), rows=True)
    await assert_waits_for(db, b, a, second)
    await a.commit()
    won = only(await finished(second))
    assert (won["recorded"], json.loads(won["result"])) == (False, "a")
    assert await db.fetchval(STEPS, lease.run_id) == 1


async def test_a_stale_record_that_waited_for_the_takeover_records_nothing(sessions):
    holder, sweeper, db = sessions
    lease = await make_run(db, "running")
    await sweeper.begin()
    taken = only(await sweeper.rows(CLAIM_ORPHANED, DEPLOYMENT, "worker-b", at(61)))
    assert taken["lease_generation"] == 2
    stale = holder.spawn(RECORD, lease.run_id, WORKER, 1, json.dumps("stale"), at(59), rows=True)
    await assert_waits_for(db, holder, sweeper, stale)
    await sweeper.commit()
    assert only(await finished(stale))["recorded"] is None
    assert await db.fetchval(STEPS, lease.run_id) == 0


async def test_a_wait_holding_the_event_row_is_woken_by_the_emit_that_waited(sessions):
    waiter, emitter, db = sessions
    lease = await make_run(db, "running")
    await waiter.begin()
    assert only(await waiter.rows(WAIT, lease.run_id, WORKER, 1, at(1)))["outcome"] == "waiting"
    emit = emitter.spawn(EMIT, json.dumps({"ok": 1}), at(2), rows=True)
    await assert_waits_for(db, emitter, waiter, emit)
    await waiter.commit()
    assert only(await finished(emit)) == {"emitted": True, "woken": 1}
    assert (await run_row(db, lease.run_id))["status"] == "pending"


async def test_an_emit_holding_the_event_row_is_seen_by_the_wait_that_waited(sessions):
    waiter, emitter, db = sessions
    lease = await make_run(db, "running")
    # The event's row exists (a channel) so that the emit holds it, as a second emit would.
    await db.execute("""INSERT INTO zeroth.events (tenant_id, workspace_key, name, created_at)
                        VALUES ('default', '', 'e', now())""")
    await emitter.begin()
    assert only(await emitter.rows(EMIT, json.dumps({"ok": 2}), at(1))) == {"emitted": True,
                                                                            "woken": 0}
    wait = waiter.spawn(WAIT, lease.run_id, WORKER, 1, at(2), rows=True)
    await assert_waits_for(db, waiter, emitter, wait)
    await emitter.commit()
    got = only(await finished(wait))
    assert (got["outcome"], json.loads(got["payload"])) == ("received", {"ok": 2})
    assert (await run_row(db, lease.run_id))["status"] == "running"


async def test_an_emit_of_a_new_name_racing_a_first_wait_loses_nothing(sessions):
    """No event row yet: both sessions insert it; the second waits on the first's key."""
    waiter, emitter, db = sessions
    lease = await make_run(db, "running")
    await emitter.begin()
    assert only(await emitter.rows(EMIT, json.dumps(3), at(1)))["emitted"] is True
    wait = waiter.spawn(WAIT, lease.run_id, WORKER, 1, at(2), rows=True)
    await assert_waits_for(db, waiter, emitter, wait)
    await emitter.commit()
    assert only(await finished(wait))["outcome"] == "received"
