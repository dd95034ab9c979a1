"""Whatever a handler raises is a written failure of its run, never a crash of the worker
(RunWorker in the test's event loop, against a real database): CancelledError of its own (a
retryable failure), an exception whose str() raises, GeneratorExit, a BaseException of its own,
sys.exit() (the worker serves on) and KeyboardInterrupt (the worker serves on where SIGINT is
handled, and drains where SIGINT raises in the loop's thread).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import pytest
import worker_probes
from helpers import metric, unique_deployment, wait_until
from worker_probes import (
    FOREVER,
    all_worker_errors,
    wait_for_status,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


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
    errors = all_worker_errors(dep)
    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await wait_for_status(pool, run, "failed")
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
                     "the dead-letter counter", within=30)
    assert metric("zeroth_lease_lost_total", dep) == lost
    assert all_worker_errors(dep) == errors
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
    """An exception whose __str__ raises, GeneratorExit, or another BaseException is written by
    fail_run, not left for the orphan sweep to recover as a worker death once its lease
    expired."""
    dep = unique_deployment("harden")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        raise raised

    errors = all_worker_errors(dep)
    lost = metric("zeroth_lease_lost_total", dep)
    worker = await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=1)).run_id
    row = await wait_for_status(pool, run, "failed")
    await wait_until(lambda: worker.active_run_ids == [], "the run to settle", within=10)

    assert calls == [1]
    assert (row["attempts"], row["lease_worker_id"]) == (1, None)
    assert row["dead_lettered_at"] is not None  # retryable, out of attempts
    error = row["error"]
    assert (error["type"], error["message"]) == (type(raised).__name__, message)
    assert error["lease_generation"] == 1
    assert "stop_reason" not in error  # written by fail_run, not by an orphan recovery
    assert metric("zeroth_lease_lost_total", dep) == lost
    assert all_worker_errors(dep) == errors
    assert not worker.stopping


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
    row = await wait_for_status(pool, exiting, "failed")
    error = row["error"]
    assert error["type"] == "RuntimeError"
    assert "SystemExit (exit code 3)" in error["message"]
    assert "SystemExit: 3" in error["traceback"]
    assert not worker.stopping

    release.set()
    assert (await wait_for_status(pool, innocent, "completed"))["output"] == {"ok": 1}
    later = (await lm.enqueue_run(dep, {"n": 2})).run_id  # still claiming
    assert (await wait_for_status(pool, later, "completed"))["output"] == {"ok": 2}
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
        error = (await wait_for_status(pool, run, "failed"))["error"]
        assert error["type"] == "RuntimeError"
        assert "KeyboardInterrupt" in error["message"]
        if sigint_raises:
            await wait_until(lambda: worker.stopping, "the worker to drain by itself",
                             within=10)
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)  # its end
        else:
            later = (await LeaseManager(pool).enqueue_run(dep)).run_id
            assert (await wait_for_status(pool, later, "completed"))["output"] == {"ok": True}
            assert not worker.stopping
    finally:
        signal.signal(signal.SIGINT, previous)
