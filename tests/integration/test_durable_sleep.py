"""Durable sleep with real RunWorkers (RunContext.sleep / sleep_until, SyncRunContext.sleep).

A handler that sleeps ends its attempt: the run leaves the worker with its checkpoint, is pending
until its resume time, and is re-entered from the start on whichever worker claims it then, with
the latest checkpoint. Who could break it: a handler that catches Exception (or even
BaseException) around the sleep — the run sleeps anyway and nothing more is written; a handler
whose lease was lost before it slept — the sleep is refused with LeaseLostError and changes
nothing; a sync handler in its own thread.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import metric, unique_deployment, wait_until

from zeroth_pg import App, LeaseLostError
from zeroth_pg.client import LeaseManager
from zeroth_pg.types import SleepOutcome, SleepResult
from zeroth_pg.worker import RunContext, RunSlept, RunWorker

WITHIN = 30.0


async def _row(pool: asyncpg.Pool, run_id: UUID) -> asyncpg.Record:
    row = await pool.fetchrow(
        """SELECT r.status::text AS status, r.output::text AS output, r.attempts, r.run_after,
                  r.lease_worker_id, r.lease_generation, r.checkpoint_seq
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
    assert row is not None
    return row


async def _wait_status(pool: asyncpg.Pool, run_id: UUID, status: str) -> asyncpg.Record:
    async def check() -> asyncpg.Record | None:
        row = await _row(pool, run_id)
        return row if row["status"] == status else None

    return await wait_until(check, f"run {run_id} to be {status}", within=WITHIN)  # type: ignore[no-any-return]


async def _checkpoint_ids(pool: asyncpg.Pool, run_id: UUID) -> list[UUID]:
    return [row["checkpoint_id"] for row in await pool.fetch(
        "SELECT checkpoint_id FROM zeroth.checkpoints WHERE run_id = $1 ORDER BY checkpoint_order",
        run_id)]


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool,
                       database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    """Start a RunWorker in this loop (quick polls); every worker is drained at teardown."""
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]],
                    **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("lease_duration", 30.0)
        kwargs.setdefault("shutdown_timeout", 2.0)
        kwargs.setdefault("poll_interval", 0.05)
        worker = RunWorker(pool, deployment, handler, **kwargs)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


class TestThreeSleepsAcrossTwoWorkers:
    async def test_a_run_sleeping_three_times_resumes_from_each_checkpoint_and_completes(
            self, pool, spawn_worker):
        dep = unique_deployment("sleep")
        entries: list[dict[str, Any]] = []
        first_slept = asyncio.Event()

        async def handler(run: RunContext) -> dict[str, Any]:
            step = 0 if run.recovery_checkpoint_id is None else run.checkpoint_data["step"]
            entries.append({"worker": run.worker_id, "step": step, "attempt": run.attempt,
                            "checkpoint": run.recovery_checkpoint_id,
                            "entered": await pool.fetchval("SELECT clock_timestamp()")})
            if step == 3:
                return {"steps": step}
            try:
                await run.sleep(1, checkpoint={"step": step + 1})
            finally:
                entries[-1]["slept"] = run.slept
                first_slept.set()

        slept_before = metric("zeroth_runs_slept_total", dep)
        # max_attempts 1: three sleeps would exhaust it if a sleep counted as an attempt.
        a = await spawn_worker(dep, handler, worker_id="sleep-worker-a")
        run = await LeaseManager(pool).enqueue_run(dep, {}, max_attempts=1)
        await asyncio.wait_for(first_slept.wait(), WITHIN)
        # A is gone before the first resume: the run resumes on the other worker.
        await a.graceful_shutdown()
        b = await spawn_worker(dep, handler, worker_id="sleep-worker-b")
        await spawn_worker(dep, handler, worker_id="sleep-worker-c")

        row = await _wait_status(pool, run.run_id, "completed")

        assert json.loads(row["output"]) == {"steps": 3}
        assert row["attempts"] == 1
        assert [e["step"] for e in entries] == [0, 1, 2, 3]
        assert entries[0]["worker"] == a.worker_id
        assert entries[1]["worker"] != a.worker_id
        assert {e["worker"] for e in entries[1:]} <= {b.worker_id, "sleep-worker-c"}
        assert [e["attempt"] for e in entries] == [1, 1, 1, 1]
        # Each re-entry sees exactly the checkpoint its sleep saved, never before its time.
        saved = await _checkpoint_ids(pool, run.run_id)
        assert [e["checkpoint"] for e in entries] == [None, *saved]
        assert [e["slept"].checkpoint_id for e in entries[:3]] == saved
        for before, after in itertools.pairwise(entries):
            assert before["slept"].outcome is SleepOutcome.SLEEPING
            assert after["entered"] >= before["slept"].run_after
            assert before["slept"].run_after >= before["entered"] + timedelta(seconds=1)
        await wait_until(lambda: metric("zeroth_runs_slept_total", dep) == slept_before + 3,
                         "the slept counter", within=30)


class TestSleepCannotBeSwallowed:
    async def test_a_handler_catching_exception_around_sleep_still_sleeps(
            self, pool, spawn_worker):
        dep = unique_deployment("sleep")
        caught: list[BaseException] = []

        async def handler(run: RunContext) -> str:
            if run.recovery_checkpoint_id is not None:
                return "resumed"
            try:
                await run.sleep(0.2, checkpoint={"slept": True})
            except Exception as exc:  # the RunSlept is no Exception: this never runs
                caught.append(exc)
            return "swallowed"

        await spawn_worker(dep, handler)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        row = await _wait_status(pool, run.run_id, "completed")

        assert json.loads(row["output"]) == "resumed"
        assert caught == []

    async def test_a_handler_that_swallows_run_slept_and_returns_still_sleeps(
            self, pool, spawn_worker):
        dep = unique_deployment("sleep")
        after_sleep: list[Any] = []

        async def handler(run: RunContext) -> str:
            if run.recovery_checkpoint_id is not None:
                return "resumed"
            try:
                await run.sleep(0.2, checkpoint={"slept": True})
            except BaseException as exc:  # a hostile handler
                after_sleep.append(type(exc))
                # Its lease is gone: later writes are refused, and a second sleep says so.
                with pytest.raises(RunSlept):
                    await run.sleep(0.2)
                try:
                    await run.commit(output={"late": True})
                except LeaseLostError:
                    after_sleep.append("commit refused")
            return "swallowed"

        await spawn_worker(dep, handler)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        row = await _wait_status(pool, run.run_id, "completed")

        assert json.loads(row["output"]) == "resumed"
        assert after_sleep == [RunSlept, "commit refused"]


class TestForgedRunSlept:
    async def test_a_run_slept_the_handler_made_itself_fails_the_attempt(self, pool,
                                                                         spawn_worker):
        dep = unique_deployment("sleep")

        async def handler(run: RunContext) -> str:
            if run.attempt == 1:  # claims to have slept, never called sleep_run
                raise RunSlept(SleepResult(SleepOutcome.SLEEPING, None, None))
            return "second attempt"

        await spawn_worker(dep, handler, retry_base_seconds=0.05, retry_max_seconds=0.05)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        row = await _wait_status(pool, run.run_id, "completed")

        assert json.loads(row["output"]) == "second attempt"
        assert row["attempts"] == 2  # the forged sleep was a failed attempt, not a free one


class TestSleepAfterTheLeaseWasLost:
    async def test_a_holder_whose_lease_was_cleared_cannot_sleep(self, pool, spawn_worker):
        dep = unique_deployment("sleep")
        outcome: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

        async def handler(run: RunContext) -> str:
            # An operator takes the lease away (clear_lease: unfenced, admin).
            await LeaseManager(pool).clear_lease(run.run_id)
            try:
                await run.sleep(60, checkpoint={"stale": True})
            except BaseException as exc:
                if not outcome.done():
                    outcome.set_result(exc)
                raise
            return "unreachable"

        await spawn_worker(dep, handler, orphan_sweep_interval=3600)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        error = await asyncio.wait_for(outcome, WITHIN)

        assert isinstance(error, LeaseLostError)
        row = await _row(pool, run.run_id)
        # clear_lease left it running with an expired lease (recoverable); the refused sleep
        # scheduled nothing and saved no checkpoint.
        assert (row["status"], row["checkpoint_seq"]) == ("running", 0)
        assert await _checkpoint_ids(pool, run.run_id) == []


class TestSleepUntil:
    async def test_sleep_until_an_instant_resumes_at_it(self, pool, spawn_worker):
        dep = unique_deployment("sleep")
        results: list[Any] = []

        async def handler(run: RunContext) -> str:
            if run.recovery_checkpoint_id is not None:
                return "woke"
            now = await pool.fetchval("SELECT clock_timestamp()")
            results.append(now + timedelta(seconds=0.5))
            await run.sleep_until(results[0], checkpoint={"at": results[0].isoformat()})

        await spawn_worker(dep, handler)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        row = await _wait_status(pool, run.run_id, "completed")

        assert json.loads(row["output"]) == "woke"
        assert row["run_after"] == results[0]

    async def test_a_naive_datetime_is_refused_before_anything_is_sent(self, pool,
                                                                       spawn_worker):
        dep = unique_deployment("sleep")
        errors: list[BaseException] = []

        async def handler(run: RunContext) -> str:
            try:
                await run.sleep_until(datetime.now())  # naive: the point of the test
            except Exception as exc:
                errors.append(exc)
            return "awake"

        await spawn_worker(dep, handler)
        run = await LeaseManager(pool).enqueue_run(dep, {})

        await _wait_status(pool, run.run_id, "completed")
        assert [type(e).__name__ for e in errors] == ["InvalidArgumentError"]


class TestSyncHandlerSleeps:
    async def test_a_sync_handler_sleeps_and_is_called_again_from_its_checkpoint(
            self, app: App, pool, serve):
        calls: list[Any] = []

        @app.deployment("sync-sleeper", max_attempts=1)
        def sync_sleeper(run, rounds: int) -> dict[str, int]:
            done = 0 if run.recovery_checkpoint_id is None else run.checkpoint_data["done"]
            calls.append(done)
            if done < rounds:
                try:
                    run.sleep(0.2, checkpoint={"done": done + 1})
                except Exception:  # RunSlept is no Exception
                    calls.append("caught")
            return {"done": done}

        queued = await sync_sleeper.enqueue(rounds=2)
        await serve()

        row = await _wait_status(pool, queued.run_id, "completed")

        assert json.loads(row["output"]) == {"done": 2}
        assert calls == [0, 1, 2]
        assert row["attempts"] == 1
