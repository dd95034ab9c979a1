"""RunWorker under odd values, stalls, crashed loops and forged notifications, in process,
against a real database (the worker runs in the test's event loop).

* an output jsonb cannot hold (U+0000, a lone surrogate) fails that run only, never the runs
  completed with it in the same batch; an exception message holding such characters still fails
  its run, with a sanitised error document; a handler that raises CancelledError itself gets a
  retryable failure;
* a worker whose event loop stalled past the lease re-claims its own orphan, and the old
  generation's cleanup leaves the new generation's lease alone;
* the background loops are supervised: a crashed renewal loop is restarted, a failing orphan
  sweep does not stop claiming;
* a renewal refused because it raced the run's own completion is neither logged nor counted as a
  lost lease;
* a forged zeroth_control notification only makes the worker ask the database, which does not
  cancel; a real cancel request arrives through the early renewal it triggers.

Each test uses its own deployment name, so the process-wide prometheus counters can be read per
test. Instrumentation wraps LeaseManager methods and always calls the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from helpers import metric, unique_deployment, wait_until
from prometheus_client import REGISTRY

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker

FOREVER = 3600.0
LEASE = 1.5  # short leases: renewal every 0.5 s, one second of slack for a loaded machine


async def _row(pool: asyncpg.Pool, run_id: UUID) -> dict[str, Any]:
    row = await pool.fetchrow(
        """SELECT r.*, r.status::text AS status, r.output::text AS output_json,
                  r.error::text AS error_json
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
    assert row is not None, f"no run {run_id}"
    out = dict(row)
    for column in ("output", "error"):
        text = out.pop(f"{column}_json")
        out[column] = None if text is None else json.loads(text)
    return out


async def _wait_status(pool: asyncpg.Pool, run_id: UUID, status: str, *,
                       within: float = 10.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        row = await _row(pool, run_id)
        return row if row["status"] == status else None

    return await wait_until(check, f"run {run_id} to be {status}", within=within)  # type: ignore[no-any-return]


async def _count(pool: asyncpg.Pool, dep: str, status: str) -> int:
    return await pool.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1 AND r.status::text = $2",
        dep, status)


def _all_completed(pool: asyncpg.Pool, dep: str, total: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await _count(pool, dep, "completed") == total

    return check


def _errors(dep: str, kind: str) -> float:
    """zeroth_worker_errors_total for one deployment and kind (0 before its first increment)."""
    return REGISTRY.get_sample_value(
        "zeroth_worker_errors_total", {"deployment": dep, "kind": kind}) or 0.0


#: Every kind the worker counts in zeroth_worker_errors (worker.py: _worker_error).
ERROR_KINDS = ("claim", "sweep", "settle", "completion_batch", "completion_refused",
               "completion_lost", "claim_loop", "renew_loop", "complete_loop", "depth_loop")


def _all_errors(dep: str) -> dict[str, float]:
    return {kind: _errors(dep, kind) for kind in ERROR_KINDS}


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool,
                       database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    """Create a RunWorker in this loop (started unless ``start=False``, so a test can wrap its
    methods first); every worker is drained at teardown."""
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]],
                    *, start: bool = True, **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("lease_duration", 30.0)
        kwargs.setdefault("shutdown_timeout", 2.0)
        kwargs.setdefault("orphan_sweep_interval", 60.0)
        worker = RunWorker(pool, deployment, handler, **kwargs)
        workers.append(worker)
        if start:
            await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


class CompletionSpy:
    """Records the run ids of every completion call the worker makes (complete_runs, or
    complete_and_claim when the completions carry the next claim), then makes the real call."""

    def __init__(self, worker: RunWorker) -> None:
        self.batches: list[list[UUID]] = []
        lm = worker.lease_manager
        self.real, self.real_along = lm.complete_runs, lm.complete_and_claim
        lm.complete_runs = self._complete  # type: ignore[method-assign]
        lm.complete_and_claim = self._complete_and_claim  # type: ignore[method-assign]

    async def _complete(self, worker_id: str, completions: Any, **kwargs: Any) -> Any:
        self.batches.append([item[0] for item in completions])
        return await self.real(worker_id, completions, **kwargs)

    async def _complete_and_claim(self, deployment_ref: str, worker_id: str, completions: Any,
                                  **kwargs: Any) -> Any:
        self.batches.append([item[0] for item in completions])
        return await self.real_along(deployment_ref, worker_id, completions, **kwargs)


# -- finding 5: values PostgreSQL cannot store --------------------------------------------------


async def test_an_unstorable_output_fails_its_run_and_not_the_runs_completed_with_it(
        pool, spawn_worker):
    dep = unique_deployment("harden")
    outputs: dict[str, Any] = {
        "nul": {"text": "a\x00b"},
        "surrogate": ["lone \ud800 half"],
        "nul_key": {"k\x00": 1},
    }
    good = [f"good-{n}" for n in range(5)]
    kinds = [*outputs, *good]
    release = asyncio.Event()
    arrived: set[str] = set()

    async def handler(ctx: RunContext) -> Any:
        kind = ctx.payload["kind"]
        arrived.add(kind)
        await release.wait()  # every handler returns in the same turn of the event loop
        return outputs.get(kind, {"kind": kind})

    completed = metric("zeroth_runs_completed_total", dep)
    dead = metric("zeroth_runs_dead_lettered_total", dep)
    errors = _all_errors(dep)
    runs = await LeaseManager(pool).enqueue_runs(
        dep, [{"payload": {"kind": kind}, "max_attempts": 3} for kind in kinds])
    by_kind = dict(zip(kinds, (run.run_id for run in runs), strict=True))
    worker = await spawn_worker(dep, handler, max_concurrency=len(kinds), start=False)
    spy = CompletionSpy(worker)
    await worker.start()
    await wait_until(lambda: arrived == set(kinds), "every handler to start", within=10)
    release.set()

    await wait_until(lambda: worker.active_run_ids == [], "every run to settle", within=10)
    for kind in good:
        row = await _row(pool, by_kind[kind])
        assert (row["status"], row["output"], row["error"]) == ("completed", {"kind": kind}, None)
    # The storable outputs finished together and went out as one complete_runs call.
    assert [sorted(batch) for batch in spy.batches] == [sorted(by_kind[kind] for kind in good)]
    why = {"nul": "U+0000", "surrogate": "a lone UTF-16 surrogate", "nul_key": "U+0000"}
    for kind, character in why.items():
        row = await _row(pool, by_kind[kind])
        assert row["status"] == "failed", kind
        assert (row["attempts"], row["dead_lettered_at"], row["output"]) == (1, None, None), kind
        assert row["error"]["type"] == "ValueError"
        assert row["error"]["message"] == (
            f"PostgreSQL cannot store the output: a string contains {character}")
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = ANY($1::uuid[])",
        list(by_kind.values())) == 0
    assert metric("zeroth_runs_completed_total", dep) == completed + len(good)
    assert metric("zeroth_runs_dead_lettered_total", dep) == dead
    assert _all_errors(dep) == errors  # no batch was refused, no worker error


@pytest.mark.parametrize(("max_attempts", "status", "outcome"), [
    (1, "failed", "dead-lettered"), (2, "pending", "retry scheduled")])
async def test_an_exception_message_jsonb_cannot_hold_still_fails_the_run_sanitised(
        pool, spawn_worker, max_attempts, status, outcome):
    dep = unique_deployment("harden")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        raise RuntimeError("nul \x00 and lone \ud800 in the message")

    handler_errors = metric("zeroth_handler_errors_total", dep)
    errors = _all_errors(dep)
    # The retry, if any, is an hour away: the run stays as the first failure left it.
    worker = await spawn_worker(dep, handler, retry_base_seconds=FOREVER,
                                retry_max_seconds=FOREVER)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=max_attempts)).run_id

    async def failed_once() -> dict[str, Any] | None:  # a fresh run is pending too
        row = await _row(pool, run)
        return row if row["error"] is not None else None

    row = await wait_until(failed_once, "the first failure to be written", within=10)
    await wait_until(lambda: worker.active_run_ids == [], "the run to settle", within=10)
    assert row["status"] == status

    print(f"\nmax_attempts {max_attempts}: {outcome}")
    assert calls == [1]
    assert (row["attempts"], row["lease_worker_id"], row["output"]) == (1, None, None)
    assert (row["dead_lettered_at"] is not None) is (max_attempts == 1)
    error = row["error"]
    assert error["type"] == "RuntimeError"  # the handler's error, not the WorkerError fallback
    assert error["message"] == "nul \ufffd and lone \ufffd in the message"
    assert "nul \ufffd and lone \ufffd in the message" in error["traceback"]
    assert error["lease_generation"] == 1
    assert metric("zeroth_handler_errors_total", dep) == handler_errors + 1
    assert _all_errors(dep) == errors


async def test_a_handler_that_raises_cancelled_error_itself_gets_a_retryable_failure(
        pool, spawn_worker):
    dep = unique_deployment("harden")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        inner = asyncio.create_task(asyncio.sleep(FOREVER))
        inner.cancel()
        await inner  # the inner task's CancelledError escapes: the worker cancelled nothing
        return {"unreachable": True}

    handler_errors = metric("zeroth_handler_errors_total", dep)
    dead = metric("zeroth_runs_dead_lettered_total", dep)
    lost = metric("zeroth_lease_lost_total", dep)
    errors = _all_errors(dep)
    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await _wait_status(pool, run, "failed")
    await wait_until(lambda: worker.active_run_ids == [], "the run to settle", within=10)

    assert calls == [1]
    # Retryable, and out of attempts: failed and dead-lettered, not dropped, not cancelled.
    assert row["dead_lettered_at"] is not None
    assert (row["attempts"], row["lease_worker_id"], row["output"]) == (1, None, None)
    assert row["error"]["type"] == "CancelledError"
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = $1", run) == 1
    assert metric("zeroth_handler_errors_total", dep) == handler_errors + 1
    await wait_until(lambda: metric("zeroth_runs_dead_lettered_total", dep) == dead + 1,
                     "the dead-letter counter", within=5)
    assert metric("zeroth_lease_lost_total", dep) == lost
    assert _all_errors(dep) == errors
    assert not worker.stopping  # the worker goes on


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no way to print me")


class PluginAbort(BaseException):
    """A BaseException subclass of a handler's own (some libraries define these)."""


@pytest.mark.parametrize(("raised", "message"), [
    (UnprintableError(), "<str() of the exception raised RuntimeError>"),
    (GeneratorExit("closed"), "closed"),
    (PluginAbort("aborted"), "aborted"),
], ids=["str-raises", "generator-exit", "own-base-exception"])
async def test_whatever_a_handler_raises_is_a_written_failure_not_a_crash(
        pool, spawn_worker, raised, message):
    """Red-team finding: an exception whose __str__ raises, GeneratorExit, or another
    BaseException left the run without fail_run (recovered only when its lease expired, as a
    worker death)."""
    dep = unique_deployment("harden")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        raise raised

    errors = _all_errors(dep)
    lost = metric("zeroth_lease_lost_total", dep)
    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await _wait_status(pool, run, "failed")
    await wait_until(lambda: worker.active_run_ids == [], "the run to settle", within=10)

    assert calls == [1]
    assert (row["attempts"], row["lease_worker_id"]) == (1, None)
    assert row["dead_lettered_at"] is not None  # retryable, out of attempts
    error = row["error"]
    assert (error["type"], error["message"]) == (type(raised).__name__, message)
    assert error["lease_generation"] == 1
    assert "stop_reason" not in error  # written by fail_run, not by an orphan recovery
    assert metric("zeroth_lease_lost_total", dep) == lost
    assert _all_errors(dep) == errors
    assert not worker.stopping


# -- finding 7: a stalled worker re-claims its own orphan ---------------------------------------


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
        row = await _row(pool, run)
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


# -- finding 11g: supervised background loops ---------------------------------------------------


async def test_a_crashed_renewal_loop_is_restarted_and_keeps_renewing(pool, spawn_worker):
    dep = unique_deployment("harden")
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        started.set()
        for _ in range(30):  # 3 leases: without renewals the lease would lapse
            await asyncio.sleep(LEASE / 10)
        return {"done": ctx.attempt}

    worker = await spawn_worker(dep, handler, dsn=None, lease_duration=LEASE,
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
    crashed = _errors(dep, "renew_loop")
    loop_crashes = metric("zeroth_worker_crashes_total", dep, kind="loop")
    lost = metric("zeroth_lease_lost_total", dep)
    await worker.start()
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(started.wait(), timeout=10)
    claimed = (await _row(pool, run))["lease_expires_at"]

    async def renewed() -> bool:
        row = await _row(pool, run)
        return row["status"] != "running" or row["lease_expires_at"] > claimed

    await wait_until(renewed, "a renewal after the crash", within=10)
    row = await _wait_status(pool, run, "completed", within=20)
    assert row["output"] == {"done": 1}
    assert (row["lease_generation"], row["attempts"], row["error"]) == (1, 1, None)
    assert calls == 2  # crashed once, restarted once
    assert _errors(dep, "renew_loop") == crashed + 1
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
    errors = _all_errors(dep)
    await worker.start()
    await wait_until(lambda: sweeps >= 1, "the first (failing) sweep", within=10)

    runs = await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"i": i}} for i in range(6)])
    await wait_until(_all_completed(pool, dep, 6), "every run to complete", within=10)
    await wait_until(lambda: sweeps >= 3, "more sweeps on schedule", within=10)

    assert sorted(handled) == sorted(run.run_id for run in runs)
    after = _all_errors(dep)
    assert after["sweep"] == errors["sweep"] + sweeps  # each failed sweep counted once
    # Nothing else broke: no failed claim pass, no crashed and restarted loop.
    assert {k: v for k, v in after.items() if k != "sweep"} == {
        k: v for k, v in errors.items() if k != "sweep"}


# -- finding 11h: a renewal that raced the run's own completion ---------------------------------


class RaceSpy:
    """Makes every completion race a renewal: complete_runs is answered to the worker only once
    a renewal sent after that completion committed was refused for each completed run and the
    worker has handled that refusal (the renewal loop has sent its next renewal). The renewal
    loop still holds the runs as completing when it reads the refusal."""

    def __init__(self, worker: RunWorker) -> None:
        self.renewals = 0
        self.refused: dict[UUID, list[int]] = {}  # run id -> the renewals that refused it
        self.raced: set[UUID] = set()
        self.renewed = asyncio.Event()  # set whenever a renewal begins
        self.real_renew = worker.lease_manager.renew_leases
        self.real_complete = worker.lease_manager.complete_runs
        self.real_along = worker.lease_manager.complete_and_claim
        worker.lease_manager.renew_leases = self._renew  # type: ignore[method-assign]
        worker.lease_manager.complete_runs = self._complete  # type: ignore[method-assign]
        worker.lease_manager.complete_and_claim = (  # type: ignore[method-assign]
            self._complete_and_claim)

    async def _renew(self, worker_id: str, leases: Any, **kwargs: Any) -> Any:
        self.renewals += 1
        index = self.renewals
        self.renewed.set()
        renewals = await self.real_renew(worker_id, leases, **kwargs)
        for renewal in renewals:
            if not renewal.renewed:
                self.refused.setdefault(renewal.run_id, []).append(index)
        return renewals

    async def _complete_and_claim(self, deployment_ref: str, worker_id: str, completions: Any,
                                  **kwargs: Any) -> Any:
        result = await self.real_along(deployment_ref, worker_id, completions, **kwargs)
        await self._race({row.run_id for row in result.completions if row.completed})
        return result

    async def _complete(self, worker_id: str, completions: Any, **kwargs: Any) -> Any:
        rows = await self.real_complete(worker_id, completions, **kwargs)
        await self._race({row.run_id for row in rows if row.completed})
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

    await wait_until(_all_completed(pool, dep, total), "every run to complete", within=30)
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


# -- finding 2: zeroth_control notifications are hints ------------------------------------------


async def test_forged_control_notifications_do_not_cancel_a_live_run(pool, spawn_worker, connect):
    dep = unique_deployment("harden")
    running = asyncio.Event()
    release = asyncio.Event()
    contexts: list[RunContext] = []

    async def handler(ctx: RunContext) -> Any:
        contexts.append(ctx)
        running.set()
        await release.wait()
        return {"cancel_requested": ctx.cancel_requested}

    # Renewals only every 20 s: a renewal within the test was asked for by a notification.
    worker = await spawn_worker(dep, handler, lease_duration=60.0)
    assert worker.notifier is not None
    await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(running.wait(), timeout=10)
    claimed = (await _row(pool, run))["lease_expires_at"]

    forger = await connect()
    key = await LeaseManager(pool).control_key(worker.worker_id)
    old_style = [{"type": "cancel", "run_id": str(run), "worker_id": worker.worker_id,
                  "lease_generation": 1},
                 {"type": "cancel", "run_id": str(run), "worker_id": worker.worker_id}]
    for payload in old_style:
        await forger.execute("SELECT pg_notify('zeroth_control', $1)", json.dumps(payload))
    for _ in range(5):
        await forger.execute("SELECT pg_notify('zeroth_control', $1)", key)

    async def renewed() -> bool:
        return bool((await _row(pool, run))["lease_expires_at"] > claimed)

    # Delivered in order: once the real key's renewal landed, every forgery has been read.
    await wait_until(renewed, "the renewal a notification asked for", within=10)
    assert worker.active_run_ids == [run]
    [ctx] = contexts
    assert not ctx.cancel_requested
    release.set()

    row = await _wait_status(pool, run, "completed")
    assert row["output"] == {"cancel_requested": False}
    assert (row["cancel_requested_at"], row["error"], row["lease_generation"]) == (None, None, 1)
    assert not ctx.cancel_requested


async def test_a_real_cancel_request_stops_the_handler_through_the_early_renewal(
        pool, spawn_worker, connect):
    dep = unique_deployment("harden")
    running = asyncio.Event()
    stopped: list[bool] = []

    async def handler(ctx: RunContext) -> Any:
        running.set()
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            stopped.append(ctx.cancel_requested)
            raise
        return {"unreachable": True}

    # Renewals only every 20 s: the cancel must come through the renewal the NOTIFY asks for.
    worker = await spawn_worker(dep, handler, lease_duration=60.0)
    run = (await LeaseManager(pool).enqueue_run(dep)).run_id
    await asyncio.wait_for(running.wait(), timeout=10)

    operator = await connect()
    requested_at = time.monotonic()
    assert (await LeaseManager(operator).request_cancel(run)).value == "cancel_requested"
    await wait_until(lambda: stopped, "the handler to see the cancel", within=10)
    print(f"\nreal cancel: the handler stopped {(time.monotonic() - requested_at) * 1000:.0f} ms "
          "after the request (routine renewal every 20 s)")
    assert stopped == [True]
    row = await _wait_status(pool, run, "cancelled")
    assert (row["lease_worker_id"], row["error"], row["output"]) == (None, None, None)
    assert row["finished_at"] is not None
    await wait_until(lambda: worker.active_run_ids == [], "the slot to be freed", within=5)


async def test_a_cancel_of_the_same_run_id_in_another_tenant_stops_nothing_here(
        pool, spawn_worker):
    """Finding 11 (bullet 4): run ids are unique per scope, but the control notification and the
    worker matched a cancel by run id, worker id and generation only. Two workers with the same
    worker id (ids are labels, e.g. a host name) in two tenants each hold a run with the same
    caller-chosen run id at generation 1; a cancel in tenant t-2 stops t-2's run only."""
    dep = unique_deployment("harden")
    run_id = uuid4()
    running = {"t-1": asyncio.Event(), "t-2": asyncio.Event()}
    release = asyncio.Event()
    stopped: set[str] = set()

    def handler_for(tenant: str) -> Callable[[RunContext], Awaitable[Any]]:
        async def handler(ctx: RunContext) -> Any:
            running[tenant].set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                stopped.add(tenant)
                raise
            return {"tenant": tenant}
        return handler

    for tenant in ("t-1", "t-2"):
        worker = await spawn_worker(dep, handler_for(tenant), tenant_id=tenant,
                                    worker_id="host-1", lease_duration=60.0, poll_interval=0.05)
        await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    for tenant in ("t-1", "t-2"):
        await pool.execute(
            "SELECT zeroth.enqueue_run(deployment_ref => $1, tenant_id => $2, run_id => $3)",
            dep, tenant, run_id)
    for event in running.values():
        await asyncio.wait_for(event.wait(), timeout=10)
    assert dict(await pool.fetch(
        "SELECT tenant_id, lease_generation FROM zeroth.runs WHERE run_id = $1", run_id)) == {
        "t-1": 1, "t-2": 1}

    assert await pool.fetchval(
        "SELECT zeroth.request_cancel(run_id => $1, tenant_id => 't-2')",
        run_id) == "cancel_requested"

    async def status_in(tenant: str) -> str:
        return await pool.fetchval(  # type: ignore[no-any-return]
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1 AND tenant_id = $2",
            run_id, tenant)

    async def t2_cancelled() -> bool:
        return await status_in("t-2") == "cancelled"

    await wait_until(t2_cancelled, "t-2's run to be cancelled", within=10)
    # The hint reached both workers (same worker id, same key): give t-1's worker a moment to
    # act on it wrongly before letting its handler finish.
    await asyncio.sleep(0.3)
    release.set()

    async def t1_finished() -> str | None:
        status = await status_in("t-1")
        return status if status not in ("pending", "running") else None

    assert await wait_until(t1_finished, "t-1's run to finish", within=10) == "completed"
    assert stopped == {"t-2"}


# -- red-team pass 7 -------------------------------------------------------------------------


async def test_an_output_larger_than_jsonb_holds_fails_its_run_and_the_next_run_completes(
        pool, spawn_worker, monkeypatch):
    """A 256 MB output was refused by the server (54000), retried as transient for ever while
    renewals kept its lease alive, and every completion after it queued behind. The worker now
    fails it non-retryably before sending (the limit is lowered here so the test stays small; the
    server side of 54000 is covered by the client's error mapping)."""
    from zeroth_pg import _jsonb

    monkeypatch.setattr(_jsonb, "MAX_JSONB_CHARACTERS", 1000)
    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        return {"text": "x" * 2000} if ctx.payload["kind"] == "big" else {"ok": 1}

    lm = LeaseManager(pool)
    big = await lm.enqueue_run(dep, payload={"kind": "big"}, max_attempts=3)
    small = await lm.enqueue_run(dep, payload={"kind": "small"})
    await spawn_worker(dep, handler)

    failed = await _wait_status(pool, big.run_id, "failed")
    assert failed["attempts"] == 1  # not retried
    assert "cannot store the output" in failed["error"]["message"]
    assert (await _wait_status(pool, small.run_id, "completed"))["output"] == {"ok": 1}


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
        await _wait_status(pool, other.run_id, "completed", within=20)

        await asyncio.wait_for(worker.graceful_shutdown(), timeout=20)
    finally:
        release.set()


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
        await _wait_status(pool, busy.run_id, "running")
        ended = await _wait_status(pool, orphan.run_id, "failed", within=20)
        assert ended["error"]["stop_reason"] == "attempts_exhausted"
        assert (await _row(pool, busy.run_id))["status"] == "running"  # still saturated
    finally:
        release.set()


# -- red-team pass 8 -------------------------------------------------------------------------


async def test_a_completion_cancelled_by_the_server_is_retried_not_a_failure(pool, spawn_worker):
    """statement_timeout or pg_cancel_backend cancelled the completion (57014): the worker took
    it for a value the database refuses and failed a successful run for good. It is retried."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    run = await lm.enqueue_run(dep, max_attempts=3)
    started, finish = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        started.set()
        await finish.wait()
        return {"done": True}

    await spawn_worker(dep, handler)
    await asyncio.wait_for(started.wait(), timeout=10)
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        # Someone holds the run's row (an application's cancel in an open transaction), so the
        # completion waits for it; then the server cancels that statement.
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", run.run_id)
        finish.set()

        async def blocked_completion() -> int | None:
            return await pool.fetchval(  # type: ignore[no-any-return]
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) "
                "AND query LIKE '%complete_run%'", holder.get_server_pid())

        pid = await wait_until(blocked_completion, "the completion to wait for the row", within=10)
        assert await pool.fetchval("SELECT pg_cancel_backend($1)", pid)
    finally:
        await tx.rollback()
        await pool.release(holder)
    row = await _wait_status(pool, run.run_id, "completed", within=20)
    assert (row["attempts"], row["output"]) == (1, {"done": True})


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
        await _wait_status(pool, other.run_id, "completed", within=20)
    finally:
        release.set()


# -- red-team pass 9 -------------------------------------------------------------------------


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


async def test_a_held_row_delays_only_its_own_completion_not_its_batch(pool, spawn_worker):
    """complete_runs waits at most 2 s for a row; the batch was retried whole until every run
    in it gave up, so runs nobody held were re-run too. The batch is completed run by run."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    held, free = (await lm.enqueue_run(dep)), (await lm.enqueue_run(dep))
    arrived: set[Any] = set()
    finish = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        arrived.add(ctx.run_id)
        await finish.wait()  # both return in the same turn: one complete_runs batch
        return {"ok": 1}

    await spawn_worker(dep, handler, lease_duration=30.0)
    await wait_until(lambda: len(arrived) == 2, "both handlers", within=10)
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", held.run_id)
        finish.set()
        await _wait_status(pool, free.run_id, "completed", within=20)  # while the row is held
    finally:
        await tx.rollback()
        await pool.release(holder)
    row = await _wait_status(pool, held.run_id, "completed", within=30)
    assert row["attempts"] == 1


async def test_a_completion_retrying_on_a_held_row_does_not_hold_up_later_ones(
        pool, spawn_worker):
    """Red-team pass 10: after the split, the loop waited for the held run's retries, so every
    completion submitted later waited behind it (up to a lease). The split runs retry on their
    own now."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    held, later = (await lm.enqueue_run(dep, payload={"kind": "held"})), None
    started, finish_held, finish_later = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["kind"] == "held":
            started.set()
            await finish_held.wait()
        else:
            await finish_later.wait()
        return {"kind": ctx.payload["kind"]}

    await spawn_worker(dep, handler, lease_duration=30.0)
    await asyncio.wait_for(started.wait(), timeout=10)
    later = await lm.enqueue_run(dep, payload={"kind": "later"})
    await _wait_status(pool, later.run_id, "running")
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", held.run_id)
        finish_held.set()  # its completion meets the held row and retries
        await asyncio.sleep(2.5)  # past complete_runs' 2 s lock_timeout: it is retrying now
        finish_later.set()
        await _wait_status(pool, later.run_id, "completed", within=20)  # row still held
    finally:
        await tx.rollback()
        await pool.release(holder)
    assert (await _wait_status(pool, held.run_id, "completed", within=30))["attempts"] == 1


# -- issue 29, finding 4: a handler's exception is bounded before anything is done with it -------

HUGE = 50 * 2**20  # a 50 MB message (one string shared by the hostile runs)


async def test_a_huge_exception_message_is_stored_and_logged_bounded_beside_innocent_runs(
        pool, spawn_worker, caplog):
    """Two runs raise ``ValueError(f"bad response: {body}")`` with a 50 MB body beside two runs
    that return at once, all claimed together. The innocent runs complete (no lease lost); each
    hostile run fails with an error document within the bound whose message says it was cut;
    no log record of the worker is longer than the bound (the worker logged, regex-scanned and
    JSON-encoded the whole message on the event loop, and stored it)."""
    from zeroth_pg.errors import MAX_ERROR_DOCUMENT_BYTES, MAX_ERROR_TEXT_BYTES

    dep = unique_deployment("harden")
    body = "x" * HUGE

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["hostile"]:
            raise ValueError(f"bad response: {body}")
        return {"i": ctx.payload["i"]}

    lm = LeaseManager(pool)
    runs = await lm.enqueue_runs(dep, [{"payload": {"hostile": i % 2 == 0, "i": i},
                                        "max_attempts": 1} for i in range(4)])
    lost = metric("zeroth_lease_lost_total", dep)
    caplog.set_level(logging.INFO, logger="zeroth_pg")
    await spawn_worker(dep, handler, max_concurrency=8)
    for i, run in enumerate(runs):
        hostile = i % 2 == 0
        row = await _wait_status(pool, run.run_id, "failed" if hostile else "completed",
                                 within=60)
        if not hostile:
            assert row["output"] == {"i": i}
            continue
        size = await pool.fetchval(
            "SELECT octet_length(r.error::text) FROM zeroth.runs r WHERE r.run_id = $1",
            run.run_id)
        assert size <= MAX_ERROR_DOCUMENT_BYTES
        error = row["error"]
        assert error["type"] == "ValueError"
        message = error["message"]
        assert message.startswith("bad response: xxx")
        assert len(message.encode()) <= MAX_ERROR_TEXT_BYTES
        assert message.endswith(" characters]")
        assert "\u2026[truncated " in message
        assert len(error["traceback"].encode()) <= MAX_ERROR_TEXT_BYTES
        assert "ValueError: bad response: xxx" in error["traceback"]
    assert metric("zeroth_lease_lost_total", dep) == lost
    worker_records = [r for r in caplog.records if r.name.startswith("zeroth_pg")]
    failures = [r for r in worker_records if "failed" in r.getMessage()
                and "ValueError" in r.getMessage()]
    assert len(failures) == 2
    assert all("[truncated " in r.getMessage() for r in failures)
    assert max(len(r.getMessage().encode()) for r in worker_records) <= (
        MAX_ERROR_TEXT_BYTES + 1024)


class HugeNameError(Exception):
    pass


HugeNameError.__name__ = "HugeName" + "E" * 2**20


@pytest.mark.parametrize(("make", "field", "chained"), [
    (lambda: ValueError(list(range(2_000_000))), "message", False),
    (lambda: KeyError("k" * 5 * 2**20), "message", False),
    (lambda: ValueError("outer " * 2**20), "message", True),
    (HugeNameError, "type", False),
], ids=["huge-list-argument", "huge-key-error", "huge-chained", "huge-type-name"])
async def test_an_odd_handler_exception_is_stored_within_the_bound(pool, spawn_worker, make,
                                                                   field, chained):
    """An exception whose str() would build megabytes (a list argument, a KeyError's repr),
    one raised while handling another huge one, or one of a class with a megabyte name: its
    run fails with every text of its error document within the bound, the cut one marked."""
    from zeroth_pg.errors import MAX_ERROR_DOCUMENT_BYTES, MAX_ERROR_TEXT_BYTES

    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        exc = make()
        if chained:
            try:
                raise RuntimeError("inner " * 2**20)
            except RuntimeError:
                raise exc  # noqa: B904 - the implicit chain (__context__) is the point
        raise exc

    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await _wait_status(pool, run, "failed")
    error = row["error"]
    assert await pool.fetchval(
        "SELECT octet_length(r.error::text) FROM zeroth.runs r WHERE r.run_id = $1",
        run) <= MAX_ERROR_DOCUMENT_BYTES
    for text in ("type", "message", "traceback"):
        assert len(error[text].encode()) <= MAX_ERROR_TEXT_BYTES, text
    assert "truncated " in error[field] or "..." in error[field]
    if chained:
        assert "During handling of the above exception" in error["traceback"]
    assert not worker.stopping


async def test_a_refused_error_document_still_fails_its_run_at_once(pool, spawn_worker):
    """When the error document itself is refused (a value the database cannot hold, or above
    the database's own bound), the worker writes a minimal one: the run fails now, with what
    refused it, instead of waiting for its lease to expire (the state had moved to settling,
    so the last-resort failure wrote nothing)."""
    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        raise ValueError("boom")

    worker = await spawn_worker(dep, handler, start=False)
    lm = worker.lease_manager
    real_fail_run = lm.fail_run
    documents: list[dict[str, Any]] = []

    async def fail_run(*args: Any, **kwargs: Any) -> Any:
        documents.append(dict(kwargs["error"]))
        if len(documents) == 1:  # the first document holds a value jsonb cannot store
            kwargs["error"] = {**kwargs["error"], "poison": "\x00"}
        return await real_fail_run(*args, **kwargs)

    lm.fail_run = fail_run  # type: ignore[method-assign]
    await worker.start()
    run = (await lm.enqueue_run(dep, max_attempts=1)).run_id
    row = await _wait_status(pool, run, "failed")
    assert (row["attempts"], row["lease_worker_id"]) == (1, None)
    error = row["error"]
    assert (error["type"], error["message"]) == ("ValueError", "boom")
    assert "InvalidArgumentError" in error["refused"]
    assert len(documents) == 2


# -- issue 29, finding 10: sys.exit() in an async handler ---------------------------------------


async def test_sys_exit_in_an_async_handler_fails_its_run_and_the_worker_serves_on(
        pool, spawn_worker):
    """``sys.exit(3)`` in an async handler (argparse or click on bad input does it) while
    another run of the worker is running: that run fails with an error naming SystemExit and
    its code (as a sync handler's does); the other run completes and the worker claims more.
    The SystemExit went through the worker's task into the event loop, which stopped the
    worker with its other runs left running."""
    dep = unique_deployment("harden")
    beside = asyncio.Event()
    release = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload.get("exit"):
            await beside.wait()  # the innocent run is running
            sys.exit(3)
        beside.set()
        await release.wait()
        return {"ok": ctx.payload["n"]}

    lm = LeaseManager(pool)
    innocent = (await lm.enqueue_run(dep, {"n": 1})).run_id
    exiting = (await lm.enqueue_run(dep, {"exit": True}, max_attempts=1)).run_id
    worker = await spawn_worker(dep, handler, max_concurrency=4)
    row = await _wait_status(pool, exiting, "failed")
    error = row["error"]
    assert error["type"] == "RuntimeError"
    assert "SystemExit (exit code 3)" in error["message"]
    assert "SystemExit: 3" in error["traceback"]
    assert not worker.stopping

    release.set()
    assert (await _wait_status(pool, innocent, "completed"))["output"] == {"ok": 1}
    later = (await lm.enqueue_run(dep, {"n": 2})).run_id  # still claiming
    assert (await _wait_status(pool, later, "completed"))["output"] == {"ok": 2}
    assert not worker.stopping


@pytest.mark.parametrize("sigint_raises", [False, True], ids=["sigint-handled", "sigint-raises"])
async def test_keyboard_interrupt_from_an_async_handler_fails_its_run(pool, spawn_worker,
                                                                      sigint_raises):
    """KeyboardInterrupt out of an async handler fails that run (as a sync handler's does),
    never escaping into the event loop. Where SIGINT is handled (run_until_stopped, asyncio.run:
    here pytest's runner) it can only be the handler's own, and the worker serves on; where
    SIGINT raises KeyboardInterrupt in the loop's thread (Python's default handler) it may be
    the operator's Ctrl-C, so the worker drains as it would on SIGINT."""
    dep = unique_deployment("harden")

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload.get("interrupt"):
            raise KeyboardInterrupt
        return {"ok": True}

    previous = signal.getsignal(signal.SIGINT)
    if sigint_raises:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        worker = await spawn_worker(dep, handler)
        run = (await LeaseManager(pool).enqueue_run(dep, {"interrupt": True},
                                                    max_attempts=1)).run_id
        error = (await _wait_status(pool, run, "failed"))["error"]
        assert error["type"] == "RuntimeError"
        assert "KeyboardInterrupt" in error["message"]
        if sigint_raises:
            await wait_until(lambda: worker.stopping, "the worker to drain by itself",
                             within=10)
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)  # its end
        else:
            later = (await LeaseManager(pool).enqueue_run(dep)).run_id
            assert (await _wait_status(pool, later, "completed"))["output"] == {"ok": True}
            assert not worker.stopping
    finally:
        signal.signal(signal.SIGINT, previous)
