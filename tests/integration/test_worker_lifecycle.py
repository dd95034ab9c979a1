"""RunWorker lifecycle, in process: the worker runs in the test's event loop with handlers defined
here, against a real database with real NOTIFY.

Completion, retries with backoff and the dead letter (then redrive), recovery from a checkpoint,
the fenced RunContext writes, non-JSON output, graceful shutdown with a quick and a slow run,
operator interrupt, cancel from another connection (by NOTIFY and by renewal), batch claiming and
the local concurrency cap. Each test uses its own deployment name, so the process-wide
prometheus counters can be read per test.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import worker_probes
from helpers import metric, unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import ConnectionLostError, LeaseLostError, NonRetryableError
from zeroth_pg.types import CancelOutcome, RetryPolicy
from zeroth_pg.worker import RunContext, RunWorker

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown

FOREVER = 3600.0






async def _row(pool: asyncpg.Pool, run_id: UUID) -> dict[str, Any]:
    row = await pool.fetchrow(
        """SELECT r.*, r.status::text AS status, r.output::text AS output_json,
                  r.error::text AS error_json, r.progress::text AS progress_json,
                  r.metadata::text AS metadata_json,
                  r.lease_expires_at <= clock_timestamp() AS lease_expired
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
    assert row is not None, f"no run {run_id}"
    out = dict(row)
    for column in ("output", "error", "progress", "metadata"):
        text = out.pop(f"{column}_json")
        out[column] = None if text is None else json.loads(text)
    return out


async def _wait_status(pool: asyncpg.Pool, run_id: UUID, status: str, *,
                       within: float = 10.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        row = await _row(pool, run_id)
        return row if row["status"] == status else None

    return await wait_until(check, f"run {run_id} to be {status}", within=within)  # type: ignore[no-any-return]


async def _checkpoints(pool: asyncpg.Pool, run_id: UUID) -> list[asyncpg.Record]:
    return await pool.fetch(  # type: ignore[no-any-return]
        """SELECT k.checkpoint_id, k.lease_generation, k.data::text AS data
             FROM zeroth.checkpoints k WHERE k.run_id = $1 ORDER BY k.checkpoint_order""",
        run_id)


async def test_returned_value_completes_the_run_with_its_output(pool, spawn_worker):
    dep = unique_deployment("life")
    seen: list[RunContext] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen.append(ctx)
        return {"echo": ctx.payload, "attempt": ctx.attempt}

    started, completed = (metric("zeroth_runs_started_total", dep),
                          metric("zeroth_runs_completed_total", dep))
    worker = await spawn_worker(dep, handler)
    run = await LeaseManager(pool).enqueue_run(
        dep, {"x": 1}, metadata={"m": "v"}, idempotency_key="key-1", thread_id="thread-1")
    row = await _wait_status(pool, run.run_id, "completed")

    assert row["output"] == {"echo": {"x": 1}, "attempt": 1}
    assert (row["attempts"], row["error"], row["lease_worker_id"], row["lease_expires_at"]) == (
        1, None, None, None)
    assert row["started_at"] is not None
    assert row["finished_at"] is not None
    [ctx] = seen
    assert (ctx.run_id, ctx.attempt, ctx.max_attempts, ctx.lease_generation) == (
        run.run_id, 1, 3, 1)
    assert (ctx.metadata, ctx.idempotency_key, ctx.thread_id) == ({"m": "v"}, "key-1", "thread-1")
    assert ctx.worker_id == worker.worker_id
    assert not ctx.recovered
    assert ctx.recovery_checkpoint_id is None
    assert not ctx.cancel_requested
    await wait_until(lambda: metric("zeroth_runs_completed_total", dep) == completed + 1,
                      "the completed counter", within=30)
    assert metric("zeroth_runs_started_total", dep) == started + 1


async def test_failures_retry_with_backoff_then_dead_letter_and_redrive_runs_again(
        pool, spawn_worker, connect):
    dep = unique_deployment("life")
    base = 0.3
    attempts: list[tuple[int, float]] = []
    succeed = False

    async def handler(ctx: RunContext) -> dict[str, Any]:
        attempts.append((ctx.attempt, time.monotonic()))
        if not succeed:
            raise RuntimeError(f"boom on attempt {ctx.attempt}")
        return {"fixed": True, "attempt": ctx.attempt}

    handler_errors = metric("zeroth_handler_errors_total", dep)
    dead = metric("zeroth_runs_dead_lettered_total", dep)
    await spawn_worker(dep, handler, poll_interval=0.05, retry_base_seconds=base,
                       retry_max_seconds=5.0)
    run = await LeaseManager(pool).enqueue_run(dep, {"x": 1}, max_attempts=3)
    row = await _wait_status(pool, run.run_id, "failed", within=15)

    assert [attempt for attempt, _ in attempts] == [1, 2, 3]
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(attempts)]
    print(f"\nretry gaps: {', '.join(f'{gap * 1000:.0f} ms' for gap in gaps)} (base {base} s)")
    # Exponential backoff with equal jitter: retry n waits at least base * 2^(n-1) / 2.
    assert gaps[0] >= base / 2 - 0.02
    assert gaps[1] >= base - 0.02
    assert row["attempts"] == 3
    assert row["dead_lettered_at"] is not None
    assert row["error"]["type"] == "RuntimeError"
    assert row["error"]["message"] == "boom on attempt 3"
    assert row["lease_worker_id"] is None
    letter = await pool.fetchrow(
        """SELECT d.attempts, d.max_attempts, d.error ->> 'message' AS message
             FROM zeroth.dead_letters d WHERE d.run_id = $1""", run.run_id)
    assert letter is not None
    assert tuple(letter) == (3, 3, "boom on attempt 3")
    await wait_until(lambda: metric("zeroth_runs_dead_lettered_total", dep) == dead + 1,
                      "the dead-letter counter", within=30)
    assert metric("zeroth_handler_errors_total", dep) == handler_errors + 3
    generation = row["lease_generation"]

    succeed = True
    operator = await connect()
    assert await LeaseManager(operator).redrive_run(run.run_id)
    row = await _wait_status(pool, run.run_id, "completed", within=10)
    assert attempts[-1][0] == 1  # a redriven run starts over at attempt 1
    assert row["output"] == {"fixed": True, "attempt": 1}
    assert (row["attempts"], row["dead_lettered_at"], row["error"]) == (1, None, None)
    assert row["lease_generation"] > generation  # redrive never resets the generation
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = $1", run.run_id) == 0


async def test_recovered_run_resumes_from_its_checkpoint(pool, spawn_worker):
    dep = unique_deployment("life")
    dead = LeaseManager(pool, lease_duration_seconds=30)
    run = await dead.enqueue_run(dep, {"steps": 3})
    claim = await dead.claim_pending_result(dep, "crashed-worker")
    [claimed] = claim.runs
    old = claimed.lease_generation
    assert await dead.start_run(run.run_id, "crashed-worker", generation=old)
    await dead.save_checkpoint(run.run_id, "crashed-worker", {"step": 1}, generation=old)
    last = await dead.save_checkpoint(run.run_id, "crashed-worker", {"step": 2}, generation=old)
    # The crashed worker's lease runs out (expired in place, holder kept).
    assert await dead.release_lease(run.run_id, "crashed-worker", generation=old)

    seen: list[RunContext] = []
    resumed = asyncio.Event()
    finish = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen.append(ctx)
        resumed.set()
        await finish.wait()
        return {"resumed_from": ctx.checkpoint_data}

    await spawn_worker(dep, handler)  # sweeps for orphans on start
    await asyncio.wait_for(resumed.wait(), timeout=10)
    [ctx] = seen
    assert ctx.recovered
    assert ctx.recovery_checkpoint_id == last
    assert ctx.checkpoint_data == {"step": 2}
    assert ctx.lease_generation == old + 1
    assert ctx.attempt == 2  # the attempt that died with the crashed worker counts
    # The crashed generation's late writes are refused while the new owner runs.
    assert not await dead.commit_fenced(run.run_id, "crashed-worker", generation=old,
                                        progress={"late": True})
    assert await dead.save_checkpoint(run.run_id, "crashed-worker", {"step": 99},
                                      generation=old) is None
    finish.set()
    row = await _wait_status(pool, run.run_id, "completed")
    assert row["output"] == {"resumed_from": {"step": 2}}
    assert row["progress"] is None
    assert row["attempts"] == 2
    assert [json.loads(k["data"]) for k in await _checkpoints(pool, run.run_id)] == [
        {"step": 1}, {"step": 2}]


async def test_context_writes_are_fenced_by_the_lease_generation(pool, spawn_worker, connect):
    dep = unique_deployment("life")
    wrote = asyncio.Event()
    go_on = asyncio.Event()
    refused: list[str] = []
    state: dict[str, Any] = {}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        await ctx.progress({"pct": 50})
        await ctx.commit(metadata={"stage": "one"})
        state["checkpoint"] = await ctx.checkpoint({"step": 1})
        state["generation"] = ctx.lease_generation
        wrote.set()
        await go_on.wait()  # meanwhile the run is taken over
        try:
            await ctx.progress({"pct": 99})
        except LeaseLostError as exc:
            refused.append(f"progress:{exc.generation}")
        await ctx.checkpoint({"step": 2})  # refused too: LeaseLostError ends the handler
        return {"unreachable": True}

    lost = metric("zeroth_lease_lost_total", dep)
    rejected = metric("zeroth_lease_fencing_rejected_total", dep)
    worker = await spawn_worker(dep, handler, lease_duration=60.0)  # no renewal during the test
    run = await LeaseManager(pool).enqueue_run(dep)
    await asyncio.wait_for(wrote.wait(), timeout=10)

    row = await _row(pool, run.run_id)
    assert row["progress"] == {"pct": 50}
    assert row["metadata"] == {"stage": "one"}
    [checkpoint] = await _checkpoints(pool, run.run_id)
    assert checkpoint["checkpoint_id"] == state["checkpoint"]
    assert checkpoint["lease_generation"] == state["generation"] == row["lease_generation"]

    # Another worker takes the run over: the lease is expired in place, then claimed.
    thief = await connect()
    async with thief.transaction():
        assert await LeaseManager(thief).clear_lease(run.run_id)
        taken = await LeaseManager(thief, lease_duration_seconds=60).claim_orphaned_result(
            dep, "thief")
    assert taken.run_ids == (run.run_id,)
    new_generation = taken.generations[run.run_id]
    go_on.set()
    await wait_until(lambda: not worker.active_run_ids, "the handler to end", within=30)

    assert refused == [f"progress:{state['generation']}"]
    row = await _row(pool, run.run_id)
    assert row["status"] == "running"
    assert (row["lease_worker_id"], row["lease_generation"]) == ("thief", new_generation)
    assert (row["progress"], row["output"], row["error"]) == ({"pct": 50}, None, None)
    assert len(await _checkpoints(pool, run.run_id)) == 1
    assert metric("zeroth_lease_lost_total", dep) == lost + 1
    assert metric("zeroth_lease_fencing_rejected_total", dep) == rejected + 1


async def test_non_json_output_fails_the_run_without_retrying(pool, spawn_worker):
    dep = unique_deployment("life")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        calls.append(ctx.attempt)
        return {"when": datetime.now(UTC)}  # not JSON-serialisable

    completed = metric("zeroth_runs_completed_total", dep)
    await spawn_worker(dep, handler, poll_interval=0.05, retry_base_seconds=0.0)
    run = await LeaseManager(pool).enqueue_run(dep, max_attempts=3)
    row = await _wait_status(pool, run.run_id, "failed")

    assert calls == [1]
    assert row["attempts"] == 1
    assert row["dead_lettered_at"] is None  # not retryable: failed, not dead-lettered
    assert row["error"]["type"] == "TypeError"
    assert row["output"] is None
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = $1", run.run_id) == 0
    assert metric("zeroth_runs_completed_total", dep) == completed


async def test_graceful_shutdown_completes_quick_runs_and_hands_back_slow_ones(
        pool, spawn_worker):
    dep = unique_deployment("life")
    started: dict[str, asyncio.Event] = {"quick": asyncio.Event(), "slow": asyncio.Event()}
    release_quick = asyncio.Event()
    cancelled_at: list[float] = []
    resumed: list[RunContext] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        kind = ctx.payload["kind"]
        if ctx.worker_id == "drain-b":
            resumed.append(ctx)
            return {"kind": kind, "by": "b", "from": ctx.checkpoint_data}
        if kind == "quick":
            started["quick"].set()
            await release_quick.wait()
            return {"kind": "quick", "by": "a"}
        await ctx.checkpoint({"step": 1})
        started["slow"].set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise
        return {"unreachable": True}

    lm = LeaseManager(pool)
    quick = (await lm.enqueue_run(dep, {"kind": "quick"})).run_id
    slow = (await lm.enqueue_run(dep, {"kind": "slow"})).run_id
    # The quick run, released once the drain began, must complete inside shutdown_timeout: 3 s,
    # so that on a loaded machine it still does (with 1.5 s it was now and then handed back).
    drain = 3.0
    worker_a = await spawn_worker(dep, handler, worker_id="drain-a", shutdown_timeout=drain)
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started.values())), timeout=10)
    assert (await _row(pool, slow))["attempts"] == 1

    shutdown_at = time.monotonic()
    shutdown = asyncio.create_task(worker_a.graceful_shutdown())
    await wait_until(lambda: worker_a.stopping, "the drain to begin", within=30)
    late = (await lm.enqueue_run(dep, {"kind": "late"})).run_id  # must not be claimed by A
    release_quick.set()  # the quick run finishes inside shutdown_timeout
    await asyncio.wait_for(shutdown, timeout=15)

    row = await _row(pool, quick)
    assert (row["status"], row["output"]) == ("completed", {"kind": "quick", "by": "a"})
    row = await _row(pool, slow)
    assert row["status"] == "pending"
    assert row["attempts"] == 0  # the interrupted attempt is given back
    assert (row["lease_worker_id"], row["lease_expires_at"], row["error"]) == (None, None, None)
    [checkpoint] = await _checkpoints(pool, slow)
    assert json.loads(checkpoint["data"]) == {"step": 1}
    assert len(cancelled_at) == 1
    print(f"\nshutdown: slow handler cancelled {cancelled_at[0] - shutdown_at:.2f} s after the "
          f"drain began (shutdown_timeout {drain:g} s)")
    assert cancelled_at[0] - shutdown_at >= drain - 0.1  # it had its shutdown_timeout to finish
    row = await _row(pool, late)
    assert (row["status"], row["lease_generation"]) == ("pending", 0)

    # Another worker finishes the handed-back run from its checkpoint.
    await spawn_worker(dep, handler, worker_id="drain-b")
    row = await _wait_status(pool, slow, "completed")
    assert row["output"] == {"kind": "slow", "by": "b", "from": {"step": 1}}
    assert row["attempts"] == 1
    await _wait_status(pool, late, "completed")
    [ctx] = [c for c in resumed if c.run_id == slow]
    assert ctx.recovery_checkpoint_id == checkpoint["checkpoint_id"]


async def test_interrupt_stops_the_handler_and_leaves_the_run_recoverable(pool, spawn_worker):
    dep = unique_deployment("life")
    running = asyncio.Event()
    cancelled: list[bool] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        running.set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            cancelled.append(ctx.cancel_requested)
            raise
        return {}

    lost = metric("zeroth_lease_lost_total", dep)
    worker = await spawn_worker(dep, handler)
    run = await LeaseManager(pool).enqueue_run(dep)
    await asyncio.wait_for(running.wait(), timeout=10)
    before = await _row(pool, run.run_id)

    await asyncio.wait_for(worker.interrupt_active_run(run.run_id), timeout=10)
    assert cancelled == [False]  # stopped, and not as a cancel
    assert worker.active_run_ids == []
    row = await _row(pool, run.run_id)
    assert row["status"] == "running"  # persisted status unchanged
    assert (row["lease_worker_id"], row["lease_generation"]) == (
        worker.worker_id, before["lease_generation"])
    assert row["lease_expired"]  # expired in place: recoverable at once
    assert (row["error"], row["attempts"]) == (None, 1)
    assert metric("zeroth_lease_lost_total", dep) == lost

    rescuer = LeaseManager(pool, lease_duration_seconds=30)
    taken = await rescuer.claim_orphaned_result(dep, "rescuer")
    assert taken.run_ids == (run.run_id,)
    generation = taken.generations[run.run_id]
    assert generation == before["lease_generation"] + 1
    assert await rescuer.complete_run(run.run_id, "rescuer", generation=generation,
                                      output={"rescued": True})


@pytest.mark.parametrize("path", ["notify", "renewal"])
async def test_cancel_request_from_another_connection_reaches_the_handler(
        pool, spawn_worker, connect, path):
    dep = unique_deployment("life")
    running = asyncio.Event()
    seen: list[tuple[str, bool]] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        running.set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            seen.append(("cancelled", ctx.cancel_requested))
            raise
        return {}

    if path == "notify":
        # Renewals every 200 s: a cancel seen before that (the wait below fails after 30 s) is
        # the zeroth_control NOTIFY's.
        worker = await spawn_worker(dep, handler, lease_duration=600.0)
    else:
        # No LISTEN connection: the renewal (every 2 s) reports cancel_requested. A lease of a
        # few seconds, so that a renewal held up on a loaded machine does not lose it.
        worker = await spawn_worker(dep, handler, dsn=None, lease_duration=6.0,
                                    poll_interval=0.05)
    run = await LeaseManager(pool).enqueue_run(dep)
    await asyncio.wait_for(running.wait(), timeout=10)

    operator = await connect()
    requested_at = time.monotonic()
    outcome = await LeaseManager(operator).request_cancel(run.run_id)
    assert outcome == CancelOutcome.CANCEL_REQUESTED
    row = await _wait_status(pool, run.run_id, "cancelled", within=30)
    latency = time.monotonic() - requested_at
    print(f"\ncancel via {path}: run cancelled {latency * 1000:.0f} ms after the request")
    assert seen == [("cancelled", True)]
    assert (row["lease_worker_id"], row["error"], row["output"]) == (None, None, None)
    assert row["finished_at"] is not None
    # The test may see the commit before the worker has read cancel_run's answer.
    await wait_until(lambda: worker.active_run_ids == [], "the slot to be freed", within=30)


async def test_one_claim_pass_takes_a_full_batch(pool, spawn_worker):
    dep = unique_deployment("life")
    active: set[UUID] = set()
    all_in = asyncio.Event()
    release = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        active.add(ctx.run_id)
        if len(active) == 8:
            all_in.set()
        await release.wait()
        return {"ok": True}

    runs = await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"i": i}} for i in range(8)])
    worker = await spawn_worker(dep, handler, max_concurrency=8, start=False)
    batches: list[int] = []
    real = worker.lease_manager.claim_and_start

    async def counting(*args: Any, **kwargs: Any) -> Any:
        result = await real(*args, **kwargs)
        batches.append(len(result.runs))
        return result

    worker.lease_manager.claim_and_start = counting  # type: ignore[method-assign]
    await worker.start()
    await asyncio.wait_for(all_in.wait(), timeout=10)

    rows = await pool.fetch(
        """SELECT r.status::text AS status, r.lease_acquired_at, r.lease_worker_id
             FROM zeroth.runs r WHERE r.run_id = ANY($1::uuid[])""", [r.run_id for r in runs])
    assert {row["status"] for row in rows} == {"running"}
    assert {row["lease_worker_id"] for row in rows} == {worker.worker_id}
    acquired = {row["lease_acquired_at"] for row in rows}
    assert len(acquired) == 1, f"claimed at {len(acquired)} different instants"  # one call
    assert batches[0] == 8
    release.set()
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 8 FROM zeroth.runs r WHERE r.deployment_ref = $1 "
        "AND r.status = 'completed'", dep), "the batch to complete", within=10)


async def test_local_max_concurrency_is_never_exceeded(pool, spawn_worker):
    dep = unique_deployment("life")
    now_running = 0
    peak = 0

    async def handler(ctx: RunContext) -> dict[str, Any]:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        try:
            await asyncio.sleep(0.05)
        finally:
            now_running -= 1
        return {"ok": True}

    await spawn_worker(dep, handler, max_concurrency=3, poll_interval=0.05)
    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"i": i}} for i in range(12)])
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 12 FROM zeroth.runs r WHERE r.deployment_ref = $1 "
        "AND r.status = 'completed'", dep), "all 12 runs to complete", within=15)
    print(f"\nlocal cap 3: peak of {peak} handlers at once")
    assert peak == 3


async def test_orphan_recovered_with_a_pending_cancel_request_ends_cancelled(pool, spawn_worker):
    """The owner died after a cancel was requested: whoever recovers the run carries the cancel
    out (it does not run the handler for it, leak the slot, or leave the run to be re-recovered)."""
    dep = unique_deployment("life")
    dead = LeaseManager(pool, lease_duration_seconds=30)
    run = (await dead.enqueue_run(dep)).run_id
    [claimed] = (await dead.claim_pending_result(dep, "crashed-worker")).runs
    generation = claimed.lease_generation
    assert await dead.start_run(run, "crashed-worker", generation=generation)
    assert await dead.request_cancel(run) == CancelOutcome.CANCEL_REQUESTED  # owner still live
    assert await dead.release_lease(run, "crashed-worker", generation=generation)  # then dies

    calls: list[bool] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        calls.append(ctx.cancel_requested)
        await asyncio.sleep(FOREVER)
        return {}

    worker = await spawn_worker(dep, handler, max_concurrency=1)  # sweeps for orphans on start
    row = await _wait_status(pool, run, "cancelled", within=30)
    assert row["lease_worker_id"] is None
    assert row["lease_generation"] == generation + 1  # cancelled by the recovering worker
    assert calls in ([], [True])  # the handler, if it ran at all, saw the cancel
    await wait_until(lambda: worker.active_run_ids == [], "the slot to be freed", within=30)

    # The slot is really free: the only slot takes the next run.
    nxt = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await wait_until(lambda: pool.fetchval(
        "SELECT r.status = 'running' FROM zeroth.runs r WHERE r.run_id = $1", nxt),
        "the next run to start", within=30)


class CompletionSpy:
    """Records the batch size of every completion call the worker makes (settle_runs, or
    complete_and_claim when the completions carry the next claim); can fail the first
    ``failures`` calls with a transient error before they reach the database."""

    def __init__(self, worker: RunWorker, *, failures: int = 0) -> None:
        self.sizes: list[int] = []
        self.failures = failures
        lm = worker.lease_manager
        self.real, self.real_along = lm.settle_runs, lm.complete_and_claim
        lm.settle_runs = self._complete  # type: ignore[method-assign]
        lm.complete_and_claim = self._complete_and_claim  # type: ignore[method-assign]

    def _count(self, completions: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionLostError("injected: connection lost before the call was sent")
        self.sizes.append(len(completions))

    async def _complete(self, worker_id: str, completions: Any, **kwargs: Any) -> Any:
        self._count(completions)
        return await self.real(worker_id, completions, **kwargs)

    async def _complete_and_claim(self, deployment_ref: str, worker_id: str, completions: Any,
                                  **kwargs: Any) -> Any:
        self._count(completions)
        return await self.real_along(deployment_ref, worker_id, completions, **kwargs)


async def _completed(pool: asyncpg.Pool, dep: str) -> int:
    return await pool.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1 AND r.status = 'completed'",
        dep)


async def test_runs_finishing_together_are_completed_by_one_call(pool, spawn_worker):
    dep = unique_deployment("life")
    release = asyncio.Event()
    arrived = 0

    async def handler(ctx: RunContext) -> dict[str, Any]:
        nonlocal arrived
        arrived += 1
        await release.wait()
        return {"n": ctx.payload["n"]}

    runs = await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(16)])
    worker = await spawn_worker(dep, handler, max_concurrency=16, start=False)
    spy = CompletionSpy(worker)
    await worker.start()
    await wait_until(lambda: arrived == 16, "every handler to start", within=10)
    release.set()

    await wait_until(lambda: _completed(pool, dep), "the runs to complete", within=10)
    await wait_until(lambda: worker.active_run_ids == [], "the slots to free", within=10)
    assert await _completed(pool, dep) == 16
    assert sum(spy.sizes) == 16
    assert spy.sizes == [16]  # released in one turn of the loop: one round trip for all
    outputs = [(await _row(pool, run.run_id))["output"] for run in runs]
    assert outputs == [{"n": n} for n in range(16)]
    assert metric("zeroth_runs_completed_total", dep) == 16


class SettleSpy:
    """Records the outcome kinds of every settle_runs call the worker makes."""

    def __init__(self, worker: RunWorker) -> None:
        self.calls: list[list[str]] = []
        lm = worker.lease_manager
        self.real = lm.settle_runs
        lm.settle_runs = self._settle  # type: ignore[method-assign]

    async def _settle(self, worker_id: str, settlements: Any, **kwargs: Any) -> Any:
        self.calls.append(sorted(str(item.kind) for item in settlements))
        return await self.real(worker_id, settlements, **kwargs)


async def test_runs_ending_together_in_mixed_outcomes_are_settled_by_one_call(
        pool, spawn_worker):
    """Completions, retried and final failures of runs that end in the same turn: one
    settle_runs call, each outcome as its own call would have written it."""
    dep = unique_deployment("life")
    release = asyncio.Event()
    arrived = 0

    async def handler(ctx: RunContext) -> dict[str, Any]:
        nonlocal arrived
        arrived += 1
        await release.wait()
        if ctx.payload["do"] == "retry":
            raise ValueError("again")
        if ctx.payload["do"] == "fail":
            raise NonRetryableError("never")
        return {"n": ctx.payload["n"]}

    plan = ["ok", "retry", "ok", "fail", "ok", "retry"]
    runs = await LeaseManager(pool).enqueue_runs(
        dep, [{"payload": {"n": n, "do": do}, "max_attempts": 3} for n, do in enumerate(plan)])
    # A local deployment limit keeps completions off complete_and_claim: settle_runs only.
    worker = await spawn_worker(dep, handler, max_concurrency=len(plan), start=False,
                                deployment_concurrency={dep: len(plan)},
                                retries={dep: RetryPolicy(base_seconds=60, max_seconds=60)})
    spy = SettleSpy(worker)
    await worker.start()
    await wait_until(lambda: arrived == len(plan), "every handler to start", within=10)
    release.set()
    await wait_until(lambda: worker.active_run_ids == [], "every run to settle", within=10)
    assert spy.calls == [sorted(["complete"] * 3 + ["retry"] * 2 + ["fail"])]
    statuses = [(await _row(pool, run.run_id))["status"] for run in runs]
    assert statuses == ["completed", "pending", "completed", "failed", "completed", "pending"]
    assert metric("zeroth_runs_completed_total", dep) == 3
    assert metric("zeroth_runs_failed_total", dep, outcome="retried") == 2
    assert metric("zeroth_runs_failed_total", dep, outcome="failed") == 1


async def test_a_completion_that_cannot_be_sent_is_retried(pool, spawn_worker):
    dep = unique_deployment("life")

    async def handler(ctx: RunContext) -> str:
        return "done"

    run = await LeaseManager(pool).enqueue_run(dep)
    worker = await spawn_worker(dep, handler, start=False)
    spy = CompletionSpy(worker, failures=2)
    await worker.start()

    await wait_until(lambda: _completed(pool, dep), "the run to complete", within=10)
    assert (spy.failures, spy.sizes) == (0, [1])
    assert (await _row(pool, run.run_id))["output"] == "done"


async def test_a_completion_refused_by_the_fence_counts_a_lost_lease(pool, spawn_worker):
    dep = unique_deployment("life")
    entered = asyncio.Event()
    release = asyncio.Event()

    async def handler(ctx: RunContext) -> str:
        entered.set()
        await release.wait()
        return "late"

    run = await LeaseManager(pool).enqueue_run(dep)
    worker = await spawn_worker(dep, handler)
    await asyncio.wait_for(entered.wait(), timeout=10)
    # An operator takes the run away (the lease is dropped): the worker's completion must lose.
    assert await pool.fetchval("SELECT zeroth.clear_lease(run_id => $1)", run.run_id)
    release.set()

    await wait_until(lambda: worker.active_run_ids == [], "the handler to settle", within=10)
    row = await _row(pool, run.run_id)
    assert (row["status"], row["output"]) == ("running", None)  # nothing of the late write
    assert metric("zeroth_lease_fencing_rejected_total", dep) == 1


async def test_a_fleet_slot_given_back_wakes_the_claim_loop_without_a_notify(pool, spawn_worker):
    """With the fleet limit equal to the local one, a claim made while completions are in flight
    finds every fleet slot taken; the answer of the completion must start the next claim (no
    NOTIFY listener here, and the poll interval is an hour)."""
    dep = unique_deployment("life")
    handled = 0

    async def handler(ctx: RunContext) -> None:
        nonlocal handled
        handled += 1

    await LeaseManager(pool).enqueue_runs(dep, [{} for _ in range(40)], tenant_id="t-fleet")
    await spawn_worker(dep, handler, dsn=None, tenant_id="t-fleet", max_concurrency=2,
                       fleet_max_concurrency=2, poll_interval=FOREVER)

    await wait_until(lambda: handled == 40, "every run to be handled", within=20)
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 40 FROM zeroth.runs r WHERE r.deployment_ref = $1 "
        "AND r.status = 'completed'", dep), "every run to complete", within=20)
