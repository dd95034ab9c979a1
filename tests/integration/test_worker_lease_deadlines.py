"""A handler never outlives its lease, and a lease that ended frees its slot (RunWorker in the
test's event loop, against a real database):

* a worker whose event loop stalled past its lease re-claims its own orphan; the old
  generation's task is stopped and its cleanup leaves the new generation's lease alone;
* a renewal refused because it raced the run's own completion is neither logged nor counted as a
  lost lease;
* a run whose row another session holds (renewed NULL) is stopped at its deadline, before it can
  be taken over;
* a handler that swallows its cancellation, after its lease was cleared or a cancel was
  requested, gives up its slot once the lease is gone, and the shutdown abandons it after
  shutdown_timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any
from uuid import UUID

import worker_probes
from helpers import metric, unique_deployment, wait_until
from worker_probes import (
    FOREVER,
    LEASE,
    all_completed,
    stored_run,
    wait_for_status,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_a_worker_that_stalled_past_its_lease_keeps_the_lease_of_its_own_reclaim(
        pool, spawn_worker):
    """Attempt 1 blocks the event loop for 2.5 leases: its lease lapses, and this worker's own
    sweep re-claims the run at generation 2 while attempt 1's task is still alive. Attempt 1 is
    stopped and its task ends only after attempt 2 began; attempt 2 outlives several leases, so
    it completes at generation 2 only if its lease kept being renewed after that cleanup."""
    dep = unique_deployment("harden")
    seen: list[tuple[int, int]] = []
    first_cancelled: list[bool] = []
    second_started = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        seen.append((ctx.attempt, ctx.lease_generation))
        if ctx.lease_generation == 1:
            time.sleep(2.5 * LEASE)  # noqa: ASYNC251 - the stall under test: no task runs
            try:
                await asyncio.sleep(FOREVER)
            except asyncio.CancelledError:
                first_cancelled.append(True)
                # Still alive (and still in the worker) when generation 2 is there.
                await asyncio.wait_for(second_started.wait(), timeout=30)
                raise
            return {"unreachable": True}
        second_started.set()
        for _ in range(30):  # 3 leases, awaiting: generation 2's lease must be renewed
            await asyncio.sleep(LEASE / 10)
        return {"attempt": ctx.attempt, "generation": ctx.lease_generation}

    lost = metric("zeroth_lease_lost_total", dep)
    completed = metric("zeroth_runs_completed_total", dep)
    worker = await spawn_worker(dep, handler, dsn=None, lease_duration=LEASE,
                                orphan_sweep_interval=0.2, poll_interval=0.05)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=3)).run_id

    async def finished() -> dict[str, Any] | None:
        row = await stored_run(pool, run)
        return row if row["status"] not in ("pending", "running") else None

    row = await wait_until(finished, "the run to finish", within=30)
    assert (row["status"], row["lease_generation"]) == ("completed", 2)
    await wait_until(lambda: worker.active_run_ids == [], "the worker to hold no run",
                     within=10)

    assert seen == [(1, 1), (2, 2)]
    assert first_cancelled == [True]
    assert row["output"] == {"attempt": 2, "generation": 2}
    assert (row["lease_generation"], row["attempts"], row["error"]) == (2, 2, None)
    # Only generation 1's lease was lost; generation 2 kept its renewals to the end.
    assert metric("zeroth_lease_lost_total", dep) == lost + 1
    assert metric("zeroth_runs_completed_total", dep) == completed + 1


class RaceSpy:
    """Makes every completion race a renewal: settle_runs is answered to the worker only once
    a renewal sent after that completion committed was refused for each completed run and the
    worker has handled that refusal (the renewal loop has sent its next renewal). The renewal
    loop still holds the runs as completing when it reads the refusal."""

    def __init__(self, worker: RunWorker) -> None:
        self.renewals = 0
        self.refused: dict[UUID, list[int]] = {}  # run id -> the renewals that refused it
        self.raced: set[UUID] = set()
        self.renewed = asyncio.Event()  # set whenever a renewal begins
        self.real_renew = worker.lease_manager.renew_leases
        self.real_complete = worker.lease_manager.settle_runs
        self.real_along = worker.lease_manager.complete_and_claim
        worker.lease_manager.renew_leases = self._renew  # type: ignore[method-assign]
        worker.lease_manager.settle_runs = self._complete  # type: ignore[method-assign]
        worker.lease_manager.complete_and_claim = (  # type: ignore[method-assign]
            self._complete_and_claim)

    async def _renew(self, worker_id: str, leases: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        index = self.renewals
        self.renewed.set()
        renewals = await self.real_renew(worker_id, leases, **kwargs)
        for renewal in renewals:
            if renewal.renewed is False:  # None: its row was busy, not a refusal
                self.refused.setdefault(renewal.run_id, []).append(index)
        return renewals

    async def _complete_and_claim(self, deployment_ref: str, worker_id: str, completions: Any,
                                  **kwargs: Any) -> Any:
        result = await self.real_along(deployment_ref, worker_id, completions, **kwargs)
        await self._race({row.run_id for row in result.completions if row.completed})
        return result

    async def _complete(self, worker_id: str, completions: Any, **kwargs: Any) -> Any:
        rows = await self.real_complete(worker_id, completions, **kwargs)
        await self._race({row.run_id for row in rows if row.outcome == "completed"})
        return rows

    async def _race(self, done: set[UUID]) -> None:
        """Answer once a renewal sent after the commit was refused for every run in ``done``."""
        since = self.renewals  # a refusal counts only from a renewal sent after the commit

        def handled() -> bool:
            # Refused by renewal i sent after the commit, and renewal i + 1 has begun: the
            # renewal loop is sequential, so it has handled renewal i's answer.
            return all(any(since < i < self.renewals for i in self.refused.get(run, ()))
                       for run in done)

        # A bound, not a timing: with the fix this holds within two renewal intervals. Without
        # it the answer is given anyway, and the test's assertions say what went wrong.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                while not handled():
                    self.renewed.clear()
                    await self.renewed.wait()
        if handled():
            self.raced |= done


async def test_a_renewal_refused_by_the_runs_own_completion_is_no_lost_lease(
        pool, spawn_worker, caplog):
    caplog.set_level(logging.DEBUG, logger="zeroth_pg.worker")
    dep = unique_deployment("harden")
    total = 24

    async def handler(ctx: RunContext) -> Any:
        await asyncio.sleep(0.1)  # about one renewal interval
        return {"i": ctx.payload["i"]}

    # Renewals every 0.1 s, with a 3 s lease: a renewal races every completion, and no lease can
    # really lapse on a loaded machine.
    worker = await spawn_worker(dep, handler, dsn=None, lease_duration=3.0,
                                renew_fraction=1 / 30, poll_interval=0.05, start=False)
    spy = RaceSpy(worker)
    lost = metric("zeroth_lease_lost_total", dep)
    rejected = metric("zeroth_lease_fencing_rejected_total", dep)
    completed = metric("zeroth_runs_completed_total", dep)
    await worker.start()
    runs = await LeaseManager(pool).enqueue_runs(
        dep, [{"payload": {"i": i}} for i in range(total)])

    await wait_until(all_completed(pool, dep, total), "every run to complete", within=30)
    await wait_until(lambda: worker.active_run_ids == [], "the worker to hold no run",
                     within=10)

    ids = {run.run_id for run in runs}
    print(f"\n{len(spy.raced)} of {total} completions raced a renewal that was refused "
          f"({spy.renewals} renewals)")
    records = [r.getMessage() for r in caplog.records if r.name == "zeroth_pg.worker"]
    assert [message for message in records if "lost" in message] == []
    assert metric("zeroth_lease_lost_total", dep) == lost
    assert metric("zeroth_lease_fencing_rejected_total", dep) == rejected
    assert metric("zeroth_runs_completed_total", dep) == completed + total
    assert spy.raced == ids  # every run's renewal was refused by its own completion


async def test_a_busy_row_does_not_let_a_handler_outlive_its_lease(pool, spawn_worker):
    """renew_leases reports a row another session holds as renewed NULL; the worker kept going
    until a later renewal said the lease was lost, a renewal interval after its deadline, while
    another worker could already take the run over. It is stopped at its deadline now: before
    the run can be taken over."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    run = await lm.enqueue_run(dep)
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None

    await spawn_worker(dep, handler, lease_duration=3.0, renew_fraction=0.45)
    await asyncio.wait_for(started.wait(), timeout=10)
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", run.run_id)
        expires = await pool.fetchval(
            "SELECT lease_expires_at - clock_timestamp() FROM zeroth.runs WHERE run_id = $1",
            run.run_id)
        await asyncio.sleep(expires.total_seconds() + 0.3)  # the lease has expired meanwhile
        stopped_before_takeover = cancelled.is_set()
    finally:
        await tx.rollback()
        await pool.release(holder)
    taken = await LeaseManager(pool).claim_orphaned(dep, "w2")
    assert stopped_before_takeover, "the handler still ran when its run could be taken over"
    assert taken == [run.run_id]


async def test_a_handler_that_ignores_cancellation_frees_its_slot_and_bounds_the_shutdown(
        pool, spawn_worker):
    """The run's lease is gone (an operator cleared it) and its handler swallows every cancel:
    the entry kept its slot for ever, so nothing else was claimed, and graceful_shutdown waited
    for it for ever. The slot is free once the lease is gone, and the shutdown abandons the
    handler after shutdown_timeout."""
    dep = unique_deployment("harden")
    release = asyncio.Event()
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["kind"] == "other":
            return {"ok": 1}
        started.set()
        while not release.is_set():  # a bad handler: every cancellation is swallowed
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)
        return None

    lm = LeaseManager(pool)
    stubborn = await lm.enqueue_run(dep, payload={"kind": "stubborn"})
    worker = await spawn_worker(dep, handler, max_concurrency=1, shutdown_timeout=0.5,
                                lease_duration=2.0)
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        assert await pool.fetchval("SELECT zeroth.clear_lease(run_id => $1)", stubborn.run_id)
        other = await lm.enqueue_run(dep, payload={"kind": "other"})
        await wait_for_status(pool, other.run_id, "completed", within=20)

        await asyncio.wait_for(worker.graceful_shutdown(), timeout=20)
    finally:
        release.set()


async def test_a_handler_that_ignores_a_cancel_request_gives_up_its_slot_once_its_lease_lapses(
        pool, spawn_worker):
    """A cancel stops renewing the run; a handler that swallows it kept its slot for ever (it
    never became 'lease gone'). Its slot is free once its last confirmed deadline passed."""
    dep = unique_deployment("harden")
    release = asyncio.Event()
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["kind"] == "other":
            return {"ok": 1}
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)
        return None

    lm = LeaseManager(pool)
    stubborn = await lm.enqueue_run(dep, payload={"kind": "stubborn"})
    await spawn_worker(dep, handler, max_concurrency=1, shutdown_timeout=0.5, lease_duration=2.0)
    try:
        await asyncio.wait_for(started.wait(), timeout=10)
        outcome = await pool.fetchval(
            "SELECT outcome FROM zeroth.request_cancel_v2(run_id => $1)", stubborn.run_id)
        assert outcome == "cancel_requested"
        other = await lm.enqueue_run(dep, payload={"kind": "other"})
        await wait_for_status(pool, other.run_id, "completed", within=20)
    finally:
        release.set()
