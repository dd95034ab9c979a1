"""A handler that runs past its attempt's deadline is stopped by the worker (its task cancelled)
and the attempt settled as a timeout, not a crash (issue 34, item 2): RunWorker in the test's
event loop against a real database, the deadline fixed by the claim on the database clock from
the run's own attempt_timeout_seconds. Nothing here measures elapsed time: the test waits (with
a generous bound) for the states the database records.
"""

from __future__ import annotations

import asyncio
from typing import Any

import worker_probes
from helpers import unique_deployment, wait_until
from worker_probes import FOREVER, stored_run

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_a_handler_stuck_past_its_deadline_is_stopped_and_its_attempt_retried(
        pool, spawn_worker):
    dep = unique_deployment("timeout")
    cancelled: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(FOREVER)  # an LLM loop that never ends
            except asyncio.CancelledError:
                cancelled.append(ctx.attempt)
                raise
        return {"attempt": ctx.attempt}

    # Renewals every 10 s: the 60 s lease would keep the run alive; the deadline must not.
    await spawn_worker(dep, handler, lease_duration=60.0, poll_interval=0.05,
                       orphan_sweep_interval=0.2)
    lm = LeaseManager(pool)
    run = (await lm.enqueue_run(dep, max_attempts=3, attempt_timeout_seconds=1)).run_id

    async def done() -> dict[str, Any] | None:
        row = await stored_run(pool, run)
        return row if row["status"] == "completed" else None

    row = await wait_until(done, "the run to complete on its second attempt", within=60)
    assert cancelled == [1]
    assert (row["attempts"], row["output"]) == (2, {"attempt": 2})
    attempts = await pool.fetch(
        """SELECT attempt, outcome, error::text AS error FROM zeroth.run_attempts
            WHERE run_id = $1 ORDER BY lease_generation""", run)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "timed_out"),
                                                                (2, "completed")]
    assert '"stop_reason": "attempt_timeout"' in attempts[0]["error"]


async def test_a_run_past_its_run_deadline_is_failed_for_good(pool, spawn_worker):
    dep = unique_deployment("runtimeout")

    async def handler(ctx: RunContext) -> Any:
        await asyncio.sleep(FOREVER)

    await spawn_worker(dep, handler, lease_duration=60.0, poll_interval=0.05,
                       orphan_sweep_interval=0.2)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=5,
                                                run_timeout_seconds=1)).run_id

    async def ended() -> dict[str, Any] | None:
        row = await stored_run(pool, run)
        return row if row["status"] == "failed" else None

    row = await wait_until(ended, "the run to fail at its run deadline", within=60)
    assert (row["attempts"], row["error"]["stop_reason"]) == (1, "run_timeout")
    assert row["dead_lettered_at"] is None
    # The worker stopped it at its run deadline and settled that: one attempt, ended for good.
    outcomes = await pool.fetch("SELECT outcome FROM zeroth.run_attempts WHERE run_id = $1", run)
    assert [o["outcome"] for o in outcomes] == ["timed_out"]


async def test_a_run_waiting_for_an_event_past_its_run_deadline_is_failed_by_the_sweep(
        pool, spawn_worker):
    # The run leaves its worker (waiting for an event that never comes, no wait deadline): only
    # the worker's sweep (wake_due_waits, before each orphan sweep) can end it at its run
    # deadline; before, it stayed waiting for ever.
    dep = unique_deployment("waitdeadline")

    async def handler(ctx: RunContext) -> Any:
        return await ctx.wait_for_event("never-emitted")

    await spawn_worker(dep, handler, lease_duration=60.0, poll_interval=0.05,
                       orphan_sweep_interval=0.2)
    run = (await LeaseManager(pool).enqueue_run(dep, run_timeout_seconds=3600)).run_id

    async def waiting() -> dict[str, Any] | None:
        row = await stored_run(pool, run)
        return row if row["status"] == "waiting" else None

    await wait_until(waiting, "the run to wait for its event", within=60)
    # Its run deadline passes while it waits (a DBA's UPDATE: no wall-clock wait in the test).
    await pool.execute("UPDATE zeroth.runs SET run_deadline_at = clock_timestamp() "
                       "WHERE run_id = $1", run)

    async def ended() -> dict[str, Any] | None:
        row = await stored_run(pool, run)
        return row if row["status"] == "failed" else None

    row = await wait_until(ended, "the sweep to fail the waiting run at its run deadline",
                           within=60)
    assert (row["error"]["stop_reason"], row["wait_reason"]) == ("run_timeout", None)
    outcomes = await pool.fetch("SELECT outcome FROM zeroth.run_attempts WHERE run_id = $1", run)
    assert [o["outcome"] for o in outcomes] == ["waited"]  # no attempt ended at the deadline
