"""A fenced write that waited for its run's row judges the lease by the time it got the row.

The failure guarded against: a fenced write that read the clock once, at the start of the
call, and its UPDATE checked ``lease_expires_at >= <that time>``. A call that waited for the row
lock (behind a cancel request, an operator, another call of the same worker) re-checked its
WHERE on the new row version against the old time, so a lease an operator cleared (or that
expired) while the call waited still let the write land. Every fenced write now locks the run
row first (zeroth._lock_leased_run; complete_runs locks its batch) and reads the clock after.

Real clock: the calls go to zeroth.* directly (the test clock is unset in these sessions), so the
time the waiting call reads after the lock really is later than the operator's clear_lease.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from helpers import make_run, run_row
from interleave import Session, assert_waits_for, finished

HOLDER = "worker-a"
FENCE = f"run_id => $1, worker_id => '{HOLDER}', generation => 1"

#: Each fenced write of the holder, and what it returns when the fence refuses it.
WRITES: dict[str, tuple[str, Any]] = {
    "complete_run": (f"SELECT zeroth.complete_run({FENCE}, output => '{{\"late\": 1}}')", False),
    "complete_runs": (
        f"""SELECT c.completed FROM zeroth.complete_runs(worker_id => '{HOLDER}',
                run_ids => ARRAY[$1]::uuid[], generations => '{{1}}') c""", False),
    "fail_run": (f"SELECT zeroth.fail_run({FENCE}, error => '{{\"late\": 1}}')", None),
    "settle_runs": (
        f"""SELECT s.outcome FROM zeroth.settle_runs(worker_id => '{HOLDER}',
                run_ids => ARRAY[$1]::uuid[], generations => '{{1}}',
                outcomes => '{{complete}}') s""", None),
    "hand_back_to_pending": (f"SELECT zeroth.hand_back_to_pending({FENCE})", False),
    "commit_fenced": (
        f"SELECT zeroth.commit_fenced({FENCE}, columns => '{{\"output\": {{\"late\": 1}}}}')",
        False),
    "save_checkpoint": (f"SELECT zeroth.save_checkpoint({FENCE}, data => '{{\"late\": 1}}')",
                        None),
    "cancel_run": (f"SELECT zeroth.cancel_run({FENCE})", False),
    "pause_run": (f"SELECT zeroth.pause_run({FENCE}, reason => 'approval')", False),
    "sleep_run": (
        f"""SELECT s.outcome FROM zeroth.sleep_run({FENCE}, delay_seconds => 5,
                checkpoint => '{{"late": 1}}') s""", None),
    "release_lease": (f"SELECT zeroth.release_lease({FENCE})", False),
    "expire_recovery_lease": (f"SELECT zeroth.expire_recovery_lease({FENCE})", False),
    "update_run_progress": (
        f"SELECT zeroth.update_run_progress({FENCE}, progress => '{{\"late\": 1}}')", False),
    "start_run": (f"SELECT zeroth.start_run({FENCE})", False),
}


async def running_run(db: Any, **kwargs: Any) -> UUID:
    """A running run of HOLDER at generation 1, its lease live for a minute of real time."""
    now = await db.fetchval("SELECT clock_timestamp()")
    return (await make_run(db, "running", worker_id=HOLDER, now=now, **kwargs)).run_id


def as_it_was(row: Any) -> tuple[Any, ...]:
    """What a late write could have changed, besides the lease the operator expired."""
    return (row["status"], row["lease_worker_id"], row["lease_generation"], row["attempts"],
            row["output"], row["error"], row["progress"], row["checkpoint_seq"],
            row["finished_at"])


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_a_write_that_waited_while_an_operator_cleared_the_lease_is_refused(
        sessions: tuple[Session, Session, Any], write: str) -> None:
    holder, operator, db = sessions
    run_id = await running_run(db)
    # The operator holds the run row (a cancel request), so the holder's write waits for it.
    await operator.begin()
    assert (await operator.call("SELECT (zeroth.request_cancel_v2(run_id => $1)).outcome", run_id)
            ).value == "cancel_requested"
    query, refused = WRITES[write]
    late = holder.spawn(query, run_id)
    await assert_waits_for(db, holder, operator, late)
    # While it waits: the operator takes the lease away, and commits.
    assert (await operator.call("SELECT zeroth.clear_lease(run_id => $1)", run_id)).value
    cleared = as_it_was(await run_row(db, run_id))  # not yet committed: the row before
    await operator.commit()

    outcome = await finished(late)
    assert outcome.sqlstate is None, outcome
    assert outcome.value == refused
    row = await run_row(db, run_id)
    assert as_it_was(row) == cleared
    assert row["lease_expires_at"] < await db.fetchval("SELECT clock_timestamp()")
    assert await db.fetchval(
        "SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = $1", run_id) == 0


async def test_a_batch_that_waited_on_one_run_refuses_the_run_cleared_meanwhile(
        sessions: tuple[Session, Session, Any]) -> None:
    """complete_runs locks in run_id order: blocked on the first run, it holds nothing of the
    second, which an operator clears before the batch reaches it."""
    holder, operator, db = sessions
    first = await running_run(db, run_id=UUID(int=1))
    second = await running_run(db, run_id=UUID(int=2))
    await operator.begin()
    assert (await operator.call("SELECT (zeroth.request_cancel_v2(run_id => $1)).outcome", first)
            ).value == "cancel_requested"
    batch = holder.spawn(
        f"""SELECT c.run_id, c.completed FROM zeroth.complete_runs(worker_id => '{HOLDER}',
                run_ids => ARRAY[$1, $2]::uuid[], generations => '{{1, 1}}') c""",
        first, second, rows=True)
    await assert_waits_for(db, holder, operator, batch)
    assert (await operator.call("SELECT zeroth.clear_lease(run_id => $1)", second)).value
    await operator.commit()

    outcome = await finished(batch)
    assert outcome.value == [{"run_id": first, "completed": True},
                             {"run_id": second, "completed": False}], outcome
    assert (await run_row(db, first))["status"] == "completed"
    row = await run_row(db, second)
    assert (row["status"], row["output"], row["finished_at"]) == ("running", None, None)


async def test_a_write_that_waited_behind_a_live_holders_other_call_still_lands(
        sessions: tuple[Session, Session, Any]) -> None:
    """The guard against over-correcting: waiting alone refuses nothing while the lease lives."""
    holder, operator, db = sessions
    run_id = await running_run(db)
    await operator.begin()
    assert (await operator.call("SELECT (zeroth.request_cancel_v2(run_id => $1)).outcome", run_id)
            ).value == "cancel_requested"
    late = holder.spawn(WRITES["complete_run"][0], run_id)
    await assert_waits_for(db, holder, operator, late)
    await operator.commit()

    assert (await finished(late)).value is True
    assert (await run_row(db, run_id))["status"] == "completed"
