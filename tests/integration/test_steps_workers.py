"""Steps and events on real worker processes (``python -m zeroth_pg.worker``), SIGKILLed.

A handler with five steps dies (SIGKILL) after step 3; the run is recovered by a second worker,
which re-runs none of steps 1-3 (each step's side effects are counted in public.events) and
completes. A handler that waits for an event leaves its worker (status waiting, no lease) and
completes with the payload once ``emit_event`` is called; with a timeout, the worker's orphan
sweep (``wake_due_waits``) brings it back and it completes with the timeout outcome.
"""

# The fixtures workers and events come from test_worker_processes (imported by name).
# ruff: noqa: F811

from __future__ import annotations

import json
import signal
from typing import Any
from uuid import UUID

import asyncpg
from test_worker_processes import (  # noqa: F401  (fixtures)
    deployment_name,
    enqueue,
    events,
    release,
    run_row,
    takeover,
    wait_event,
    wait_status,
    workers,
)

from zeroth_pg.client import LeaseManager


async def side_effects(pool: asyncpg.Pool, run_id: UUID) -> list[tuple[int, int]]:
    rows = await pool.fetch(
        """SELECT (e.data->>'step')::int AS step, e.generation FROM public.events e
            WHERE e.run_id = $1 AND e.kind = 'side_effect' ORDER BY e.id""", run_id)
    return [(r["step"], r["generation"]) for r in rows]


async def test_sigkill_after_step_3_recovers_without_rerunning_steps(workers: Any,
                                                                     events: asyncpg.Pool):
    pool = events
    dep = deployment_name("steps")
    run_id = await enqueue(pool, dep, {})
    a = await workers(dep, "step_apps:five_steps")
    await wait_event(pool, run_id, "after_step_3", generation=1, worker=a)
    b = await workers(dep, "step_apps:five_steps")
    await b.started()
    a.send(signal.SIGKILL)
    assert await a.wait_exit() == -signal.SIGKILL
    _, row = await takeover(pool, run_id, 1)
    generation = row["lease_generation"]
    assert row["lease_worker_id"] == b.worker_id
    await wait_event(pool, run_id, "after_step_3", generation=generation, worker=b)
    await release(pool, run_id, generation)
    done = await wait_status(pool, run_id, "completed")
    assert json.loads(done["output_text"])["results"] == [10, 20, 30, 40, 50]
    # Steps 1-3 ran once, in the killed attempt; 4 and 5 once, in the recovered one.
    assert await side_effects(pool, run_id) == [(1, 1), (2, 1), (3, 1),
                                                (4, generation), (5, generation)]
    steps = await pool.fetch(
        """SELECT s.step_key, s.lease_generation FROM zeroth.run_steps s WHERE s.run_id = $1
            ORDER BY s.step_key""", run_id)
    assert [(s["step_key"], s["lease_generation"]) for s in steps] == [
        ("step-1", 1), ("step-2", 1), ("step-3", 1), ("step-4", generation),
        ("step-5", generation)]
    keys = await pool.fetch(
        """SELECT e.data->>'key' AS key FROM public.events e
            WHERE e.run_id = $1 AND e.kind = 'side_effect' ORDER BY e.id""", run_id)
    assert [k["key"] for k in keys] == [f"{run_id}:step-{n}" for n in range(1, 6)]


async def test_wait_for_event_leaves_the_worker_and_resumes_on_emit(workers: Any,
                                                                    events: asyncpg.Pool):
    pool = events
    dep = deployment_name("event")
    run_id = await enqueue(pool, dep, {})
    worker = await workers(dep, "step_apps:approval")
    row = await wait_status(pool, run_id, "waiting")
    assert (row["wait_reason"], row["lease_worker_id"]) == (f"event:approval:{run_id}", None)
    emitted = await LeaseManager(pool).emit_event(f"approval:{run_id}", {"approved_by": "ann"})
    assert (emitted.emitted, emitted.woken) == (True, 1)
    done = await wait_status(pool, run_id, "completed")
    assert json.loads(done["output_text"]) == {"prepared": 10, "payload": {"approved_by": "ann"}}
    assert await side_effects(pool, run_id) == [(1, 1)]  # the step did not run again
    assert worker.proc.returncode is None


async def test_wait_for_event_times_out_through_the_workers_sweep(workers: Any,
                                                                  events: asyncpg.Pool):
    pool = events
    dep = deployment_name("timeout")
    run_id = await enqueue(pool, dep, {"timeout": 1})
    await workers(dep, "step_apps:approval")
    await wait_status(pool, run_id, "waiting")
    done = await wait_status(pool, run_id, "completed")
    assert json.loads(done["output_text"]) == {"prepared": 10, "timed_out": True}
    assert (await LeaseManager(pool).emit_event(f"approval:{run_id}", 1)).woken == 0
    assert (await run_row(pool, run_id))["status"] == "completed"
