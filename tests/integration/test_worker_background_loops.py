"""The worker's background loops are supervised and never stop each other (RunWorker in the
test's event loop, against a real database): a crashed renewal loop is restarted and keeps
renewing, a failing orphan sweep does not stop claiming, and a worker with no free slot still
ends the orphans nobody may resume.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import worker_probes
from helpers import metric, unique_deployment, wait_until
from worker_probes import (
    LEASE,
    all_completed,
    all_worker_errors,
    stored_run,
    wait_for_status,
    worker_errors,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import ConnectionLostError
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_a_crashed_renewal_loop_is_restarted_and_keeps_renewing(pool, spawn_worker):
    dep = unique_deployment("harden")
    started = asyncio.Event()

    # A lease of 2 * LEASE (renewed every 1 s: a renewal held up on a loaded machine does not
    # lose it), and a handler that outlives it by half: without renewals the lease would lapse.
    lease = 2 * LEASE

    async def handler(ctx: RunContext) -> Any:
        started.set()
        for _ in range(15):
            await asyncio.sleep(lease / 10)
        return {"done": ctx.attempt}

    worker = await spawn_worker(dep, handler, dsn=None, lease_duration=lease,
                                poll_interval=0.05, start=False)
    real = worker._renew_loop
    calls = 0

    async def crash_once() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("injected: the renewal loop crashes")
        await real()

    worker._renew_loop = crash_once  # type: ignore[method-assign]
    crashed = worker_errors(dep, "renew_loop")
    loop_crashes = metric("zeroth_worker_crashes_total", dep, kind="loop")
    lost = metric("zeroth_lease_lost_total", dep)
    await worker.start()
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(started.wait(), timeout=10)
    claimed = (await stored_run(pool, run))["lease_expires_at"]

    async def renewed() -> bool:
        row = await stored_run(pool, run)
        return row["status"] != "running" or row["lease_expires_at"] > claimed

    await wait_until(renewed, "a renewal after the crash", within=10)
    row = await wait_for_status(pool, run, "completed", within=20)
    assert row["output"] == {"done": 1}
    assert (row["lease_generation"], row["attempts"], row["error"]) == (1, 1, None)
    assert calls == 2  # crashed once, restarted once
    assert worker_errors(dep, "renew_loop") == crashed + 1
    # A crash of the worker's machinery, counted where an on-call alerts on crashes.
    assert metric("zeroth_worker_crashes_total", dep, kind="loop") == loop_crashes + 1
    assert metric("zeroth_lease_lost_total", dep) == lost


async def test_a_failing_orphan_sweep_does_not_stop_claiming(pool, spawn_worker):
    dep = unique_deployment("harden")
    handled: list[UUID] = []

    async def handler(ctx: RunContext) -> Any:
        handled.append(ctx.run_id)
        return {"ok": True}

    worker = await spawn_worker(dep, handler, dsn=None, orphan_sweep_interval=0.1,
                                poll_interval=0.05, start=False)
    sweeps = 0

    async def broken_sweep(*args: Any, **kwargs: Any) -> Any:
        nonlocal sweeps
        sweeps += 1
        raise RuntimeError("injected: the orphan sweep fails")

    worker.lease_manager.claim_orphaned_result = broken_sweep  # type: ignore[method-assign]
    errors = all_worker_errors(dep)
    await worker.start()
    await wait_until(lambda: sweeps >= 1, "the first (failing) sweep", within=10)

    runs = await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"i": i}} for i in range(6)])
    await wait_until(all_completed(pool, dep, 6), "every run to complete", within=10)
    await wait_until(lambda: sweeps >= 3, "more sweeps on schedule", within=10)

    assert sorted(handled) == sorted(run.run_id for run in runs)
    after = all_worker_errors(dep)
    assert after["sweep"] == errors["sweep"] + sweeps  # each failed sweep counted once
    # Nothing else broke: no failed claim pass, no crashed and restarted loop.
    assert {k: v for k, v in after.items() if k != "sweep"} == {
        k: v for k, v in errors.items() if k != "sweep"}


async def test_a_failed_orphan_sweep_is_retried_on_the_failure_backoff(pool, spawn_worker):
    """After a failover the sweep is what re-leases the runs whose worker died with the old
    primary: one that failed (its connection lost) is tried again on the claim pass's failure
    backoff (50 ms doubling to 1 s), not an ``orphan_sweep_interval`` later (here an hour, and
    the poll interval too: nothing else would sweep again within the test's deadline)."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    orphan = await lm.enqueue_run(dep, payload={"kind": "orphan"})
    crashed = LeaseManager(pool, lease_duration_seconds=0.2)
    claimed = await crashed.claim_and_start(dep, "crashed-worker")
    assert [run.run_id for run in claimed.runs] == [orphan.run_id]

    async def expired() -> bool:
        return bool(await pool.fetchval(
            "SELECT lease_expires_at < now() FROM zeroth.runs WHERE run_id = $1",
            orphan.run_id))

    await wait_until(expired, "the crashed worker's lease to lapse", within=10)

    async def handler(ctx: RunContext) -> Any:
        return {"recovered_at_attempt": ctx.attempt}

    worker = await spawn_worker(dep, handler, dsn=None, orphan_sweep_interval=3600.0,
                                poll_interval=3600.0, start=False)
    lm_worker = worker.lease_manager
    real = lm_worker.claim_orphaned_result
    sweeps = 0

    async def first_sweep_fails(*args: Any, **kwargs: Any) -> Any:
        nonlocal sweeps
        sweeps += 1
        if sweeps == 1:
            raise ConnectionLostError("injected: the first sweep's connection is lost")
        return await real(*args, **kwargs)

    lm_worker.claim_orphaned_result = first_sweep_fails  # type: ignore[method-assign]
    errors = worker_errors(dep, "sweep")
    await worker.start()
    row = await wait_for_status(pool, orphan.run_id, "completed", within=20)

    assert row["output"] == {"recovered_at_attempt": 2}
    assert sweeps == 2  # the failed sweep, and its retry that recovered the orphan
    assert worker_errors(dep, "sweep") == errors + 1


async def test_a_worker_with_no_free_slot_still_ends_the_orphans_nobody_may_resume(
        pool, spawn_worker):
    """Its sweep returned early without a free slot, so an orphan out of attempts stayed
    running (its thread blocked) for as long as every worker was busy. claim_orphaned with
    claim_limit 0 ends it without a slot."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    orphan = await lm.enqueue_run(dep, payload={"kind": "orphan"}, max_attempts=1)
    crashed = LeaseManager(pool, lease_duration_seconds=0.5)
    claimed = await crashed.claim_and_start(dep, "crashed-worker")
    assert [run.run_id for run in claimed.runs] == [orphan.run_id]
    release = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        await release.wait()
        return {"ok": 1}

    busy = await lm.enqueue_run(dep, payload={"kind": "busy"})
    try:
        await spawn_worker(dep, handler, max_concurrency=1, orphan_sweep_interval=0.2)
        await wait_for_status(pool, busy.run_id, "running")
        ended = await wait_for_status(pool, orphan.run_id, "failed", within=20)
        assert ended["error"]["stop_reason"] == "attempts_exhausted"
        assert (await stored_run(pool, busy.run_id))["status"] == "running"  # still saturated
    finally:
        release.set()
