"""A worker that claims ahead (``RunWorker(claim_ahead=N)``): it holds up to N runs more than its
handlers, claimed and started, each waiting for a handler to return, so with short handlers the
next run starts without waiting for a round trip. What must hold with it: no more than
max_concurrency handlers ever run; every run completes once, one attempt each; a run that waits
longer than AHEAD_WAIT is handed back with its attempt given back (and the worker stops claiming
ahead for a while, so it cannot bounce runs over and over); a cancel request or a lost lease stops
a waiting run without its handler ever running (and, for the lost lease, without a write); a
graceful shutdown runs the waiting runs instead of handing them back; bad values are refused."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import test_worker_lifecycle
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker
from zeroth_pg.worker._run import RunState

spawn_worker = test_worker_lifecycle.spawn_worker  # the fixture: workers drained at teardown


async def _row(pool: asyncpg.Pool, run_id: UUID) -> asyncpg.Record:
    return await pool.fetchrow(
        """SELECT status::text AS status, attempts, hand_backs, lease_generation,
                  lease_worker_id FROM zeroth.runs WHERE run_id = $1""", run_id)


async def _statuses(pool: asyncpg.Pool, dep: str) -> dict[str, int]:
    rows = await pool.fetch(
        """SELECT status::text AS status, count(*) AS n FROM zeroth.runs
            WHERE deployment_ref = $1 GROUP BY status""", dep)
    return {row["status"]: row["n"] for row in rows}


class _FirstBlocks:
    """A handler whose first run blocks until ``release`` is set; the others return at once.
    Records every run it was called for."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.blocking: UUID | None = None
        self.called: list[UUID] = []

    async def __call__(self, ctx: RunContext) -> dict[str, Any]:
        self.called.append(ctx.run_id)
        if self.blocking is None:
            self.blocking = ctx.run_id
            await self.release.wait()
        return {"ok": True}


def _waiting(worker: RunWorker) -> list[UUID]:
    return [run_id for (run_id, _), entry in worker._active.items()
            if entry.state is RunState.WAITING]


async def _two_runs_one_waiting(pool: asyncpg.Pool, spawn_worker: Any, handler: _FirstBlocks,
                                **options: Any) -> tuple[RunWorker, str, UUID]:
    """Two runs for a worker of one handler slot that claims one ahead: the first blocks in its
    handler, the second waits for the slot. Returns the worker, the deployment and the waiting
    run."""
    dep = unique_deployment("ahead")
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(2)])
    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1, **options)
    await wait_until(lambda: handler.blocking is not None and len(_waiting(worker)) == 1,
                     "one run in its handler and one waiting for the slot", within=10)
    waiting = _waiting(worker)[0]
    row = await _row(pool, waiting)
    # Claimed and started by the claim (claim_and_start): running, its attempt counted.
    assert (row["status"], row["attempts"], row["lease_worker_id"]) == (
        "running", 1, worker.worker_id)
    return worker, dep, waiting


async def test_claiming_ahead_never_runs_more_handlers_than_max_concurrency(pool, spawn_worker):
    dep = unique_deployment("ahead")
    seen = {"now": 0, "max": 0, "runs": 0, "held": 0}
    holder: list[RunWorker] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen["now"] += 1
        seen["runs"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        seen["held"] = max(seen["held"], len(holder[0]._active))
        try:
            await asyncio.sleep(0.002)
            return {"n": ctx.payload["n"]}
        finally:
            seen["now"] -= 1

    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(150)])
    worker = await spawn_worker(dep, handler, max_concurrency=3, claim_ahead=3, start=False)
    holder.append(worker)
    await worker.start()

    await wait_until(lambda: _drained(pool, dep, 150), "the backlog to drain", within=30)

    assert seen["max"] <= 3
    assert seen["runs"] == 150
    # It did claim ahead: it held more runs than it had handler slots.
    assert seen["held"] > 3
    attempts = {row["attempts"] for row in await pool.fetch(
        "SELECT attempts FROM zeroth.runs WHERE deployment_ref = $1", dep)}
    assert attempts == {1}


async def _drained(pool: asyncpg.Pool, dep: str, total: int) -> bool:
    return await _statuses(pool, dep) == {"completed": total}


async def test_a_run_that_finds_no_slot_in_time_is_handed_back_with_its_attempt(
        pool, spawn_worker, monkeypatch):
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 0.3)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler)

    async def handed_back() -> bool:
        row = await _row(pool, waiting)
        return (row["status"], row["hand_backs"]) == ("pending", 1)

    await wait_until(handed_back, "the waiting run to be handed back", within=10)
    row = await _row(pool, waiting)
    assert row["attempts"] == 0  # the attempt its claim counted is given back
    assert row["lease_worker_id"] is None
    assert waiting not in handler.called
    # The worker claims nothing ahead for a while: the run stays in the queue, not bounced.
    assert worker._runs.ahead() == 0
    await asyncio.sleep(0.5)
    assert (await _row(pool, waiting))["status"] == "pending"

    handler.release.set()
    await wait_until(lambda: _drained(pool, dep, 2), "both runs to complete", within=10)
    assert handler.called.count(waiting) == 1
    assert (await _row(pool, waiting))["attempts"] == 1


async def test_a_cancel_request_stops_a_waiting_run_before_its_handler_runs(
        pool, spawn_worker, monkeypatch):
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 60.0)
    handler = _FirstBlocks()
    _, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                  lease_duration=1.5)

    await LeaseManager(pool).request_cancel(waiting)

    async def cancelled() -> bool:
        return (await _row(pool, waiting))["status"] == "cancelled"

    await wait_until(cancelled, "the waiting run to be cancelled", within=10)
    assert waiting not in handler.called
    handler.release.set()
    await wait_until(
        lambda: _statuses_are(pool, dep, {"completed": 1, "cancelled": 1}),
        "the first run to complete", within=10)
    assert waiting not in handler.called


async def _statuses_are(pool: asyncpg.Pool, dep: str, expected: dict[str, int]) -> bool:
    return await _statuses(pool, dep) == expected


async def test_a_waiting_run_whose_lease_was_taken_writes_nothing_and_never_runs(
        pool, spawn_worker, monkeypatch):
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 60.0)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       lease_duration=1.5)
    # A DBA's manual UPDATE takes the lease from the worker: a newer generation, someone else's.
    await pool.execute(
        """UPDATE zeroth.runs SET lease_generation = lease_generation + 1,
                  lease_worker_id = 'dba', lease_expires_at = now() + interval '1 hour'
            WHERE run_id = $1""", waiting)
    taken = await _row(pool, waiting)

    await wait_until(lambda: waiting not in worker.active_run_ids,
                     "the worker to let the waiting run go", within=10)
    assert waiting not in handler.called
    assert await _row(pool, waiting) == taken  # nothing written by the worker
    handler.release.set()
    await wait_until(lambda: _statuses_are(pool, dep, {"completed": 1, "running": 1}),
                     "the first run to complete", within=10)
    assert waiting not in handler.called


async def test_a_graceful_shutdown_runs_the_waiting_runs_instead_of_handing_them_back(
        pool, spawn_worker, monkeypatch):
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 60.0)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       shutdown_timeout=10.0)

    shutdown = asyncio.create_task(worker.graceful_shutdown())
    await asyncio.sleep(0.2)
    handler.release.set()
    await asyncio.wait_for(shutdown, timeout=20)

    assert await _statuses(pool, dep) == {"completed": 2}
    assert handler.called.count(waiting) == 1
    assert (await _row(pool, waiting))["hand_backs"] == 0


@pytest.mark.parametrize("options", [
    {"claim_ahead": -1}, {"claim_ahead": 9}, {"claim_ahead": True}, {"claim_ahead": 1.5},
    {"claim_ahead": 2, "fleet_max_concurrency": 4},
])
async def test_claim_ahead_refuses_what_it_cannot_honour(pool, options):
    with pytest.raises(ValueError, match="claim_ahead"):
        RunWorker(pool, unique_deployment("ahead"), lambda ctx: None, max_concurrency=8,
                  **options)
