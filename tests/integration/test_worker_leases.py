"""RunWorker lease upkeep, in process: a refused renewal stops the handler at once and nothing
more is written; a renewal that errors or hangs keeps the handler only until the last confirmed
lease deadline, then stops it (fail-stop) without failing or releasing the run, which stays
RUNNING with an expired lease that claim_orphaned recovers.

Leases are 3 s (renewal every 1 s): a takeover is noticed by the next renewal, about 2 s before
the worker's own deadline, so a renewal held up on a loaded machine (which with 1.5 s leases let
the deadline come first now and then) still finds the lease lost; the orphan sweep is pushed out
to 60 s so the worker under test never re-claims its own lost runs. The waits' bounds are failure
bounds only (what stopped a handler, and when, is asserted on the worker's own record).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import metric, unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker
from zeroth_pg.worker._run import ActiveRun, StopReason

LEASE = 3.0
RENEW_EVERY = LEASE / 3
FOREVER = 3600.0






async def _row(conn: asyncpg.Connection | asyncpg.Pool, run_id: UUID) -> dict[str, Any]:
    row = await conn.fetchrow(
        """SELECT r.*, r.status::text AS status, r.error::text AS error_json,
                  r.output::text AS output_json, r.progress::text AS progress_json,
                  r.lease_expires_at <= clock_timestamp() AS lease_expired
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
    assert row is not None, f"no run {run_id}"
    out = dict(row)
    for column in ("error", "output", "progress"):
        text = out.pop(f"{column}_json")
        out[column] = None if text is None else json.loads(text)
    return out


async def _checkpoint_count(conn: asyncpg.Connection | asyncpg.Pool, run_id: UUID) -> int:
    return await conn.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM zeroth.checkpoints k WHERE k.run_id = $1", run_id)


class Sleeper:
    """A handler that checkpoints once, then sleeps until it is cancelled (noting when)."""

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.stopped_at: float | None = None
        self.contexts: list[RunContext] = []

    async def __call__(self, ctx: RunContext) -> dict[str, Any]:
        self.contexts.append(ctx)
        await ctx.checkpoint({"step": 1})
        self.running.set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            self.stopped_at = time.monotonic()
            raise
        return {"unreachable": True}

    async def wait_stopped(self, within: float) -> float:
        await wait_until(lambda: self.stopped_at is not None, "the handler to be stopped",
                          within=within)
        assert self.stopped_at is not None
        return self.stopped_at


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]], *,
                    worker_pool: asyncpg.Pool | None = None, **kwargs: Any) -> RunWorker:
        kwargs.setdefault("lease_duration", LEASE)
        kwargs.setdefault("poll_interval", 0.1)
        kwargs.setdefault("orphan_sweep_interval", 60.0)
        kwargs.setdefault("shutdown_timeout", 2.0)
        worker = RunWorker(worker_pool or pool, deployment, handler, **kwargs)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


async def _assert_nothing_more_written(pool: asyncpg.Pool, run_id: UUID,
                                       snapshot: dict[str, Any], checkpoints: int) -> None:
    """Two more renewal intervals pass (a negative check) and the run row is byte-identical."""
    await asyncio.sleep(2 * RENEW_EVERY)
    after = await _row(pool, run_id)
    snapshot = {k: v for k, v in snapshot.items() if k != "lease_expired"}
    assert {k: v for k, v in after.items() if k != "lease_expired"} == snapshot
    assert await _checkpoint_count(pool, run_id) == checkpoints


async def test_refused_renewal_after_a_takeover_stops_the_handler_and_writes_nothing_more(
        pool, spawn_worker, connect, database_dsn):
    dep = unique_deployment("lease")
    handler = Sleeper()
    lost = metric("zeroth_lease_lost_total", dep)
    rejected = metric("zeroth_lease_fencing_rejected_total", dep)
    worker = await spawn_worker(dep, handler, dsn=database_dsn)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(handler.running.wait(), timeout=10)
    old_generation = handler.contexts[0].lease_generation

    # Another session takes the run over: the lease is expired in place and claimed at once.
    thief = await connect()
    async with thief.transaction():
        assert await LeaseManager(thief).clear_lease(run)
        taken = await LeaseManager(thief, lease_duration_seconds=60).claim_orphaned_result(
            dep, "thief")
    assert taken.run_ids == (run,)
    snapshot = await _row(pool, run)
    checkpoints = await _checkpoint_count(pool, run)
    entry = _entry(worker, run)

    stopped = await handler.wait_stopped(within=30)
    # Stopped by the first refused renewal, before the worker's own lease deadline came.
    assert entry.stop_reason is StopReason.LEASE_LOST
    assert stopped < entry.deadline
    await wait_until(lambda: not worker.active_run_ids, "the run to leave the worker", within=30)
    assert metric("zeroth_lease_lost_total", dep) == lost + 1
    assert metric("zeroth_lease_fencing_rejected_total", dep) == rejected  # nothing was tried

    row = await _row(pool, run)
    assert row["status"] == "running"  # not failed
    assert (row["lease_worker_id"], row["lease_generation"]) == (
        "thief", taken.generations[run])
    assert taken.generations[run] == old_generation + 1
    # The thief's recovery counted the attempt this worker lost.
    assert (row["error"], row["output"], row["attempts"]) == (None, None, 2)
    await _assert_nothing_more_written(pool, run, snapshot, checkpoints)


async def test_refused_renewal_of_an_expired_lease_leaves_the_run_recoverable(
        pool, spawn_worker, connect):
    """An expired lease is never renewed, even with no new owner: the handler stops and the run
    stays RUNNING with its expired lease, so the next orphan sweep anywhere recovers it."""
    dep = unique_deployment("lease")
    handler = Sleeper()
    lost = metric("zeroth_lease_lost_total", dep)
    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(handler.running.wait(), timeout=10)
    generation = handler.contexts[0].lease_generation

    admin = await connect()
    assert await LeaseManager(admin).clear_lease(run)
    snapshot = await _row(pool, run)
    assert snapshot["lease_expired"]
    assert snapshot["lease_worker_id"] == worker.worker_id
    entry = _entry(worker, run)

    stopped = await handler.wait_stopped(within=30)
    # Stopped by the refused renewal, before the worker's own lease deadline came.
    assert entry.stop_reason is StopReason.LEASE_LOST
    assert stopped < entry.deadline
    await wait_until(lambda: not worker.active_run_ids, "the run to leave the worker", within=30)
    assert metric("zeroth_lease_lost_total", dep) == lost + 1
    await _assert_nothing_more_written(pool, run, snapshot, 1)

    rescuer = LeaseManager(pool, lease_duration_seconds=30)
    taken = await rescuer.claim_orphaned_result(dep, "rescuer")
    assert taken.run_ids == (run,)
    assert taken.generations[run] == generation + 1
    assert taken.runs[0].checkpoint_data == {"step": 1}


async def _confirmed_renewal(pool: asyncpg.Pool, run: UUID) -> None:
    """Wait until the worker has renewed the lease at least once (expiry moved forward)."""
    first = (await _row(pool, run))["lease_expires_at"]

    async def renewed() -> bool:
        return bool((await _row(pool, run))["lease_expires_at"] > first)

    await wait_until(renewed, "a first renewal", within=30, interval=0.05)


def _entry(worker: RunWorker, run: UUID) -> ActiveRun:
    """The worker's own record of the run: its lease deadline and why it was stopped."""
    (entry,) = [e for (run_id, _), e in worker._active.items() if run_id == run]
    return entry


async def _assert_fail_stop(pool: asyncpg.Pool, admin: asyncpg.Connection, handler: Sleeper,
                            run: UUID, worker: RunWorker, dep: str, lost: float,
                            rejected: float) -> None:
    """The handler is stopped by the worker's last confirmed lease deadline, not before it (the
    worker's own recorded deadline and the handler's stop, on the same monotonic clock); the run
    is left RUNNING with that expired lease, unfailed, and claim_orphaned recovers it."""
    entry = _entry(worker, run)
    stopped = await handler.wait_stopped(within=LEASE + 5)
    row = await _row(admin, run)  # no renewal can have landed since the failures began
    assert entry.stop_reason is StopReason.DEADLINE
    assert stopped >= entry.deadline
    await wait_until(lambda: not worker.active_run_ids, "the run to leave the worker", within=30)
    assert metric("zeroth_lease_lost_total", dep) == lost + 1
    assert metric("zeroth_lease_fencing_rejected_total", dep) == rejected

    assert row["status"] == "running"  # not failed, not handed back
    assert row["lease_worker_id"] == worker.worker_id
    assert (row["error"], row["output"], row["attempts"]) == (None, None, 1)
    await wait_until(lambda: _expired(admin, run), "the lease to lapse", within=LEASE + 5,
                      interval=0.05)
    after = await _row(admin, run)
    assert after["lease_expires_at"] == row["lease_expires_at"]  # nothing written: it lapsed
    assert after["status"] == "running"  # a RUNNING run whose lease is reclaimable
    rescuer = LeaseManager(pool, lease_duration_seconds=30)
    taken = await rescuer.claim_orphaned_result(dep, "rescuer")
    assert taken.run_ids == (run,)
    assert taken.runs[0].checkpoint_data == {"step": 1}


async def _expired(conn: asyncpg.Connection, run: UUID) -> bool:
    return bool((await _row(conn, run))["lease_expired"])


async def test_renewals_that_error_stop_the_handler_at_the_lease_deadline(
        pool, spawn_worker, connect, database_dsn):
    """The worker's pool is closed under it: every renewal raises (ConnectionLostError)."""
    dep = unique_deployment("lease")
    handler = Sleeper()
    lost = metric("zeroth_lease_lost_total", dep)
    rejected = metric("zeroth_lease_fencing_rejected_total", dep)
    admin = await connect()
    worker_pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=4)
    worker = await spawn_worker(dep, handler, worker_pool=worker_pool)
    try:
        run = (await LeaseManager(pool).enqueue_run(dep)).run_id
        await asyncio.wait_for(handler.running.wait(), timeout=10)
        await _confirmed_renewal(pool, run)

        worker_pool.terminate()  # from now on every call of the worker fails at once
        await _assert_fail_stop(pool, admin, handler, run, worker, dep, lost, rejected)
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
        worker_pool.terminate()


async def test_renewals_that_hang_stop_the_handler_at_the_lease_deadline(
        pool, spawn_worker, connect, database_dsn):
    """The worker's only pooled connection is held elsewhere: every renewal waits, then times
    out at the deadline."""
    dep = unique_deployment("lease")
    handler = Sleeper()
    lost = metric("zeroth_lease_lost_total", dep)
    rejected = metric("zeroth_lease_fencing_rejected_total", dep)
    admin = await connect()
    worker_pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=1)
    worker = await spawn_worker(dep, handler, worker_pool=worker_pool)
    held: asyncpg.Connection | None = None
    try:
        run = (await LeaseManager(pool).enqueue_run(dep)).run_id
        await asyncio.wait_for(handler.running.wait(), timeout=10)
        await _confirmed_renewal(pool, run)

        held = await asyncio.wait_for(worker_pool.acquire(), timeout=5)  # exhausts the pool
        await _assert_fail_stop(pool, admin, handler, run, worker, dep, lost, rejected)
    finally:
        if held is not None:
            await worker_pool.release(held)
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
        await asyncio.wait_for(worker_pool.close(), timeout=10)
