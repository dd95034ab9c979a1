"""A handler's output whose own code raises while the worker encodes it: a dict subclass whose
``items()`` (what json.dumps calls on a mapping that is not exactly a dict) raises SystemExit,
KeyboardInterrupt, a BaseException subclass of its own or an ordinary exception (once recorded
as the worker's own error, WorkerError). The attempt gets a written, bounded
failure like a handler that raised the same thing, and the worker goes on with the other runs:
such an exception escaped the run's task, where SystemExit ended the event loop (every run of
the worker left to its lease) and any other one left its run to its lease."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import handler_exit
from zeroth_pg.worker import RunContext, RunWorker


class OutputAbort(BaseException):
    """A BaseException subclass of an application's own."""


def _poisoned(raised: BaseException) -> dict[str, Any]:
    class Poisoned(dict[str, Any]):
        def items(self) -> Any:  # what json.dumps calls on a dict subclass
            raise raised

    return Poisoned(a=1)


@pytest.fixture
async def worker_for(pool: asyncpg.Pool) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]]) -> RunWorker:
        worker = RunWorker(pool, deployment, handler, poll_interval=0.05, lease_duration=30.0,
                           orphan_sweep_interval=60.0, shutdown_timeout=2.0)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            with contextlib.suppress(BaseException):  # the worker may be broken: the test says
                await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


async def _settled(pool: asyncpg.Pool, run_id: UUID) -> dict[str, Any] | None:
    row = await pool.fetchrow("SELECT r.status::text AS status, r.error::text AS error,"
                              " r.attempts, r.lease_worker_id"
                              " FROM zeroth.runs r WHERE r.run_id = $1", run_id)
    if row is None or row["status"] not in ("completed", "failed"):
        return None
    settled = dict(row)
    settled["error"] = None if row["error"] is None else json.loads(row["error"])
    return settled


@pytest.mark.parametrize("raised", [SystemExit(3), OutputAbort("no output for you"),
                                    GeneratorExit("closed"), RuntimeError("items() failed")],
                         ids=["system-exit", "own-base-exception", "generator-exit",
                              "exception"])
async def test_an_output_whose_encoding_raises_fails_only_its_run_as_the_handler_would(
        pool: asyncpg.Pool, worker_for: Callable[..., Awaitable[RunWorker]],
        raised: BaseException) -> None:
    dep = unique_deployment("oddout")

    async def handler(ctx: RunContext) -> Any:
        return _poisoned(raised) if ctx.payload == {"poison": True} else {"ok": True}

    worker = await worker_for(dep, handler)
    lm = LeaseManager(pool)
    bad = (await lm.enqueue_run(dep, payload={"poison": True}, max_attempts=1)).run_id
    good = (await lm.enqueue_run(dep, payload={"poison": False})).run_id

    bad_row = await wait_until(lambda: _settled(pool, bad), "the poisoned run to settle",
                               within=20)
    good_row = await wait_until(lambda: _settled(pool, good), "the other run to settle",
                                within=20)
    # A failure written by fail_run for this attempt, not a lease left to expire.
    assert (bad_row["status"], bad_row["attempts"], bad_row["lease_worker_id"]) == (
        "failed", 1, None)
    error = bad_row["error"]
    # What a handler that raised it gets (SystemExit: a RuntimeError naming it, handler_exit).
    assert error["type"] == type(handler_exit(raised)).__name__
    assert type(raised).__name__ in f"{error['type']} {error['message']}"
    assert error["lease_generation"] == 1
    assert "stop_reason" not in error
    assert good_row["status"] == "completed"
    assert not worker.stopping
    # The worker is still serving: one more run completes.
    again = (await lm.enqueue_run(dep, payload={"poison": False})).run_id
    assert (await wait_until(lambda: _settled(pool, again), "a later run", within=20)
            )["status"] == "completed"
