"""A waiting run's run deadline (issue 34 item 2) met by the event it waits for, or by a resume,
two sessions each way: the sweep (zeroth.wake_due_waits) ending the run past its deadline, and
emit_event / resume_run making it pending. Whichever holds the run's row first lands; the other
changes nothing; a run woken first is ended by the next sweep (pending past its deadline):
exactly one outcome, failed with stop_reason run_timeout, and no run both woken and ended.

Test clock: each call is placed at its time with ``now_override`` (zeroth_test wrappers).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from interleave import assert_waits_for, finished, finishes_without_waiting

SWEEP = f"""SELECT zeroth_test.wake_due_waits(deployment_refs => ARRAY['{DEPLOYMENT}'],
    now_override => $1)"""
EMIT = """SELECT woken FROM zeroth_test.emit_event(name => 'approved', payload => '{}',
    now_override => $1)"""
RESUME = """SELECT zeroth_test.resume_run(run_id => $1, now_override => $2)"""
WAIT = """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
    generation => $3, step_key => 'approve', name => 'approved', timeout_seconds => 3600,
    now_override => $4)"""


async def waiting_run(db: Any, *, event: bool) -> UUID:
    """A run claimed at T0 with a run deadline T0 + 100, now waiting (for the event 'approved',
    or paused)."""
    await db.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                     "run_timeout_seconds => 100)", DEPLOYMENT)
    if not event:
        return (await make_run(db, "waiting")).run_id
    lease = await make_run(db, "running")
    assert await db.fetchval(WAIT, lease.run_id, WORKER, lease.generation, at(1)) == "waiting"
    return lease.run_id


async def outcome_of(db: Any, run_id: UUID) -> tuple[Any, ...]:
    row = await run_row(db, run_id)
    error = row["error"]
    stop = json.loads(error)["stop_reason"] if isinstance(error, str) else None
    return row["status"], stop


async def test_a_sweep_holding_the_run_ends_it_and_the_emit_wakes_nothing(sessions):
    sweeper, emitter, db = sessions
    run_id = await waiting_run(db, event=True)
    await sweeper.begin()
    assert (await sweeper.call(SWEEP, at(101))).value == 1
    emit = emitter.spawn(EMIT, at(101))
    await assert_waits_for(db, emitter, sweeper, emit)
    await sweeper.commit()
    assert (await finished(emit)).value == 0
    assert await outcome_of(db, run_id) == ("failed", "run_timeout")


async def test_an_emit_holding_the_run_wins_and_the_next_sweep_ends_it(sessions):
    emitter, sweeper, db = sessions
    run_id = await waiting_run(db, event=True)
    await emitter.begin()
    assert (await emitter.call(EMIT, at(101))).value == 1
    swept = await finishes_without_waiting(db, sweeper, sweeper.spawn(SWEEP, at(101)))
    assert swept.value == 0  # skipped (SKIP LOCKED): the emit holds it
    await emitter.commit()
    assert await outcome_of(db, run_id) == ("pending", None)
    # Woken, but still past its run deadline: the next sweep (or claim) ends it, never starts it.
    assert (await sweeper.call(SWEEP, at(102))).value == 1
    assert await outcome_of(db, run_id) == ("failed", "run_timeout")


async def test_a_resume_that_waited_for_the_sweep_finds_the_run_ended(sessions):
    sweeper, operator, db = sessions
    run_id = await waiting_run(db, event=False)
    await sweeper.begin()
    assert (await sweeper.call(SWEEP, at(101))).value == 1
    resume = operator.spawn(RESUME, run_id, at(101))
    await assert_waits_for(db, operator, sweeper, resume)
    await sweeper.commit()
    assert (await finished(resume)).sqlstate == "ZP003"  # not waiting any more
    assert await outcome_of(db, run_id) == ("failed", "run_timeout")


async def test_a_resume_holding_the_run_wins_and_the_next_sweep_ends_it(sessions):
    operator, sweeper, db = sessions
    run_id = await waiting_run(db, event=False)
    await operator.begin()
    assert (await operator.call(RESUME, run_id, at(101))).value is True
    swept = await finishes_without_waiting(db, sweeper, sweeper.spawn(SWEEP, at(101)))
    assert swept.value == 0
    await operator.commit()
    assert (await sweeper.call(SWEEP, at(102))).value == 1
    assert await outcome_of(db, run_id) == ("failed", "run_timeout")


async def test_two_sweeps_end_the_run_once(sessions):
    first, second, db = sessions
    run_id = await waiting_run(db, event=False)
    await first.begin()
    assert (await first.call(SWEEP, at(101))).value == 1
    swept = await finishes_without_waiting(db, second, second.spawn(SWEEP, at(101)))
    assert swept.value == 0
    await first.commit()
    assert (await second.call(SWEEP, at(101))).value == 0
    assert await outcome_of(db, run_id) == ("failed", "run_timeout")
    assert await db.fetchval("SELECT count(*) FROM zeroth.run_attempts WHERE run_id = $1 "
                             "AND outcome <> 'paused'", run_id) == 0

