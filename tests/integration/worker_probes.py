"""What the in-process RunWorker tests share: spawn_worker (a RunWorker in the test's event loop,
drained at teardown), a run as stored, the worker's error counters, a spy on completions.

Each test uses its own deployment name, so the process-wide prometheus counters can be read per
test. Instrumentation wraps LeaseManager methods and always calls the real ones."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import wait_until
from prometheus_client import REGISTRY

from zeroth_pg.worker import RunContext, RunWorker

FOREVER = 3600.0
LEASE = 1.5  # short leases: renewal every 0.5 s, one second of slack for a loaded machine


async def stored_run(pool: asyncpg.Pool, run_id: UUID) -> dict[str, Any]:
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


async def wait_for_status(pool: asyncpg.Pool, run_id: UUID, status: str, *,
                          within: float = 10.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        row = await stored_run(pool, run_id)
        return row if row["status"] == status else None

    return await wait_until(check, f"run {run_id} to be {status}", within=within)  # type: ignore[no-any-return]


async def count_runs(pool: asyncpg.Pool, dep: str, status: str) -> int:
    return await pool.fetchval(  # type: ignore[no-any-return]
        "SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1 AND r.status::text = $2",
        dep, status)


def all_completed(pool: asyncpg.Pool, dep: str, total: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await count_runs(pool, dep, "completed") == total

    return check


def worker_errors(dep: str, kind: str) -> float:
    """zeroth_worker_errors_total for one deployment and kind (0 before its first increment)."""
    return REGISTRY.get_sample_value(
        "zeroth_worker_errors_total", {"deployment": dep, "kind": kind}) or 0.0


ERROR_KINDS = ("claim", "sweep", "settle", "completion_batch", "completion_refused",
               "completion_lost", "settle_retry", "claim_loop", "renew_loop", "complete_loop",
               "depth_loop")


def all_worker_errors(dep: str) -> dict[str, float]:
    return {kind: worker_errors(dep, kind) for kind in ERROR_KINDS}


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
    """Records the run ids of every completion call the worker makes (the completions of a
    settle_runs call, or complete_and_claim when the completions carry the next claim), then
    makes the real call."""

    def __init__(self, worker: RunWorker) -> None:
        self.batches: list[list[UUID]] = []
        lm = worker.lease_manager
        self.real, self.real_along = lm.settle_runs, lm.complete_and_claim
        lm.settle_runs = self._complete  # type: ignore[method-assign]
        lm.complete_and_claim = self._complete_and_claim  # type: ignore[method-assign]

    async def _complete(self, worker_id: str, settlements: Any, **kwargs: Any) -> Any:
        completions = [item.run_id for item in settlements if item.kind == "complete"]
        if completions:
            self.batches.append(completions)
        return await self.real(worker_id, settlements, **kwargs)

    async def _complete_and_claim(self, deployment_ref: str, worker_id: str, completions: Any,
                                  **kwargs: Any) -> Any:
        self.batches.append([item[0] for item in completions])
        return await self.real_along(deployment_ref, worker_id, completions, **kwargs)
