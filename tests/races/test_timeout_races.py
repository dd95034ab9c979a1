"""Attempt deadlines (issue 34, item 2) met by the holder at the deadline, two sessions each way.

* A timeout meeting a completion at the deadline: the holder completes at the deadline (its lease,
  capped there, still lives) while the orphan sweep ends the attempt just after it. Whichever
  holds the run's row first lands; the other changes nothing: exactly one outcome, one attempt
  row.
* A renewal meeting the sweep at the deadline: a renewal that waited for the sweep finds the
  attempt ended; a renewal the sweep skipped (SKIP LOCKED) extended nothing past the deadline,
  so the next sweep ends the attempt.

Test clock: each call is placed at its time with ``now_override`` (zeroth_test wrappers).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from helpers import DEPLOYMENT, T0, WORKER, at, make_run, run_row
from interleave import Session, assert_waits_for, finished, finishes_without_waiting

COMPLETE = f"""SELECT zeroth_test.complete_run(run_id => $1, worker_id => '{WORKER}',
    generation => 1, output => '{{"done": true}}', now_override => $2)"""
SWEEP = f"""SELECT count(*) FROM zeroth_test.claim_orphaned(deployment_ref => '{DEPLOYMENT}',
    worker_id => 'sweeper', now_override => $1) c WHERE c.run_id IS NOT NULL"""
RENEW = f"""SELECT zeroth_test.renew_lease(run_id => $1, worker_id => '{WORKER}', generation => 1,
    lease_seconds => 60, now_override => $2)"""


async def timed_run(db: Any) -> UUID:
    """A running run of WORKER at generation 1, claimed at T0 with an attempt deadline T0 + 30
    (its lease of 60 s capped there)."""
    await db.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => $1, "
                     "attempt_timeout_seconds => 30)", DEPLOYMENT)
    lease = await make_run(db, "running", worker_id=WORKER, now=T0)
    row = await run_row(db, lease.run_id)
    assert (row["lease_expires_at"], row["attempt_deadline_at"]) == (at(30), at(30))
    return lease.run_id


async def outcome_of(db: Any, run_id: UUID) -> tuple[Any, ...]:
    row = await run_row(db, run_id)
    error = row["error"]
    stop = json.loads(error)["stop_reason"] if isinstance(error, str) else None
    attempts = [tuple(r) for r in await db.fetch(
        "SELECT lease_generation, outcome FROM zeroth.run_attempts WHERE run_id = $1", run_id)]
    return row["status"], stop, attempts


def just_after(seconds: float) -> datetime:
    return at(seconds + 0.001)


async def test_a_completion_holding_the_row_at_the_deadline_wins_over_the_sweep(
        sessions: tuple[Session, Session, Any]) -> None:
    holder, sweeper, db = sessions
    run_id = await timed_run(db)
    await holder.begin()
    assert (await holder.call(COMPLETE, run_id, at(30))).value is True
    swept = await finishes_without_waiting(db, sweeper, sweeper.spawn(SWEEP, just_after(30)))
    assert swept.value == 0
    await holder.commit()
    assert (await sweeper.call(SWEEP, just_after(30))).value == 0
    assert await outcome_of(db, run_id) == ("completed", None, [(1, "completed")])


async def test_a_sweep_holding_the_row_past_the_deadline_wins_over_a_completion(
        sessions: tuple[Session, Session, Any]) -> None:
    holder, sweeper, db = sessions
    run_id = await timed_run(db)
    await sweeper.begin()
    assert (await sweeper.call(SWEEP, just_after(30))).value == 0  # ended, not re-leased
    late = holder.spawn(COMPLETE, run_id, at(30))
    await assert_waits_for(db, holder, sweeper, late)
    await sweeper.commit()
    assert (await finished(late)).value is False
    assert await outcome_of(db, run_id) == ("pending", "attempt_timeout", [(1, "timed_out")])


async def test_a_renewal_that_waited_for_the_sweep_finds_the_attempt_ended(
        sessions: tuple[Session, Session, Any]) -> None:
    holder, sweeper, db = sessions
    run_id = await timed_run(db)
    await sweeper.begin()
    await sweeper.call(SWEEP, just_after(30))
    renewal = holder.spawn(RENEW, run_id, at(30))
    await assert_waits_for(db, holder, sweeper, renewal)
    await sweeper.commit()
    assert (await finished(renewal)).value is False
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"]) == ("pending", None)
    assert await outcome_of(db, run_id) == ("pending", "attempt_timeout", [(1, "timed_out")])


async def test_a_renewal_the_sweep_skipped_extends_nothing_past_the_deadline(
        sessions: tuple[Session, Session, Any]) -> None:
    holder, sweeper, db = sessions
    run_id = await timed_run(db)
    await holder.begin()
    assert (await holder.call(RENEW, run_id, at(29))).value is True
    swept = await finishes_without_waiting(db, sweeper, sweeper.spawn(SWEEP, just_after(30)))
    assert swept.value == 0
    await holder.commit()
    assert (await run_row(db, run_id))["lease_expires_at"] == at(30)  # capped: not T0 + 89
    assert (await sweeper.call(SWEEP, just_after(30))).value == 0
    assert await outcome_of(db, run_id) == ("pending", "attempt_timeout", [(1, "timed_out")])
