"""The worker's completions carry the next claim (zeroth.complete_and_claim): a worker with a
backlog pays one call and one commit per run instead of a completion and a claim. What must not
change with it: every run completes exactly once, the local and fleet limits hold, a failed call
loses nothing (the batch is completed the plain way and the claim loop takes over), and a
shutdown hands back what it claimed."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import test_worker_lifecycle
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import ConnectionLostError
from zeroth_pg.worker import RunContext, RunWorker

spawn_worker = test_worker_lifecycle.spawn_worker  # the fixture: workers drained at teardown


class CallCounter:
    """Counts the worker's claim_and_start and complete_and_claim calls; complete_and_claim can
    be made to fail before it reaches the database."""

    def __init__(self, worker: RunWorker, *, fail_along: bool = False) -> None:
        self.claims = self.along = self.along_runs = 0
        lm = worker.lease_manager
        self.real_claim, self.real_along = lm.claim_and_start, lm.complete_and_claim
        self.fail_along = fail_along
        lm.claim_and_start = self._claim  # type: ignore[method-assign]
        lm.complete_and_claim = self._along  # type: ignore[method-assign]

    async def _claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await self.real_claim(*args, **kwargs)

    async def _along(self, deployment_ref: str, worker_id: str, completions: Any,
                     **kwargs: Any) -> Any:
        self.along += 1
        if self.fail_along:
            raise ConnectionLostError("injected: connection lost before the call was sent")
        result = await self.real_along(deployment_ref, worker_id, completions, **kwargs)
        self.along_runs += len(result.claim.runs)
        return result


async def _statuses(pool: asyncpg.Pool, dep: str) -> dict[str, int]:
    rows = await pool.fetch(
        """SELECT status::text AS status, count(*) AS n FROM zeroth.runs
            WHERE deployment_ref = $1 GROUP BY status""", dep)
    return {row["status"]: row["n"] for row in rows}


async def _drained(pool: asyncpg.Pool, dep: str, total: int) -> bool:
    return await _statuses(pool, dep) == {"completed": total}


async def _attempts(pool: asyncpg.Pool, dep: str) -> set[int]:
    return {row["attempts"] for row in await pool.fetch(
        "SELECT attempts FROM zeroth.runs WHERE deployment_ref = $1", dep)}


def _concurrency_probe() -> tuple[Any, dict[str, int]]:
    seen = {"now": 0, "max": 0, "runs": 0}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen["now"] += 1
        seen["runs"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        try:
            await asyncio.sleep(0.002)
            return {"n": ctx.payload["n"]}
        finally:
            seen["now"] -= 1

    return handler, seen


async def test_a_backlog_at_concurrency_one_takes_one_call_per_run(pool, spawn_worker):
    dep = unique_deployment("along")
    handler, seen = _concurrency_probe()
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(40)])
    worker = await spawn_worker(dep, handler, max_concurrency=1, start=False)
    calls = CallCounter(worker)
    await worker.start()

    await wait_until(lambda: _drained(pool, dep, 40), "the backlog to drain", within=30)

    assert seen == {"now": 0, "max": 1, "runs": 40}
    assert await _attempts(pool, dep) == {1}
    # The first run comes from a claim pass, the other 39 with the completion before them;
    # the last completion's claim comes back empty and the claim loop looks once more.
    assert calls.along_runs == 39
    assert calls.claims <= 3


async def test_the_local_limit_holds_with_claims_along(pool, spawn_worker):
    dep = unique_deployment("along")
    handler, seen = _concurrency_probe()
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(120)])
    worker = await spawn_worker(dep, handler, max_concurrency=3, start=False)
    calls = CallCounter(worker)
    await worker.start()

    await wait_until(lambda: _drained(pool, dep, 120), "the backlog to drain", within=30)

    assert seen["max"] <= 3
    assert seen["runs"] == 120
    assert await _attempts(pool, dep) == {1}
    assert calls.along_runs > 0


async def test_the_fleet_limit_holds_across_workers_with_claims_along(pool, spawn_worker):
    dep = unique_deployment("along")
    handler, seen = _concurrency_probe()  # both workers run in this loop: one counter
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(60)])
    workers = [await spawn_worker(dep, handler, max_concurrency=2, fleet_max_concurrency=2,
                                  start=False) for _ in range(2)]
    counters = [CallCounter(w) for w in workers]
    for worker in workers:
        await worker.start()

    await wait_until(lambda: _drained(pool, dep, 60), "the backlog to drain", within=30)

    assert seen["max"] <= 2
    assert seen["runs"] == 60
    assert await _attempts(pool, dep) == {1}
    assert sum(c.along_runs for c in counters) > 0


async def test_a_failing_call_loses_nothing_and_the_claim_loop_takes_over(pool, spawn_worker):
    dep = unique_deployment("along")
    handler, seen = _concurrency_probe()
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(20)])
    worker = await spawn_worker(dep, handler, max_concurrency=2, start=False)
    calls = CallCounter(worker, fail_along=True)
    await worker.start()

    await wait_until(lambda: _drained(pool, dep, 20), "the backlog to drain", within=30)
    await wait_until(lambda: worker.active_run_ids == [], "the slots to free", within=10)

    assert calls.along > 0
    assert calls.along_runs == 0
    assert seen["max"] <= 2
    assert seen["runs"] == 20
    assert await _attempts(pool, dep) == {1}


async def test_a_shutdown_mid_backlog_leaves_every_run_completed_or_pending(pool, spawn_worker):
    dep = unique_deployment("along")
    done = 0

    async def handler(ctx: RunContext) -> str:
        nonlocal done
        await asyncio.sleep(0.005)
        done += 1
        return "ok"

    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(200)])
    worker = await spawn_worker(dep, handler, max_concurrency=2)
    await wait_until(lambda: done >= 20, "some runs to finish", within=30)

    await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)

    statuses = await _statuses(pool, dep)
    assert set(statuses) <= {"completed", "pending"}
    assert sum(statuses.values()) == 200
    assert await pool.fetchval(
        """SELECT count(*) FROM zeroth.runs
            WHERE deployment_ref = $1 AND lease_worker_id IS NOT NULL""", dep) == 0


async def test_runs_claimed_by_a_call_that_answers_after_the_drain_began_are_handed_back(
        pool, spawn_worker):
    dep = unique_deployment("along")
    started: list[Any] = []

    async def handler(ctx: RunContext) -> str:
        started.append(ctx.run_id)
        return "ok"

    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(5)])
    worker = await spawn_worker(dep, handler, max_concurrency=1, start=False)
    lm = worker.lease_manager
    real = lm.complete_and_claim
    sent = asyncio.Event()
    claimed: list[Any] = []

    async def held_until_the_drain(deployment_ref: str, worker_id: str, completions: Any,
                                   **kwargs: Any) -> Any:
        sent.set()
        await wait_until(lambda: worker.stopping, "the drain to begin", within=10)
        result = await real(deployment_ref, worker_id, completions, **kwargs)
        claimed.extend(run.run_id for run in result.claim.runs)
        return result

    lm.complete_and_claim = held_until_the_drain  # type: ignore[method-assign]
    await worker.start()
    await wait_until(sent.is_set, "the first completion with its claim", within=10)

    await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)

    assert len(claimed) == 1
    assert claimed[0] not in started
    row = await pool.fetchrow(
        """SELECT status::text AS status, attempts, lease_worker_id FROM zeroth.runs
            WHERE run_id = $1""", claimed[0])
    assert (row["status"], row["attempts"], row["lease_worker_id"]) == ("pending", 0, None)
    assert await _statuses(pool, dep) == {"completed": 1, "pending": 4}
