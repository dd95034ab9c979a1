"""prune_runs against the sessions it can meet, on a committed database.

prune_runs locks the runs it deletes FOR UPDATE SKIP LOCKED: a claim, start or completion never
waits for an open prune (a prune only locks finished runs, which no worker touches), a prune skips
a run another session holds instead of waiting for it, and two prunes split the work. The one call
that does wait is an admin write on a run the open prune is deleting (redrive_run): once the
prune commits it finds no run (ZP001). Clocks are injected with now_override; prunes run "now" =
ten days after the factories' T0.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from helpers import DEPLOYMENT, T0, at, make_run, run_row
from interleave import assert_waits_for, finished, finishes_without_waiting

PRUNE = """SELECT zeroth_test.prune_runs(older_than => $1, batch_size => $2, now_override => $3)"""
CLAIM = """SELECT run_id, lease_generation FROM zeroth_test.claim_pending(deployment_ref => $1,
               worker_id => $2, now_override => $3) WHERE run_id IS NOT NULL"""
START = """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  now_override => $4)"""
REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"

DAY = timedelta(days=1)
NOW = at(10 * 86400)


def prune_args(older_than: timedelta = DAY, batch_size: int = 1000,
               now: Any = NOW) -> tuple[Any, ...]:
    return older_than, batch_size, now


async def finished_run(db: Any, status: str = "completed", finished_at: Any = T0) -> Any:
    return (await make_run(db, status, now=finished_at)).run_id


async def run_ids(db: Any) -> set[Any]:
    return {row["run_id"] for row in await db.fetch("SELECT r.run_id FROM zeroth.runs r")}


class TestPruneNeverBlocksWorkers:
    async def test_claims_starts_and_completions_never_wait_for_an_open_prune(self, sessions):
        pruner, worker, db = sessions
        old = [await finished_run(db) for _ in range(3)]
        pending = (await make_run(db, "pending")).run_id
        running = await make_run(db, "running", now=NOW)
        await pruner.begin()
        assert (await pruner.call(PRUNE, *prune_args())).value == 3

        claimed = await finishes_without_waiting(db, worker, worker.spawn(
            CLAIM, DEPLOYMENT, "worker-b", NOW, rows=True))
        assert [row["run_id"] for row in claimed.value] == [pending]
        started = await finishes_without_waiting(db, worker, worker.spawn(
            START, pending, "worker-b", claimed.value[0]["lease_generation"], NOW))
        completed = await finishes_without_waiting(db, worker, worker.spawn(
            COMPLETE, running.run_id, running.worker_id, running.generation, NOW))
        await pruner.commit()

        assert (started.value, completed.value) == (True, True)
        assert await run_ids(db) == {pending, running.run_id}
        assert not set(old) & await run_ids(db)

    async def test_a_completion_in_flight_is_skipped_then_pruned_once_committed(self, sessions):
        pruner, worker, db = sessions
        running = await make_run(db, "running", now=NOW)
        later = NOW + timedelta(seconds=1)
        await worker.begin()
        assert (await worker.call(
            COMPLETE, running.run_id, running.worker_id, running.generation, NOW)).value is True

        skipped = await finishes_without_waiting(db, pruner, pruner.spawn(
            PRUNE, *prune_args(timedelta(0), now=later)))
        await worker.commit()

        assert skipped.value == 0
        assert (await pruner.call(PRUNE, *prune_args(timedelta(0), now=later))).value == 1


class TestPruneAndOperators:
    async def test_prune_skips_a_finished_run_an_operator_holds_without_waiting(self, sessions):
        pruner, operator, db = sessions
        held = await finished_run(db, "failed")
        other = await finished_run(db, "completed")
        await operator.begin()
        assert (await operator.call(REDRIVE, held, at(5))).value is True

        pruned = await finishes_without_waiting(db, pruner, pruner.spawn(PRUNE, *prune_args()))
        await operator.commit()

        assert pruned.value == 1
        assert await run_ids(db) == {held}
        assert (await run_row(db, held))["status"] == "pending"
        assert other not in await run_ids(db)

    async def test_a_redrive_waits_for_an_open_prune_then_finds_no_run(self, sessions):
        pruner, operator, db = sessions
        doomed = await finished_run(db, "failed")
        await pruner.begin()
        assert (await pruner.call(PRUNE, *prune_args())).value == 1

        redrive = operator.spawn(REDRIVE, doomed, at(5))
        await assert_waits_for(db, operator, pruner, redrive)
        await pruner.commit()

        assert (await finished(redrive)).sqlstate == "ZP001"

    async def test_two_prunes_split_the_work_without_waiting(self, sessions):
        first, second, db = sessions
        for seconds in range(4):
            await finished_run(db, finished_at=at(seconds))
        await first.begin()
        assert (await first.call(PRUNE, *prune_args(batch_size=2))).value == 2

        other_half = await finishes_without_waiting(db, second, second.spawn(
            PRUNE, *prune_args(batch_size=10)))
        await first.commit()

        assert other_half.value == 2
        assert await run_ids(db) == set()


class TestThreadLockRows:
    ENQUEUE = "SELECT status::text FROM zeroth.enqueue_run(deployment_ref => $1, thread_id => $2)"

    async def test_an_admission_in_flight_keeps_its_lock_row_and_neither_waits(self, sessions):
        # The admission holds the thread's lock row (zeroth.thread_locks) while the thread's only
        # old run is pruned: prune skips the held row instead of waiting, and the admission's run
        # keeps the thread (and its row) alive.
        pruner, admission, db = sessions
        old = (await make_run(db, "completed", thread_id="t")).run_id
        await admission.begin()
        assert (await admission.call(self.ENQUEUE, DEPLOYMENT, "t")).value == "pending"

        pruned = await finishes_without_waiting(db, pruner, pruner.spawn(
            PRUNE, *prune_args()))
        await admission.commit()

        assert pruned.value == 1
        assert old not in await run_ids(db)
        assert await db.fetchval("SELECT count(*) FROM zeroth.thread_locks") == 1
        # and a later prune leaves it: the thread still has its new run
        assert (await pruner.call(PRUNE, *prune_args())).value == 0
        assert await db.fetchval("SELECT count(*) FROM zeroth.thread_locks") == 1


WAIT = """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
              generation => $3, step_key => 'k', name => $4, now_override => $5)"""
EMIT = "SELECT emitted FROM zeroth_test.emit_event(name => $1, payload => '{}', now_override => $2)"
CANCEL = "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)"
EVENT_NAMES = "SELECT array_agg(e.name ORDER BY e.name) FROM zeroth.events e"


async def old_channel(db: Any, name: str) -> None:
    """An event row nobody waits on any more, old enough to prune: a run waited on ``name`` at
    T0 and was cancelled then (its wait row goes when the prune deletes it)."""
    lease = await make_run(db, "running")
    assert await db.fetchval(WAIT, lease.run_id, lease.worker_id, lease.generation, name,
                             T0) == "waiting"
    assert await db.fetchval(CANCEL, lease.run_id, T0) == "cancelled"


class TestPruneMeetsEvents:
    """prune_runs deletes the event rows older than its cutoff that no run waits on, locking
    them FOR UPDATE SKIP LOCKED: a wait or an emit holding one keeps it,
    and a wait or an emit of a name the open prune is deleting waits for it, then writes the
    row afresh (a new channel, a new event)."""

    async def test_a_wait_on_an_event_being_pruned_waits_then_writes_its_channel_again(
            self, sessions):
        pruner, worker, db = sessions
        assert await db.fetchval(EMIT, "e", T0) is True  # old, and nobody waits on it
        running = await make_run(db, "running", now=NOW)
        await pruner.begin()
        assert (await pruner.call(PRUNE, *prune_args())).value == 1

        waiting = worker.spawn(WAIT, running.run_id, running.worker_id, running.generation, "e",
                               NOW)
        await assert_waits_for(db, worker, pruner, waiting)
        await pruner.commit()

        assert (await finished(waiting)).value == "waiting"  # the pruned emit is forgotten
        assert await db.fetchval(EVENT_NAMES) == ["e"]
        assert await db.fetchval(EMIT, "e", NOW) is True
        assert (await run_row(db, running.run_id))["status"] == "pending"

    async def test_an_emit_of_an_event_being_pruned_waits_then_is_a_new_event(self, sessions):
        pruner, emitter, db = sessions
        assert await db.fetchval(EMIT, "e", T0) is True
        await pruner.begin()
        assert (await pruner.call(PRUNE, *prune_args())).value == 1

        emitted = emitter.spawn(EMIT, "e", NOW)
        await assert_waits_for(db, emitter, pruner, emitted)
        await pruner.commit()

        assert (await finished(emitted)).value is True
        assert await db.fetchval(EVENT_NAMES) == ["e"]

    async def test_a_wait_in_flight_keeps_its_old_channel_and_the_prune_does_not_wait(
            self, sessions):
        pruner, worker, db = sessions
        await old_channel(db, "e")
        running = await make_run(db, "running", now=NOW)
        await worker.begin()
        assert (await worker.call(WAIT, running.run_id, running.worker_id, running.generation,
                                  "e", NOW)).value == "waiting"

        pruned = await finishes_without_waiting(db, pruner, pruner.spawn(PRUNE, *prune_args()))
        await worker.commit()

        assert pruned.value == 1  # the cancelled run; its channel is held, then awaited
        assert (await pruner.call(PRUNE, *prune_args())).value == 0
        assert await db.fetchval(EVENT_NAMES) == ["e"]
        assert await db.fetchval(EMIT, "e", NOW) is True
        assert (await run_row(db, running.run_id))["status"] == "pending"

    async def test_an_emit_in_flight_on_an_old_channel_keeps_it_and_the_prune_does_not_wait(
            self, sessions):
        pruner, emitter, db = sessions
        await old_channel(db, "e")
        await emitter.begin()
        assert (await emitter.call(EMIT, "e", NOW)).value is True

        pruned = await finishes_without_waiting(db, pruner, pruner.spawn(PRUNE, *prune_args()))
        await emitter.commit()

        assert pruned.value == 1  # the cancelled run only
        assert (await pruner.call(PRUNE, *prune_args())).value == 0  # emitted now: recent
        assert await db.fetchval(EVENT_NAMES) == ["e"]
