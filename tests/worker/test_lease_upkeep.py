"""Lease upkeep (zeroth_pg.worker._leases.LeaseUpkeep) on real leases: renewals move the lease
and the local deadline, a refused renewal stops its run as lost, a reported cancel stops it as
cancelled, and renewals that cannot reach the database stop a run at its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from helpers import wait_until
from leased import WORKER, active, claim, lease_row

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunState, StopReason
from zeroth_pg.worker._leases import LeaseUpkeep
from zeroth_pg.worker._run import ActiveRun

#: Long enough that a renewal held up on a loaded machine neither loses a lease (which stops
#: the run as lost) nor passes a deadline (stopped at it): with 2 s, and a deadline 1 s out,
#: a stalled first renewal stopped a run the test expected to keep.
LEASE = 10.0


class Upkeep:
    """A LeaseUpkeep over ``entries``, its loop running, recording the stops it asks for."""

    def __init__(self, lm: LeaseManager, entries: list[ActiveRun], *, renew_interval: float):
        self.entries = entries
        self.stops: list[tuple[ActiveRun, StopReason]] = []
        self.stopped_at: list[float] = []  # the monotonic time of each stop
        self.unit = LeaseUpkeep(lm, WORKER, runs=lambda: self.entries, stop=self._stop,
                                lease_duration=LEASE, renew_interval=renew_interval)

    def _stop(self, entry: ActiveRun, reason: StopReason) -> None:
        self.stops.append((entry, reason))
        self.stopped_at.append(time.monotonic())
        entry.request_stop(reason)


@pytest.fixture
def lm(pool: asyncpg.Pool) -> LeaseManager:
    return LeaseManager(pool, lease_duration_seconds=LEASE)


@contextlib.asynccontextmanager
async def running(upkeep: Upkeep) -> AsyncIterator[Upkeep]:
    task = asyncio.create_task(upkeep.unit.run())
    try:
        yield upkeep
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TestRenewals:
    async def test_every_interval_one_call_moves_each_lease_and_its_deadline(self, pool, lm):
        runs = await claim(lm, 3)
        entries = [active(run, deadline=time.monotonic() + 5) for run in runs]
        before = [(await lease_row(pool, run))["lease_expires_at"] for run in runs]
        async with running(Upkeep(lm, entries, renew_interval=0.2)) as upkeep:
            async def renewed() -> bool:
                rows = [await lease_row(pool, run) for run in runs]
                return all(r["lease_expires_at"] > b for r, b in zip(rows, before, strict=True))

            await wait_until(renewed, "every lease to be renewed", within=10)
            await wait_until(lambda: all(e.deadline > time.monotonic() + 5 for e in entries),
                             "every deadline to move", within=10)
        assert upkeep.stops == []

    async def test_renew_now_renews_before_the_interval(self, pool, lm):
        [run] = await claim(lm, 1)
        entry = active(run)
        before = (await lease_row(pool, run))["lease_expires_at"]
        async with running(Upkeep(lm, [entry], renew_interval=60)) as upkeep:
            await asyncio.sleep(0.1)
            upkeep.unit.renew_now.set()

            async def renewed() -> bool:
                return (await lease_row(pool, run))["lease_expires_at"] > before

            await wait_until(renewed, "the lease to be renewed at once", within=30)

    async def test_a_stopped_run_is_not_renewed(self, pool, lm):
        [run] = await claim(lm, 1)
        entry = active(run)
        entry.request_stop(StopReason.SHUTDOWN)
        before = (await lease_row(pool, run))["lease_expires_at"]
        async with running(Upkeep(lm, [entry], renew_interval=0.05)):
            await asyncio.sleep(0.5)
        assert (await lease_row(pool, run))["lease_expires_at"] == before


class TestStops:
    async def test_a_refused_renewal_stops_its_run_as_lost_and_no_other(self, pool, lm):
        kept, lost = await claim(lm, 2)
        entries = [active(kept), active(lost)]
        for entry in entries:
            entry.advance(RunState.EXECUTING)
        assert await lm.clear_lease(lost.run_id)
        async with running(Upkeep(lm, entries, renew_interval=0.1)) as upkeep:
            await wait_until(lambda: upkeep.stops, "a stop", within=10)
            await asyncio.sleep(0.3)  # later renewals stop nothing more
        assert [(e.run.run_id, reason) for e, reason in upkeep.stops] == [
            (lost.run_id, StopReason.LEASE_LOST)]

    async def test_a_cancel_request_reported_by_the_renewal_stops_the_run_as_cancelled(
            self, pool, lm):
        [run] = await claim(lm, 1)
        entry = active(run)
        entry.advance(RunState.EXECUTING)
        await lm.request_cancel(run.run_id)
        async with running(Upkeep(lm, [entry], renew_interval=0.1)) as upkeep:
            await wait_until(lambda: upkeep.stops, "a stop", within=10)
        assert upkeep.stops == [(entry, StopReason.CANCEL)]
        assert entry.ctx.cancel_requested

    async def test_a_completing_run_whose_renewal_is_refused_is_left_to_its_completion(
            self, pool, lm):
        [run] = await claim(lm, 1)
        entry = active(run)
        entry.advance(RunState.EXECUTING)
        entry.advance(RunState.COMPLETING)
        [done] = await lm.complete_runs(WORKER, [(run.run_id, run.lease_generation, {})])
        assert done.completed
        async with running(Upkeep(lm, [entry], renew_interval=0.05)) as upkeep:
            await asyncio.sleep(0.5)
        assert upkeep.stops == []


class TestFailStop:
    async def test_renewals_that_cannot_reach_the_database_stop_the_run_at_its_deadline(
            self, database_dsn, lm):
        [run] = await claim(lm, 1)
        closed = await asyncpg.create_pool(database_dsn, min_size=0, max_size=1)
        await closed.close()  # every call now fails as a lost connection
        entry = active(run, deadline=time.monotonic() + 0.5)
        entry.advance(RunState.EXECUTING)
        upkeep = Upkeep(LeaseManager(closed, lease_duration_seconds=LEASE), [entry],
                        renew_interval=0.1)
        async with running(upkeep):
            await wait_until(lambda: upkeep.stops, "the fail-stop", within=10)
        assert upkeep.stops == [(entry, StopReason.DEADLINE)]
        assert upkeep.stopped_at[0] >= entry.deadline  # not before the deadline

    def test_enforce_deadlines_stops_only_renewable_runs_past_their_deadline(self, lm):
        from leased import unclaimed

        now = time.monotonic()
        past, future, stopped = (active(unclaimed(), deadline=now - 1),
                                 active(unclaimed(), deadline=now + 60),
                                 active(unclaimed(), deadline=now - 1))
        stopped.request_stop(StopReason.SHUTDOWN)
        upkeep = Upkeep(lm, [past, future, stopped], renew_interval=1)
        upkeep.unit.enforce_deadlines()
        assert upkeep.stops == [(past, StopReason.DEADLINE)]


class TestCancellation:
    async def test_a_cancel_that_meets_a_renewal_answer_stops_the_loop(self, pool, lm):
        """Python 3.11's asyncio.wait_for drops a cancellation that arrives just as the call it
        waits for completes (CPython gh-86296). The renewal loop waited for renew_leases that
        way, so a cancel at that instant was lost: the loop kept renewing and whoever awaited it
        (graceful_shutdown, these tests' teardown) hung for ever. Seen as a CI hang here."""
        [run] = await claim(lm, 1)
        entry = active(run)
        rng = random.Random(13)
        for attempt in range(150):
            upkeep = Upkeep(lm, [entry], renew_interval=0.001)
            task = asyncio.create_task(upkeep.unit.run())
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)
            assert done, f"attempt {attempt}: the renewal loop ignored its cancellation"
