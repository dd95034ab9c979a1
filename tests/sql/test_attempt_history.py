"""The attempt history (zeroth.run_attempts, view zeroth.attempt_history).

One row per lease generation of a run, read through the view: the ended attempts, inserted by the
trigger runs_attempt_history on zeroth.runs when they end (sql/functions/internal/attempts.sql),
never by a caller, and the open attempt from the run's own row: every path of docs/state-machine.md
("Attempt history") produces the documented row, prune_runs deletes it with the run, a reader
sees its tenant's rows only, and a DBA's manual UPDATE is recorded instead of raising.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, Lease, at, claim, enqueue, make_run
from thread_calls import OWNER, own_running, take_over

OTHER = "worker-b"
CASTS = {"run_ids": "::uuid[]", "generations": "::bigint[]", "outputs": "::text[]::jsonb[]",
         "deployment_refs": "::text[]", "child_run_ids": "::uuid[]", "output": "::text::jsonb",
         "error": "::text::jsonb", "payload": "::text::jsonb", "checkpoint": "::text::jsonb"}
HISTORY = """SELECT a.attempt, a.lease_generation, a.worker_id, a.claimed_at, a.started_at,
                    a.ended_at, a.outcome, a.error::text AS error
               FROM zeroth.attempt_history a WHERE a.run_id = $1
              ORDER BY a.lease_generation, a.claimed_at NULLS FIRST, a.ended_at NULLS LAST"""


async def call(conn: asyncpg.Connection, function: str, now: Any, columns: str = "*",
               **values: Any) -> list[asyncpg.Record]:
    """``SELECT columns FROM zeroth_test.function(name => $i, …, now_override => now)``."""
    values["now_override"] = now
    params = [json.dumps(v) if name in CASTS and CASTS[name].endswith("jsonb") and v is not None
              else [json.dumps(x) for x in v] if name == "outputs" else v
              for name, v in values.items()]
    args = ", ".join(f"{name} => ${i + 1}{CASTS.get(name, '')}"
                     for i, name in enumerate(values))
    return await conn.fetch(f"SELECT {columns} FROM zeroth_test.{function}({args}) AS x",
                            *params)


async def fenced(conn, function, lease, now, **values):
    rows = await call(conn, function, now, run_id=lease.run_id, worker_id=lease.worker_id,
                      generation=lease.generation, **values)
    return rows[0][0]


async def history(conn: asyncpg.Connection, run_id: UUID) -> list[dict[str, Any]]:
    rows = [dict(row) for row in await conn.fetch(HISTORY, run_id)]
    for row in rows:
        row["error"] = None if row["error"] is None else json.loads(row["error"])
    return rows


def outcomes(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(attempt, generation, worker, outcome) of each row."""
    return [(r["attempt"], r["lease_generation"], r["worker_id"], r["outcome"]) for r in rows]


class TestClaimStartComplete:
    async def test_claim_start_complete_is_one_row(self, conn):
        run_id = await enqueue(conn)
        [claimed] = await claim(conn, now=at(1))
        lease = Lease(run_id, WORKER, claimed["lease_generation"])
        assert [r["outcome"] for r in await history(conn, run_id)] == [None]  # open
        assert await fenced(conn, "start_run", lease, at(2))
        assert await fenced(conn, "complete_run", lease, at(3), output={"ok": 1})

        [row] = await history(conn, run_id)
        assert row == {"attempt": 1, "lease_generation": 1, "worker_id": WORKER,
                       "claimed_at": at(1), "started_at": at(2), "ended_at": at(3),
                       "outcome": "completed", "error": None}

    async def test_only_the_end_of_an_attempt_writes_a_row(self, conn):
        # The open attempt is the runs row (the view shows it); the claim and the start write
        # nothing, the end one row (docs/state-machine.md, "Attempt history").
        stored = "SELECT count(*) FROM zeroth.run_attempts WHERE run_id = $1"
        run_id = await enqueue(conn)
        [claimed] = await claim(conn, now=at(1))
        lease = Lease(run_id, WORKER, claimed["lease_generation"])
        assert await fenced(conn, "start_run", lease, at(2))
        assert await conn.fetchval(stored, run_id) == 0
        assert outcomes(await history(conn, run_id)) == [(1, 1, WORKER, None)]
        assert await fenced(conn, "complete_run", lease, at(3), output={"ok": 1})
        assert await conn.fetchval(stored, run_id) == 1

    async def test_renewals_progress_and_checkpoints_write_no_history(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        before = await history(conn, lease.run_id)
        await fenced(conn, "renew_lease", lease, at(1))
        await fenced(conn, "save_checkpoint", lease, at(2), data=json.dumps({"k": 1}))
        await fenced(conn, "update_run_progress", lease, at(3),
                     progress=json.dumps({"p": 1}))
        assert await history(conn, lease.run_id) == before

    async def test_claim_and_start_opens_a_started_attempt(self, conn):
        run_id = await enqueue(conn)
        await call(conn, "claim_and_start", at(1), deployment_ref=DEPLOYMENT, worker_id=WORKER)
        [row] = await history(conn, run_id)
        assert (row["attempt"], row["claimed_at"], row["started_at"], row["outcome"]) == (
            1, at(1), at(1), None)

    async def test_fleet_claim_opens_a_started_attempt(self, conn):
        run_id = await enqueue(conn, tenant_id="acme")
        await call(conn, "claim_and_start_scopes", at(1), deployment_refs=[DEPLOYMENT],
                   worker_id=WORKER, tenant_ids=["acme"], workspace_ids=[None])
        [row] = await history(conn, run_id)
        assert (row["attempt"], row["lease_generation"], row["started_at"]) == (1, 1, at(1))

    async def test_complete_and_claim_ends_one_and_opens_the_next(self, conn):
        done = await make_run(conn, "running", now=at(0))
        following = await enqueue(conn, now=at(1))
        await call(conn, "complete_and_claim", at(5), deployment_ref=DEPLOYMENT,
                   worker_id=WORKER, run_ids=[done.run_id], generations=[done.generation],
                   outputs=[{"ok": 1}], batch_size=1)
        assert outcomes(await history(conn, done.run_id)) == [(1, 1, WORKER, "completed")]
        [row] = await history(conn, following)
        assert (row["outcome"], row["started_at"], row["attempt"]) == (None, at(5), 1)

    async def test_complete_runs_batch_ends_each(self, conn):
        first = await make_run(conn, "running", now=at(0))
        second = await make_run(conn, "running", now=at(0))
        await call(conn, "complete_runs", at(3), worker_id=WORKER,
                   run_ids=[first.run_id, second.run_id],
                   generations=[first.generation, second.generation])
        for lease in (first, second):
            [row] = await history(conn, lease.run_id)
            assert (row["outcome"], row["ended_at"]) == ("completed", at(3))

    async def test_admit_and_own_opens_an_attempt_at_insert(self, conn):
        run_id = await own_running(conn, worker_id=OWNER, now=at(0))
        [row] = await history(conn, run_id)
        assert (row["worker_id"], row["lease_generation"], row["started_at"], row["outcome"]) == (
            OWNER, 1, at(0), None)


class TestFailures:
    async def test_fail_retry_then_dead_letter(self, conn):
        run_id = await enqueue(conn, max_attempts=2)
        for n in (1, 2):
            [row] = await call(conn, "claim_and_start", at(100 * n), deployment_ref=DEPLOYMENT,
                               worker_id=WORKER)
            lease = Lease(run_id, WORKER, row["lease_generation"])
            await fenced(conn, "fail_run", lease, at(100 * n + 1), error={"n": n},
                         retry_base_seconds=0, retry_max_seconds=0)
        rows = await history(conn, run_id)
        assert outcomes(rows) == [(1, 1, WORKER, "failed"), (2, 2, WORKER, "dead_lettered")]
        assert [r["error"] for r in rows] == [{"n": 1}, {"n": 2}]

    async def test_fail_not_retryable(self, conn):
        lease = await make_run(conn, "failed", now=at(0))
        [row] = await history(conn, lease.run_id)
        assert (row["outcome"], row["error"]) == ("failed", {"reason": "boom"})

    async def test_lease_expired_then_orphan_recovery(self, conn):
        lease = await make_run(conn, "running", now=at(0), lease_seconds=30)
        await call(conn, "claim_orphaned", at(100), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        rows = await history(conn, lease.run_id)
        assert outcomes(rows) == [(1, 1, WORKER, "recovered"), (2, 2, OTHER, None)]
        assert rows[0]["ended_at"] == at(100)
        assert (rows[1]["claimed_at"], rows[1]["started_at"]) == (at(100), at(100))

    async def test_orphan_out_of_attempts_is_dead_lettered(self, conn):
        lease = await make_run(conn, "running", now=at(0), lease_seconds=30, max_attempts=1)
        await call(conn, "claim_orphaned", at(100), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        [row] = await history(conn, lease.run_id)
        assert row["outcome"] == "dead_lettered"
        assert row["error"]["stop_reason"] == "attempts_exhausted"

    async def test_expire_recovery_lease_then_reclaim(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        assert await fenced(conn, "expire_recovery_lease", lease, at(1))
        await call(conn, "claim_orphaned", at(2), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "recovered"), (2, 2, OTHER, None)]

    async def test_takeover_of_a_non_resumable_run(self, conn):
        run_id = await own_running(conn, worker_id=OTHER, lease_seconds=30)
        await take_over(conn, run_id, now=at(41), grace=10)
        [row] = await history(conn, run_id)
        assert (row["outcome"], row["ended_at"]) == ("recovered", at(41))
        assert row["error"]["stop_reason"] == "orphan_recovered"

    async def test_takeover_requeue_of_a_resumable_run(self, conn):
        lease = await make_run(conn, "running", now=at(0), lease_seconds=30)
        rows = await call(conn, "claim_for_takeover", at(100), run_id=lease.run_id)
        assert rows[0]["outcome"] == "requeued"
        [row] = await history(conn, lease.run_id)
        assert (row["outcome"], row["error"]) == ("recovered", None)

    async def test_unstarted_claim_that_lapsed_is_expired(self, conn):
        lease = await make_run(conn, "claimed", now=at(0), lease_seconds=30)
        await claim(conn, worker_id=OTHER, now=at(100))
        rows = await history(conn, lease.run_id)
        # The lapsed claim spent attempt 1 (it counts: a worker that dies before start_run
        # must not loop for ever), so the new claim's open attempt is number 2.
        assert outcomes(rows) == [(1, 1, WORKER, "expired"), (2, 2, OTHER, None)]
        assert rows[0]["started_at"] is None


class TestGracefulEnds:
    async def test_hand_back(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        assert await fenced(conn, "hand_back_to_pending", lease, at(1))
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "handed_back")]

    async def test_release_of_a_claim(self, conn):
        lease = await make_run(conn, "claimed", now=at(0))
        assert await fenced(conn, "release_lease", lease, at(1))
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "released")]

    async def test_sleep_then_resume_is_two_attempts(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        await call(conn, "sleep_run", at(1), "outcome", run_id=lease.run_id, worker_id=WORKER,
                   generation=1, delay_seconds=10)
        await call(conn, "claim_and_start", at(20), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        # The sleep gave its attempt back: the resumed attempt is number 1 again.
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "slept"), (1, 2, OTHER, None)]

    async def test_pause_then_resume(self, conn):
        lease = await make_run(conn, "waiting", now=at(0))
        await call(conn, "resume_run", at(1), run_id=lease.run_id)
        await call(conn, "claim_and_start", at(2), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "paused"), (1, 2, OTHER, None)]

    async def test_wait_for_event_then_emit(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        [row] = await call(conn, "wait_for_event", at(1), "outcome", run_id=lease.run_id,
                           worker_id=WORKER, generation=1, step_key="#event:go#1", name="go")
        assert row["outcome"] == "waiting"
        await call(conn, "emit_event", at(2), name="go", payload={"ok": True})
        await call(conn, "claim_and_start", at(3), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "waited"), (1, 2, OTHER, None)]

    async def test_wait_for_children_then_their_end(self, conn):
        parent = await make_run(conn, "running", now=at(0))
        [child] = await call(conn, "start_child_run", at(1), "child_run_id", run_id=parent.run_id,
                             worker_id=WORKER, generation=1, step_key="kid#1",
                             deployment_ref="kids")
        [row] = await call(conn, "wait_for_children", at(2), "outcome", run_id=parent.run_id,
                           worker_id=WORKER, generation=1, step_key="kids#1",
                           child_run_ids=[child["child_run_id"]])
        assert row["outcome"] == "waiting"
        [kid] = await call(conn, "claim_and_start", at(3), "run_id, lease_generation",
                           deployment_ref="kids", worker_id=OTHER)
        assert await fenced(conn, "complete_run", Lease(kid["run_id"], OTHER, 1), at(4))
        assert outcomes(await history(conn, parent.run_id)) == [(1, 1, WORKER, "waited")]
        assert outcomes(await history(conn, child["child_run_id"])) == [(1, 1, OTHER, "completed")]

    async def test_cancel_by_the_holder(self, conn):
        lease = await make_run(conn, "cancelled", now=at(0))
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "cancelled")]

    async def test_cancel_of_a_claimed_run(self, conn):
        lease = await make_run(conn, "claimed", now=at(0))
        await call(conn, "request_cancel", at(1), run_id=lease.run_id)
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "cancelled")]

    async def test_cancel_of_a_never_claimed_run_has_no_attempt(self, conn):
        run_id = await enqueue(conn)
        await call(conn, "request_cancel", at(1), run_id=run_id)
        assert await history(conn, run_id) == []

    async def test_redrive_then_a_new_attempt(self, conn):
        lease = await make_run(conn, "failed", now=at(0))
        await call(conn, "redrive_run", at(1), run_id=lease.run_id)
        await call(conn, "claim_and_start", at(2), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "failed"), (1, 2, OTHER, None)]


class TestClearLease:
    async def test_clear_lease_of_a_running_run_then_recovery(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        await call(conn, "clear_lease", at(1), run_id=lease.run_id)
        await call(conn, "claim_orphaned", at(2), deployment_ref=DEPLOYMENT, worker_id=OTHER)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "recovered"), (2, 2, OTHER, None)]


class TestPrune:
    async def test_prune_removes_the_history_with_the_run(self, conn):
        gone = await make_run(conn, "completed", now=at(0))
        kept = await make_run(conn, "running", now=at(0))
        deleted = await call(conn, "prune_runs", at(100), older_than=timedelta(seconds=1))
        assert deleted[0][0] == 1
        assert await history(conn, gone.run_id) == []
        assert len(await history(conn, kept.run_id)) == 1


class TestManualUpdates:
    async def test_dba_update_of_status_is_recorded(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        await conn.execute(
            """UPDATE zeroth.runs SET status = 'failed', finished_at = now(),
                   lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                   error = '{"by": "dba"}'
                WHERE run_id = $1""", lease.run_id)
        [row] = await history(conn, lease.run_id)
        assert (row["outcome"], row["error"]) == ("failed", {"by": "dba"})
        assert row["ended_at"] is not None

    async def test_dba_completion_is_recorded_by_the_trigger(self, conn):
        # The functions' completions write their own rows; a DBA's (any role but zeroth_owner)
        # goes through the trigger, once.
        lease = await make_run(conn, "running", now=at(0))
        await conn.execute(
            """UPDATE zeroth.runs SET status = 'completed', finished_at = now(),
                   lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL
                WHERE run_id = $1""", lease.run_id)
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "completed")]

    async def test_dba_reopening_a_first_claim_completion_keeps_its_attempt(self, conn):
        # A completion at the first claim keeps its attempt in the runs row (migration 0022),
        # which the view derives from the row: a DBA reopening the run by hand must not rewrite
        # that attempt. It moves to the log first (trigger runs_kept_attempt_to_log), unchanged,
        # and a later attempt is recorded after it.
        lease = await make_run(conn, "completed", now=at(0))
        before = await history(conn, lease.run_id)
        assert outcomes(before) == [(1, 1, WORKER, "completed")]
        log = "SELECT count(*) FROM zeroth.run_attempt_log WHERE run_id = $1"
        assert await conn.fetchval(log, lease.run_id) == 0
        await conn.execute(
            """UPDATE zeroth.runs SET status = 'pending', finished_at = NULL, started_at = NULL,
                   attempts = 0, output = NULL WHERE run_id = $1""", lease.run_id)
        assert await history(conn, lease.run_id) == before
        assert await conn.fetchval(log, lease.run_id) == 1
        assert await conn.fetchval(
            """SELECT completed_worker_id IS NULL AND completed_claimed_at IS NULL
                 FROM zeroth.runs WHERE run_id = $1""", lease.run_id)
        [claimed] = await claim(conn, now=at(10), worker_id="w2")
        second = Lease(lease.run_id, "w2", claimed["lease_generation"])
        assert second.generation == 2
        assert await fenced(conn, "start_run", second, at(11))
        assert await fenced(conn, "complete_run", second, at(12), output={"ok": 2})
        after = await history(conn, lease.run_id)
        assert after[0] == before[0]
        assert outcomes(after) == [(1, 1, WORKER, "completed"), (1, 2, "w2", "completed")]

    async def test_dba_update_after_the_history_was_deleted_records_the_end(self, conn):
        # The ended row comes from the runs row alone: nothing in zeroth.run_attempt_log is needed.
        lease = await make_run(conn, "running", now=at(0))
        await conn.execute("DELETE FROM zeroth.run_attempt_log WHERE run_id = $1", lease.run_id)
        await conn.execute(
            """UPDATE zeroth.runs SET status = 'cancelled', finished_at = now(),
                   lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL
                WHERE run_id = $1""", lease.run_id)
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "cancelled")]

    async def test_dba_moving_the_lease_to_another_worker_is_lease_lost(self, conn):
        lease = await make_run(conn, "running", now=at(0))
        await conn.execute(
            "UPDATE zeroth.runs SET lease_worker_id = 'someone' WHERE run_id = $1", lease.run_id)
        assert outcomes(await history(conn, lease.run_id)) == [
            (1, 1, WORKER, "lease_lost"), (1, 1, "someone", None)]


class TestView:
    async def test_view_names_the_workspace(self, conn):
        lease = await make_run(conn, "completed", tenant_id="acme", workspace_id="ws",
                               now=at(0))
        row = await conn.fetchrow(
            """SELECT tenant_id, workspace_id, attempt, outcome FROM zeroth.attempt_history
                WHERE run_id = $1""", lease.run_id)
        assert dict(row) == {"tenant_id": "acme", "workspace_id": "ws", "attempt": 1,
                             "outcome": "completed"}

    @pytest.mark.parametrize("outcome", ["bogus", ""])
    async def test_outcome_is_checked(self, conn, outcome):
        # (a failure: a completion at the first claim is kept in the runs row, not in the log)
        lease = await make_run(conn, "failed", now=at(0))
        with pytest.raises(asyncpg.CheckViolationError):
            async with conn.transaction():
                await conn.execute(
                    """UPDATE zeroth.run_attempt_log SET outcome = $2, ended_at = now()
                        WHERE run_id = $1""", lease.run_id, outcome)
        assert outcomes(await history(conn, lease.run_id)) == [(1, 1, WORKER, "failed")]
