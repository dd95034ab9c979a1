"""Two sessions settling the same run (the same worker id in two processes, or a retried call
racing its first try): exactly one outcome lands, and its attempt is recorded once.

Session A settles inside an open transaction (it holds the run's slot and row locks); session B's
settle of the same lease waits for them (zeroth._lock_settle), then reads the clock and judges
the lease on the row A left: after A's commit the lease is gone and B is fenced out (ZP002,
nothing written); after A's rollback B's own outcome lands. Real clock: zeroth.* directly.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from helpers import make_run, run_row
from interleave import Session, assert_waits_for, finished

HOLDER = "worker-a"

SETTLE = f"""SELECT s.outcome, s.sqlstate FROM zeroth.settle_runs(worker_id => '{HOLDER}',
                 run_ids => ARRAY[$1]::uuid[], generations => '{{1}}', outcomes => ARRAY[$2])
                 s"""

#: What each outcome leaves: (status, history outcome).
ENDS = {"complete": ("completed", "completed"), "fail": ("failed", "failed"),
        "retry": ("pending", "failed"), "cancel": ("cancelled", "cancelled"),
        "hand_back": ("pending", "handed_back")}
SETTLED = {"complete": "completed", "fail": "failed", "retry": "retry_scheduled",
           "cancel": "cancelled", "hand_back": "handed_back"}


async def running_run(db: Any) -> UUID:
    now = await db.fetchval("SELECT clock_timestamp()")
    return (await make_run(db, "running", worker_id=HOLDER, now=now, max_concurrency=1)).run_id


async def history(db: Any, run_id: UUID) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await db.fetch(
        "SELECT lease_generation, worker_id, outcome FROM zeroth.run_attempts WHERE run_id = $1",
        run_id)]


@pytest.mark.parametrize(("first", "second"), [
    ("complete", "fail"), ("fail", "complete"), ("cancel", "complete"),
    ("hand_back", "retry"), ("retry", "cancel"), ("complete", "complete")])
async def test_the_second_settle_of_a_run_waits_and_is_fenced_out(
        sessions: tuple[Session, Session, Any], first: str, second: str) -> None:
    a, b, db = sessions
    run_id = await running_run(db)
    await a.begin()
    assert (await a.rows(SETTLE, run_id, first)).value == [
        {"outcome": SETTLED[first], "sqlstate": None}]
    late = b.spawn(SETTLE, run_id, second, rows=True)
    await assert_waits_for(db, b, a, late)
    await a.commit()

    outcome = await finished(late)
    assert outcome.value == [{"outcome": None, "sqlstate": "ZP002"}], outcome
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"]) == (ENDS[first][0], None)
    assert await history(db, run_id) == [(1, HOLDER, ENDS[first][1])]
    assert await db.fetchval(
        "SELECT count(*) FROM zeroth.admission_slots WHERE run_id IS NOT NULL") == 0


async def test_a_settle_that_waited_on_a_rolled_back_one_lands(
        sessions: tuple[Session, Session, Any]) -> None:
    a, b, db = sessions
    run_id = await running_run(db)
    await a.begin()
    assert (await a.rows(SETTLE, run_id, "fail")).value[0]["outcome"] == "failed"
    late = b.spawn(SETTLE, run_id, "complete", rows=True)
    await assert_waits_for(db, b, a, late)
    await a.rollback()

    assert (await finished(late)).value == [{"outcome": "completed", "sqlstate": None}]
    assert (await run_row(db, run_id))["status"] == "completed"
    assert await history(db, run_id) == [(1, HOLDER, "completed")]


async def test_a_single_run_end_racing_a_batch_settle_lands_once(
        sessions: tuple[Session, Session, Any]) -> None:
    """complete_run and settle_runs take the same lock prologue: one waits for the other."""
    a, b, db = sessions
    run_id = await running_run(db)
    await a.begin()
    assert (await a.call(f"SELECT zeroth.complete_run(run_id => $1, worker_id => '{HOLDER}', "
                         "generation => 1)", run_id)).value is True
    late = b.spawn(SETTLE, run_id, "hand_back", rows=True)
    await assert_waits_for(db, b, a, late)
    await a.commit()

    assert (await finished(late)).value == [{"outcome": None, "sqlstate": "ZP002"}]
    assert (await run_row(db, run_id))["status"] == "completed"
    assert await history(db, run_id) == [(1, HOLDER, "completed")]


WAIT_FOR_EVENT = f"""SELECT outcome FROM zeroth.wait_for_event(run_id => $1,
                         worker_id => '{HOLDER}', generation => 1, step_key => '#event:e',
                         name => 'e')"""


async def test_a_wait_whose_lease_ran_out_while_it_waited_for_the_event_row_is_not_cancelled(
        sessions: tuple[Session, Session, Any]) -> None:
    """wait_for_event locks the run, then waits for the event's row (an operator holds it), and
    its lease runs out meanwhile: the settle that takes the run to waiting is fenced out, and the
    call says so (outcome NULL) — never 'cancelled' for a run nobody cancelled, which stays
    running for claim_orphaned to recover."""
    waiter, operator, db = sessions
    now = await db.fetchval("SELECT clock_timestamp()")
    run_id = (await make_run(db, "running", worker_id=HOLDER, now=now, lease_seconds=3)).run_id
    await db.execute("""INSERT INTO zeroth.events (tenant_id, workspace_key, name, created_at)
                        VALUES ('default', '', 'e', now())""")
    await operator.begin()
    await operator.call("SELECT 1 FROM zeroth.events WHERE name = 'e' FOR UPDATE")
    wait = waiter.spawn(WAIT_FOR_EVENT, run_id, rows=True)
    # Blocked on the event's row: past the run's lock and the fence check, with a live lease.
    await assert_waits_for(db, waiter, operator, wait)
    for _ in range(600):  # until the lease has run out (by the database's clock)
        if await db.fetchval("""SELECT lease_expires_at < clock_timestamp() FROM zeroth.runs
                                 WHERE run_id = $1""", run_id):
            break
        await db.execute("SELECT pg_sleep(0.05)")
    await operator.commit()

    outcome = await finished(wait)
    assert outcome.value == [{"outcome": None}], outcome
    row = await run_row(db, run_id)
    assert (row["status"], row["cancel_requested_at"]) == ("running", None)
    assert await history(db, run_id) == []


# A single completion locks its run before it settles (zeroth._lock_settle) and reads the clock
# once it holds the row: a version another session committed while it waited is what it decides
# on. Runs without an admission slot, so the completion waits on the run row itself.
COMPLETE_ONE = f"""SELECT run_id, completed FROM zeroth.complete_runs(worker_id => '{HOLDER}',
                       run_ids => ARRAY[$1]::uuid[], generations => '{{1}}')"""


async def slotless_running_run(db: Any) -> UUID:
    now = await db.fetchval("SELECT clock_timestamp()")
    return (await make_run(db, "running", worker_id=HOLDER, now=now)).run_id


@pytest.mark.parametrize("call", [COMPLETE_ONE, SETTLE])
async def test_a_lone_completion_that_waited_for_its_own_renewal_lands(
        sessions: tuple[Session, Session, Any], call: str) -> None:
    """The worker's renew loop holds the row (an open transaction) when the completion comes:
    the completion waits, and after the renewal commits (a new row version, the same lease) it
    lands — never refused as a lost lease."""
    a, b, db = sessions
    run_id = await slotless_running_run(db)
    await a.begin()
    assert (await a.call(f"SELECT zeroth.renew_lease(run_id => $1, worker_id => '{HOLDER}', "
                         "generation => 1)", run_id)).value is True
    args = (run_id,) if call is COMPLETE_ONE else (run_id, "complete")
    late = b.spawn(call, *args, rows=True)
    await assert_waits_for(db, b, a, late)
    await a.commit()

    value = (await finished(late)).value
    assert value in ([{"run_id": run_id, "completed": True}],
                     [{"outcome": "completed", "sqlstate": None}]), value
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"]) == ("completed", None)
    assert await history(db, run_id) == [(1, HOLDER, "completed")]


@pytest.mark.parametrize("update", [
    # The DBA hands the lease to another worker.
    "UPDATE zeroth.runs SET lease_worker_id = 'dba' WHERE run_id = $1",
    # The DBA expires the lease.
    "UPDATE zeroth.runs SET lease_expires_at = clock_timestamp() - interval '1 s' "
    "WHERE run_id = $1",
    # (A DBA's fix of the attempt count or its start leaves the lease live: the completion lands
    # on the row as left, tests/races/test_lone_completion_races.py.)
])
async def test_a_lone_completion_that_waited_for_a_dbas_update_is_fenced_out(
        sessions: tuple[Session, Session, Any], update: str) -> None:
    """A DBA's UPDATE of the run, committed while the completion waited for the row, is never
    overwritten: the completion decides on the new version (worker, lease) and is refused
    (false), changing nothing."""
    a, b, db = sessions
    run_id = await slotless_running_run(db)
    await a.begin()
    await a.call(update, run_id)
    late = b.spawn(COMPLETE_ONE, run_id, rows=True)
    await assert_waits_for(db, b, a, late)
    await a.commit()
    changed = await run_row(db, run_id)

    assert (await finished(late)).value == [{"run_id": run_id, "completed": False}]
    assert await run_row(db, run_id) == changed
    assert changed["status"] == "running"
