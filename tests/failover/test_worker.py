"""A RunWorker across a primary failover (synchronous replication), without a restart.

* Runs in flight when the primary dies finish on the promoted standby: the worker's pool and
  listener follow the multi-host DSN, its writes retry through the outage (connection loss and
  25006 are retryable), and every run ends completed once.
* An idle worker that never polls on a timer (poll and sweep intervals of an hour) hears the
  new primary: its listener reconnects, re-polls, and announces it is idle there again (the
  wakeup gate's locks live on the listen connection), so a run enqueued after the failover
  wakes it.
* A worker whose renewals fail for longer than its lease keeps the fail-stop rule: it stops the
  handler at its last confirmed lease deadline with no server answering, writes nothing more, and
  the run is recovered at the next generation on the new primary.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from failover_support import eventually, retrying
from replication import ReplicatedPair

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import RetryableError
from zeroth_pg.worker import RunContext, RunWorker

DEPLOYMENT = "failover"


@contextlib.asynccontextmanager
async def running_worker(dsn: str, handler: Any, **options: Any) -> AsyncIterator[RunWorker]:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=8)
    settings: dict[str, Any] = {
        "poll_interval": 0.1, "orphan_sweep_interval": 0.3, "orphan_grace": 0.1,
        "shutdown_timeout": 5.0, "retry_base_seconds": 0.1}
    worker = RunWorker(pool, DEPLOYMENT, handler, dsn=dsn, tenant_id="t",
                       **(settings | options))
    await worker.start()
    try:
        yield worker
    finally:
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=60)
        await pool.close()


async def statuses(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT r.status::text AS status, count(*) AS n FROM zeroth.runs r"
                            " GROUP BY r.status")
    return {row["status"]: row["n"] for row in rows}


class TestRunsInFlight:
    async def test_runs_in_flight_finish_on_the_promoted_standby(
            self, sync_pair: tuple[ReplicatedPair, str]) -> None:
        pair, dsn = sync_pair
        total = 60

        async def handler(ctx: RunContext) -> dict[str, Any]:
            for step in range(2):
                await asyncio.sleep(0.05)
                await retrying(lambda step=step: ctx.checkpoint({"step": step}))
            return {"generation": ctx.lease_generation}

        harness = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            await LeaseManager(harness).enqueue_runs(
                DEPLOYMENT, [{"payload": {}} for _ in range(total)], tenant_id="t")
            async with running_worker(dsn, handler, max_concurrency=4,
                                      lease_duration=5.0) as worker:
                await eventually(lambda: _completed_at_least(harness, total // 4),
                                 what="a quarter of the runs complete")
                await asyncio.to_thread(pair.failover)
                await eventually(lambda: _completed_at_least(harness, total),
                                 what="every run completes on the new primary")
                assert worker.notifier is not None
                # The listener reconnected to the new primary (and the worker re-polled there).
                await eventually(lambda: asyncio.sleep(0, worker.notifier.connects >= 2),
                                 what="the listener reconnects")
            assert await retrying(lambda: harness.fetchval(
                "SELECT inet_server_port()")) == pair.standby.port
            rows = await retrying(lambda: harness.fetch(
                "SELECT r.status::text AS status, r.lease_generation,"
                " (r.output->>'generation')::bigint AS output_generation FROM zeroth.runs r"))
        finally:
            await harness.close()
        assert len(rows) == total
        assert {row["status"] for row in rows} == {"completed"}
        # The accepted outcome is the one of the generation that held the run at the end.
        assert all(row["output_generation"] == row["lease_generation"] for row in rows)


class TestIdleWorker:
    async def test_an_idle_worker_is_woken_by_a_run_enqueued_on_the_new_primary(
            self, sync_pair: tuple[ReplicatedPair, str]) -> None:
        pair, dsn = sync_pair
        hour = 3600.0

        async def handler(ctx: RunContext) -> dict[str, Any]:
            return {"ok": True}

        harness = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        client = LeaseManager(harness)
        try:
            async with running_worker(dsn, handler, max_concurrency=2, poll_interval=hour,
                                      orphan_sweep_interval=hour) as worker:
                assert worker.notifier is not None
                notifier = worker.notifier
                await eventually(lambda: asyncio.sleep(0, notifier.connects >= 1),
                                 what="the listener connects")
                # Only a notification can wake this worker before an hour has passed.
                first = await client.enqueue_run(DEPLOYMENT, {}, tenant_id="t")
                await eventually(lambda: _status_is(harness, first.run_id, "completed"),
                                 what="the run enqueued on the old primary completes")

                await asyncio.to_thread(pair.failover)
                await eventually(lambda: asyncio.sleep(0, notifier.connects >= 2),
                                 what="the listener reconnects to the new primary")
                second = await retrying(lambda: client.enqueue_run(DEPLOYMENT, {},
                                                                   tenant_id="t"))
                await eventually(lambda: _status_is(harness, second.run_id, "completed"),
                                 what="the run enqueued on the new primary wakes the worker")
            assert await retrying(lambda: harness.fetchval(
                "SELECT inet_server_port()")) == pair.standby.port
        finally:
            await harness.close()


async def _status_is(pool: asyncpg.Pool, run_id: Any, status: str) -> bool:
    # A pooled connection to the dead primary raises retryably: eventually() tries again.
    found = await pool.fetchval("SELECT r.status::text FROM zeroth.runs r WHERE r.run_id = $1",
                                run_id)
    return bool(found == status)


async def _completed_at_least(pool: asyncpg.Pool, count: int) -> bool:
    return (await statuses(pool)).get("completed", 0) >= count


class TestFailStop:
    async def test_a_worker_cut_off_longer_than_its_lease_stops_and_writes_nothing(
            self, sync_pair: tuple[ReplicatedPair, str]) -> None:
        pair, dsn = sync_pair
        lease = 3.0
        stopped = asyncio.Event()
        checkpoints_acknowledged: list[int] = []

        async def handler(ctx: RunContext) -> dict[str, Any]:
            if ctx.lease_generation > 1:
                return {"generation": ctx.lease_generation}
            try:
                step = 0
                while True:  # checkpoint for ever; only the worker's fail-stop ends it
                    with contextlib.suppress(RetryableError):
                        await ctx.checkpoint({"generation": 1, "step": step})
                        checkpoints_acknowledged.append(step)
                    step += 1
                    await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                stopped.set()
                raise

        harness = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
        try:
            run = await LeaseManager(harness).enqueue_run(DEPLOYMENT, {}, tenant_id="t")
            async with running_worker(dsn, handler, max_concurrency=1, lease_duration=lease):
                await eventually(lambda: asyncio.sleep(0, len(checkpoints_acknowledged) >= 3),
                                 what="the handler checkpoints")
                await asyncio.to_thread(pair.kill_primary)
                # No server accepts writes now. The worker must stop the handler by itself, at
                # the deadline of the last renewal the primary confirmed.
                await asyncio.wait_for(stopped.wait(), timeout=120)
                await asyncio.to_thread(pair.wait_standby_applied)
                standby = await asyncpg.connect(pair.standby.dsn("zeroth"))
                try:
                    confirmed = await standby.fetchrow(
                        "SELECT r.lease_generation, r.lease_expires_at FROM zeroth.runs r"
                        " WHERE r.run_id = $1", run.run_id)
                    written = await standby.fetch(
                        "SELECT c.created_at FROM zeroth.checkpoints c WHERE c.run_id = $1"
                        " AND c.lease_generation = 1", run.run_id)
                finally:
                    await standby.close()
                assert confirmed["lease_generation"] == 1
                # Synchronous replication: every checkpoint the handler was told was written is
                # on the standby.
                assert len(written) >= len(checkpoints_acknowledged)
                await asyncio.to_thread(pair.promote)
                # The same worker, never restarted, recovers the orphan on the new primary.
                final = await eventually(lambda: harness.fetchrow(
                    "SELECT r.status::text AS status, r.lease_generation FROM zeroth.runs r"
                    " WHERE r.run_id = $1 AND r.status = 'completed'", run.run_id),
                    what="the run is recovered and completed on the new primary")
            after = await retrying(lambda: harness.fetch(
                "SELECT c.created_at FROM zeroth.checkpoints c WHERE c.run_id = $1"
                " AND c.lease_generation = 1", run.run_id))
        finally:
            await harness.close()
        assert final["lease_generation"] >= 2
        # Generation 1 wrote nothing after it was cut off, and nothing past its lease.
        assert len(after) == len(written)
        assert all(row["created_at"] <= confirmed["lease_expires_at"] for row in after)
