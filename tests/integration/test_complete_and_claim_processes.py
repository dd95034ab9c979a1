"""complete_and_claim with real worker processes (``python -m zeroth_pg.worker``) under
continuous load loses nothing and leaves nothing leased.

A worker whose completions carry the claims of the next runs is stopped with SIGTERM, or killed
with SIGKILL, while runs flow: after a SIGTERM no run holds a live lease of the stopped worker
(each claimed run was completed or handed back, also those a completion claimed while the drain
began), after a SIGKILL a second worker recovers every run once the dead leases lapse, and every
run ends completed exactly once. A second process with the same worker id takes over a frozen
process's run of steps; the frozen one, continued, reads and records no step and writes nothing.
"""

# The fixtures workers and events come from test_worker_processes (imported by name).
# ruff: noqa: F811

from __future__ import annotations

import json
import signal
from typing import Any

import asyncpg
import pytest
from test_steps_workers import side_effects
from test_worker_processes import (  # noqa: F401  (fixtures)
    deployment_name,
    enqueue,
    events,
    eventually,
    release,
    takeover,
    wait_event,
    wait_status,
    workers,
)

from zeroth_pg.client import LeaseManager

RUNS = 60
#: Enough runs of 20 ms at 3 slots that the SIGTERM comes while runs wait for a handler slot.
AHEAD_RUNS = 240


async def produce(pool: asyncpg.Pool, deployment: str, count: int) -> None:
    await LeaseManager(pool).enqueue_runs(
        deployment, [{"payload": {"seconds": 0.02}} for _ in range(count)])


async def completed(pool: asyncpg.Pool, deployment: str) -> int:
    return await pool.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'completed'",
        deployment)


async def most_at_once(pool: asyncpg.Pool, deployment: str) -> int:
    """The most handlers that ran at once, from their started/finished events."""
    return await pool.fetchval(  # type: ignore[no-any-return]
        """WITH spans AS (
               SELECT s.run_id, s.generation, s.at AS started, f.at AS finished
                 FROM public.events s
                 JOIN public.events f ON f.run_id = s.run_id AND f.generation = s.generation
                                     AND f.kind = 'finished'
                 JOIN zeroth.runs r ON r.run_id = s.run_id AND r.deployment_ref = $1
                WHERE s.kind = 'started')
           SELECT coalesce(max((SELECT count(*) FROM spans o
                                 WHERE o.started <= x.started AND o.finished > x.started)), 0)
             FROM spans x""", deployment)


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
async def test_a_stopped_worker_under_load_leaves_nothing_leased_and_loses_nothing(
        workers: Any, events: asyncpg.Pool, how: signal.Signals) -> None:
    pool = events
    dep = deployment_name("cac")
    options = ("--concurrency", "3", "--fleet-concurrency", "2", "--shutdown-timeout", "5",
               "--orphan-sweep-interval", "30")
    a = await workers(dep, "worker_apps:sleeper", *options)
    await a.started()
    await produce(pool, dep, RUNS // 2)
    await eventually(lambda: completed_at_least(pool, dep, 5), "a few runs completed")
    await produce(pool, dep, RUNS // 2)  # more arrive while it works
    a.send(how)
    assert await a.wait_exit() == (0 if how is signal.SIGTERM else -signal.SIGKILL)
    if how is signal.SIGTERM:
        # Drained: every run it held was completed or handed back, none is left to lapse.
        assert await pool.fetchval(
            """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1
                  AND lease_worker_id = $2""", dep, a.worker_id) == 0
        assert await pool.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'running'",
            dep) == 0
    b = await workers(dep, "worker_apps:sleeper", "--concurrency", "3", "--fleet-concurrency",
                      "2", "--orphan-sweep-interval", "0.5")
    await b.started()
    await eventually(lambda: completed_at_least(pool, dep, RUNS), "every run completed",
                     within=60)
    rows = await pool.fetch(
        """SELECT status::text, count(*) FROM zeroth.runs WHERE deployment_ref = $1
            GROUP BY status""", dep)
    assert [tuple(r) for r in rows] == [("completed", RUNS)]
    # The fleet limit held across the stop and the takeover (recovered runs included).
    assert await most_at_once(pool, dep) <= 2


async def completed_at_least(pool: asyncpg.Pool, deployment: str, count: int) -> bool:
    return await completed(pool, deployment) >= count


async def test_the_same_worker_id_in_a_second_process_fences_the_first_one_s_steps(
        workers: Any, events: asyncpg.Pool) -> None:
    """Promise 1 with one worker id in two processes: A (id "twin") ran steps 1-3 and is frozen
    (SIGSTOP); B (also "twin") takes the run over once A's lease lapsed, replays steps 1-3
    without running them and completes. A, continued and released, runs no step function,
    records nothing and writes no outcome: the generation, not the worker id, is the fence."""
    pool = events
    dep = deployment_name("twin")
    run_id = await enqueue(pool, dep, {})
    a = await workers(dep, "step_apps:five_steps", worker_id="twin")
    await wait_event(pool, run_id, "after_step_3", generation=1, worker=a)
    b = await workers(dep, "step_apps:five_steps", worker_id="twin")
    await b.started()
    a.send(signal.SIGSTOP)
    _, row = await takeover(pool, run_id, 1)
    generation = row["lease_generation"]
    await wait_event(pool, run_id, "after_step_3", generation=generation, worker=b)
    await release(pool, run_id, generation)
    done = await wait_status(pool, run_id, "completed")
    assert json.loads(done["output_text"]) == {"results": [10, 20, 30, 40, 50],
                                               "generation": generation}
    a.send(signal.SIGCONT)
    await release(pool, run_id, 1)  # A's handler goes on to step 4, or was stopped already
    await a.wait_for_line("lease generation 1 lost")
    assert await side_effects(pool, run_id) == [(1, 1), (2, 1), (3, 1),
                                                (4, generation), (5, generation)]
    steps = await pool.fetch(
        "SELECT step_key, lease_generation FROM zeroth.run_steps WHERE run_id = $1 "
        "ORDER BY step_key", run_id)
    assert [tuple(s) for s in steps] == [("step-1", 1), ("step-2", 1), ("step-3", 1),
                                         ("step-4", generation), ("step-5", generation)]
    after = await pool.fetchrow("SELECT status::text, output::text FROM zeroth.runs "
                                "WHERE run_id = $1", run_id)
    assert tuple(after) == ("completed", done["output_text"])


async def test_a_worker_process_that_claims_ahead_drains_under_load_and_stops_clean(
        workers: Any, events: asyncpg.Pool) -> None:
    """``zeroth-pg worker --claim-ahead`` as a user starts it: short handlers under a backlog,
    SIGTERM half-way. It never runs more handlers than --concurrency, leaves nothing leased
    after the drain (the runs waiting for a slot ran in it) and completes every run once, one
    attempt each. The only runs it hands back are the ones a completion's claim brought back
    after the drain began (never started; their attempt given back): at most one call's worth,
    max_concurrency + claim_ahead. Most runs of this test miss that race, not all (it failed
    one run in eight on 030a973, where the test asserted no hand-back at all)."""
    pool = events
    dep = deployment_name("ahead")
    a = await workers(dep, "worker_apps:sleeper", "--concurrency", "3", "--claim-ahead", "3",
                      "--shutdown-timeout", "10", "--orphan-sweep-interval", "30")
    await a.started()
    await produce(pool, dep, AHEAD_RUNS)
    await eventually(lambda: completed_at_least(pool, dep, AHEAD_RUNS // 2),
                     "half the runs completed")
    a.send(signal.SIGTERM)
    assert await a.wait_exit() == 0
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND lease_worker_id = $2",
        dep, a.worker_id) == 0
    b = await workers(dep, "worker_apps:sleeper", "--concurrency", "3", "--claim-ahead", "3")
    await b.started()
    await eventually(lambda: completed_at_least(pool, dep, AHEAD_RUNS), "every run completed",
                     within=60)
    rows = await pool.fetch(
        """SELECT status::text, attempts, hand_backs, count(*) FROM zeroth.runs
            WHERE deployment_ref = $1 GROUP BY 1, 2, 3""", dep)
    assert {(r["status"], r["attempts"]) for r in rows} == {("completed", 1)}
    handed_back = {r["hand_backs"]: r["count"] for r in rows}
    assert set(handed_back) <= {0, 1}
    assert handed_back.get(1, 0) <= 3 + 3
    assert sum(handed_back.values()) == AHEAD_RUNS
    assert await most_at_once(pool, dep) <= 3
