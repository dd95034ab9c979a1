"""Child runs on real worker processes (``python -m zeroth_pg.worker``), SIGKILLed.

A parent starts five children (served by another worker process, each gated on a release) and
its worker is SIGKILLed while they run. A second worker takes the parent over; its replay gets
the same five children back (none started twice), waits for them (status waiting, no lease), and
once they are released and complete it is woken, collects their outputs exactly once, and
completes. Handlers in step_apps.py.
"""

# The fixtures workers and events come from test_worker_processes (imported by name).
# ruff: noqa: F811

from __future__ import annotations

import signal
from typing import Any
from uuid import UUID

import asyncpg
from test_worker_processes import (  # noqa: F401  (fixtures)
    deployment_name,
    enqueue,
    event_data,
    events,
    output,
    release,
    takeover,
    wait_event,
    wait_status,
    workers,
)

N = 5


async def count_events(pool: asyncpg.Pool, run_id: UUID, kind: str) -> int:
    return int(await pool.fetchval(
        "SELECT count(*) FROM public.events e WHERE e.run_id = $1 AND e.kind = $2",
        run_id, kind))


async def test_sigkill_parent_while_children_run_recovers_and_collects_once(
        workers: Any, events: asyncpg.Pool):
    pool = events
    dep, kids = deployment_name("parent"), deployment_name("kids")
    run_id = await enqueue(pool, dep, {"n": N, "child": kids})
    a = await workers(dep, "step_apps:fan_out")
    child_worker = await workers(kids, "step_apps:gated_child")
    started = await wait_event(pool, run_id, "children_started", generation=1, worker=a)
    ids = [UUID(child) for child in event_data(started)["ids"]]
    for child in ids:  # every child is running when the parent's worker dies
        await wait_event(pool, child, "child_ran", worker=child_worker)
    b = await workers(dep, "step_apps:fan_out")
    await b.started()
    a.send(signal.SIGKILL)
    assert await a.wait_exit() == -signal.SIGKILL
    _, row = await takeover(pool, run_id, 1)
    generation = row["lease_generation"]
    assert row["lease_worker_id"] == b.worker_id
    again = await wait_event(pool, run_id, "children_started", generation=generation, worker=b)
    assert event_data(again)["ids"] == event_data(started)["ids"]  # the replay started none
    await release(pool, run_id)  # every later attempt of the parent passes its gate
    waiting = await wait_status(pool, run_id, "waiting")
    assert (waiting["wait_reason"], waiting["lease_worker_id"]) == ("children:#children", None)
    for child in ids:
        await release(pool, child)
    done = await wait_status(pool, run_id, "completed")
    assert output(done) == {"outputs": [i * 10 for i in range(N)]}
    assert await count_events(pool, run_id, "collected") == 1
    for child in ids:
        assert await count_events(pool, child, "child_ran") == 1
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.runs r WHERE r.parent_run_id = $1", run_id) == N
    assert await pool.fetchval(
        """SELECT count(*) FROM zeroth.run_steps s WHERE s.run_id = $1
              AND s.step_key = '#children'""", run_id) == 1
