"""A lone completion (complete_run, complete_runs or settle_runs of one run, fail_run's
completion-shaped peers excluded) racing another session on the same run.

A single completion locks the run before it settles, as every lease-ending call does. Settling
it unlocked (its UPDATE the row lock, one heap LOCK record less) was tried for WAL (issue 30) and
reverted: everything the settling statement reads — the run's event stream, the clock, the lease —
is read before that UPDATE waits for the row, and an UPDATE does not re-check its predicate after
waiting for a row that was only locked. These tests hold the run's row in session A (an open
transaction) while session B completes it, then check that B's completion acts on the run as A
left it: the END of the event stream numbered after every event the holder appended, written
once, the stream's hint sent, the times no earlier than that event, and a lease that ran out
while it waited refused.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from helpers import make_run, run_row
from interleave import Session, assert_waits_for, finished

HOLDER = "worker-a"

COMPLETE_RUN = f"""SELECT zeroth.complete_run(run_id => $1, worker_id => '{HOLDER}',
                       generation => 1)"""
COMPLETE_RUNS = f"""SELECT completed FROM zeroth.complete_runs(worker_id => '{HOLDER}',
                        run_ids => ARRAY[$1]::uuid[], generations => '{{1}}')"""
SETTLE_RUNS = f"""SELECT s.outcome FROM zeroth.settle_runs(worker_id => '{HOLDER}',
                      run_ids => ARRAY[$1]::uuid[], generations => '{{1}}',
                      outcomes => ARRAY['complete']) s"""
APPEND = f"""SELECT zeroth.append_run_event(run_id => $1, worker_id => '{HOLDER}',
                 generation => 1, name => $2)"""

COMPLETIONS = {"complete_run": (COMPLETE_RUN, True), "complete_runs": (COMPLETE_RUNS, True),
               "settle_runs": (SETTLE_RUNS, "completed")}


async def slotless_running_run(db: Any) -> UUID:
    now = await db.fetchval("SELECT clock_timestamp()")
    return (await make_run(db, "running", worker_id=HOLDER, now=now)).run_id


async def stream(db: Any, run_id: UUID) -> list[tuple[int, str, str]]:
    return [tuple(r) for r in await db.fetch(
        """SELECT event_id, kind, name FROM zeroth.run_events WHERE run_id = $1
            ORDER BY event_id""", run_id)]


@pytest.mark.parametrize("earlier", [0, 1, 3])
@pytest.mark.parametrize("call", sorted(COMPLETIONS))
async def test_a_completion_that_waited_for_an_append_ends_the_stream_after_it(
        sessions: tuple[Session, Session, Any], call: str, earlier: int) -> None:
    """The holder appends an event (another connection of the same worker: a handler's
    background emitter) while its completion comes: the completion waits for the append's row
    lock and then completes the run, with the stream's END stored after the appended event —
    never refused, never an error (a duplicate event id), never an END missing for a run that
    has events."""
    a, b, db = sessions
    run_id = await slotless_running_run(db)
    for i in range(earlier):
        assert await db.fetchval(APPEND, run_id, f"before-{i}") == i + 1
    await a.begin()
    assert (await a.call(APPEND, run_id, "racing")).value == earlier + 1
    query, accepted = COMPLETIONS[call]
    late = b.spawn(query, run_id)
    await assert_waits_for(db, b, a, late)
    await a.commit()

    outcome = await finished(late)
    assert outcome.value == accepted, outcome
    assert (await run_row(db, run_id))["status"] == "completed"
    events = [(i + 1, "event", f"before-{i}") for i in range(earlier)]
    events.append((earlier + 1, "event", "racing"))
    events.append((earlier + 2, "end", "end"))
    assert await stream(db, run_id) == events


START = f"SELECT zeroth.start_run(run_id => $1, worker_id => '{HOLDER}', generation => 1)"


@pytest.mark.parametrize("call", sorted(COMPLETIONS))
async def test_a_completion_that_waited_for_its_own_start_lands(
        sessions: tuple[Session, Session, Any], call: str) -> None:
    """The holder's start_run (a claimed run, pending → running) is committing when its
    completion comes (the same worker in a second process, or a start retried after a lost
    answer): the completion waits for the start and completes the run — never ZP003 "no such
    edge from pending" for a run that is running by the time it could write (a RunWorker fails a
    run for good on a ZP error from its completion)."""
    a, b, db = sessions
    now = await db.fetchval("SELECT clock_timestamp()")
    run_id = (await make_run(db, "claimed", worker_id=HOLDER, now=now)).run_id
    await a.begin()
    assert (await a.call(START, run_id)).value is True
    query, accepted = COMPLETIONS[call]
    late = b.spawn(query, run_id)
    await assert_waits_for(db, b, a, late)
    await a.commit()

    assert (await finished(late)).value == accepted
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"], row["attempts"]) == ("completed", None, 1)
    assert [tuple(r) for r in await db.fetch(
        "SELECT lease_generation, worker_id, outcome FROM zeroth.run_attempts WHERE run_id = $1",
        run_id)] == [(1, HOLDER, "completed")]


@pytest.mark.parametrize("update", [
    "UPDATE zeroth.runs SET attempts = attempts + 1 WHERE run_id = $1",
    "UPDATE zeroth.runs SET started_at = started_at - interval '1 s' WHERE run_id = $1",
])
async def test_a_completion_that_waited_for_a_dbas_fix_of_the_attempt_lands(
        sessions: tuple[Session, Session, Any], update: str) -> None:
    """A DBA's UPDATE of the attempt's bookkeeping (its count, its start), committed while the
    holder's completion waited for the row, leaves the lease live and the holder's: the
    completion lands on the row as the DBA left it (the attempt recorded with the DBA's values) —
    never refused as a lost lease, which drops the holder's result and has the run executed again
    once the lease expires."""
    a, b, db = sessions
    run_id = await slotless_running_run(db)
    await a.begin()
    await a.call(update, run_id)
    late = b.spawn(COMPLETE_RUN, run_id)
    await assert_waits_for(db, b, a, late)
    await a.commit()
    fixed = await run_row(db, run_id)

    assert (await finished(late)).value is True
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"]) == ("completed", None)
    assert (row["attempts"], row["started_at"]) == (fixed["attempts"], fixed["started_at"])
    assert [tuple(r) for r in await db.fetch(
        """SELECT lease_generation, worker_id, outcome, attempt FROM zeroth.run_attempts
            WHERE run_id = $1""", run_id)] == [(1, HOLDER, "completed", fixed["attempts"])]


async def test_a_completion_that_waited_ends_the_stream_no_earlier_than_its_last_event(
        sessions: tuple[Session, Session, Any], connect: Any) -> None:
    """The completion read the clock, then was held up before its UPDATE reached the run's row
    (here: a DBA's lock of zeroth.run_transitions; in life, any stall in that window) while the
    holder appended an event: the run's finish time, its END and its ended attempt are no
    earlier than any event the run kept (the locked form read the clock once it held the row:
    an append then waited for it, and was fenced out)."""
    a, b, db = sessions
    emitter = Session(await connect())
    run_id = await slotless_running_run(db)
    assert await db.fetchval(APPEND, run_id, "before") == 1
    await a.begin()
    await a.call("LOCK TABLE zeroth.run_transitions IN ACCESS EXCLUSIVE MODE")
    late = b.spawn(COMPLETE_RUN, run_id)
    await assert_waits_for(db, b, a, late)
    append = emitter.spawn(APPEND, run_id, "meanwhile")
    for _ in range(1000):  # the append went through, or waits for the completion's row lock
        if append.done() or await db.fetchval("SELECT pg_blocking_pids($1)", emitter.pid):
            break
        await db.execute("SELECT pg_sleep(0.005)")
    await a.commit()

    assert (await finished(late)).value is True
    assert (await finished(append)).sqlstate is None
    events = await db.fetch("""SELECT event_id, kind, created_at FROM zeroth.run_events
                                WHERE run_id = $1 ORDER BY event_id""", run_id)
    assert [e["kind"] for e in events] == ["event"] * (len(events) - 1) + ["end"]
    assert [e["event_id"] for e in events] == list(range(1, len(events) + 1))
    last_event = max(e["created_at"] for e in events if e["kind"] == "event")
    row = await run_row(db, run_id)
    ended = await db.fetchval("SELECT ended_at FROM zeroth.run_attempts WHERE run_id = $1", run_id)
    times = (events[-1]["created_at"], row["finished_at"], ended)
    assert min(times) >= last_event, (last_event, times)


async def test_a_completion_whose_lease_ran_out_while_it_waited_for_a_lock_only_holder_is_refused(
        sessions: tuple[Session, Session, Any]) -> None:
    """The holder's append_run_event (another connection) holds the run's row — locked, not
    updated — when its completion comes with a live lease; the lease runs out before the append
    commits. The completion judges the lease by the time it got the row (sql/README.md, "The
    fence is in the predicate"): refused (false), the run left running for claim_orphaned —
    never completed on a lease that had expired by the time it could write."""
    a, b, db = sessions
    now = await db.fetchval("SELECT clock_timestamp()")
    run_id = (await make_run(db, "running", worker_id=HOLDER, now=now, lease_seconds=3)).run_id
    await a.begin()
    assert (await a.call(APPEND, run_id, "slow")).value == 1
    late = b.spawn(COMPLETE_RUN, run_id)
    await assert_waits_for(db, b, a, late)
    for _ in range(600):  # until the lease has run out (by the database's clock)
        if await db.fetchval("""SELECT lease_expires_at < clock_timestamp() FROM zeroth.runs
                                 WHERE run_id = $1""", run_id):
            break
        await db.execute("SELECT pg_sleep(0.05)")
    await a.commit()

    assert (await finished(late)).value is False
    row = await run_row(db, run_id)
    assert (row["status"], row["lease_worker_id"]) == ("running", HOLDER)
    assert await stream(db, run_id) == [(1, "event", "slow")]
