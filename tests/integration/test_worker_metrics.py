"""What a worker counts, as an on-call alerts on it (issue 31 item 7): a handler's exceptions
(zeroth_handler_errors), the failures the database recorded by outcome (zeroth_runs_failed),
crashes of the worker machinery — a run whose worker died, as the sweep that recovers it sees
it (zeroth_worker_crashes{kind="orphan"}) — and lost leases (zeroth_lease_lost), each apart;
every label bounded whatever a handler raises; no fleet-wide queue depth from every worker.

In process, against a real database; each test has its own deployment, so the process-wide
counters are read per test."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from helpers import metric, unique_deployment, wait_until
from prometheus_client import REGISTRY

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import NonRetryableError
from zeroth_pg.worker import RunContext, RunWorker

#: The label values a worker may use besides the deployment (metrics.py): fixed sets.
BOUNDED = {"outcome": {"retried", "failed", "dead_lettered"}, "kind": None,
           "reason": {"rate_limit", "concurrency"}, "resource": {"concurrency"}}


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool,
                       database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]],
                    **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("shutdown_timeout", 2.0)
        kwargs.setdefault("retry_base_seconds", 0.01)
        kwargs.setdefault("retry_max_seconds", 0.02)
        worker = RunWorker(pool, deployment, handler, **kwargs)
        workers.append(worker)
        await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


def _series(dep: str) -> list[tuple[str, dict[str, str]]]:
    """Every sample of the default registry labelled with ``dep``."""
    return [(sample.name, dict(sample.labels)) for family in REGISTRY.collect()
            for sample in family.samples if sample.labels.get("deployment") == dep]


def _crashes(dep: str) -> float:
    return sum(metric("zeroth_worker_crashes_total", dep, kind=k) for k in ("loop", "orphan"))


class Odd(BaseException):
    """Not an Exception, with a name of its own and a message of megabytes."""

    def __str__(self) -> str:
        return "\u0000{weird} " * 300_000


async def test_handler_errors_failures_crashes_and_lost_leases_are_counted_apart(
        pool, spawn_worker):
    dep = unique_deployment("metrics")
    calls: list[int] = []

    async def handler(ctx: RunContext) -> Any:
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise Odd()
        raise RuntimeError("x" * 5_000_000)

    before = {"errors": metric("zeroth_handler_errors_total", dep),
              "crashes": _crashes(dep), "lost": metric("zeroth_lease_lost_total", dep)}
    await spawn_worker(dep, handler)
    run = (await LeaseManager(pool).enqueue_run(dep, max_attempts=2)).run_id
    await wait_until(lambda: metric("zeroth_runs_failed_total", dep, outcome="dead_lettered"),
                     "the dead letter to be counted", within=20)

    assert calls == [1, 2]
    assert await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                               run) == "failed"
    assert metric("zeroth_handler_errors_total", dep) == before["errors"] + 2
    assert metric("zeroth_runs_failed_total", dep, outcome="retried") == 1
    assert metric("zeroth_runs_failed_total", dep, outcome="dead_lettered") == 1
    assert metric("zeroth_runs_failed_total", dep, outcome="failed") == 0
    # A handler's exception is not a crash of the worker, nor a lost lease.
    assert _crashes(dep) == before["crashes"]
    assert metric("zeroth_lease_lost_total", dep) == before["lost"]
    # Nothing the handler raised became a label: a fixed vocabulary, short values.
    series = _series(dep)
    assert series
    for name, labels in series:
        for key, value in labels.items():
            assert len(value) <= 64, (name, key)
            if key in ("outcome", "reason", "resource"):
                assert value in BOUNDED[key], (name, key, value)
        assert set(labels) <= {"deployment", "outcome", "kind", "reason", "resource", "le"}, name


async def test_a_non_retryable_error_counts_as_failed(pool, spawn_worker):
    dep = unique_deployment("metrics")

    async def handler(ctx: RunContext) -> Any:
        raise NonRetryableError("the payload can never work")

    await spawn_worker(dep, handler)
    await LeaseManager(pool).enqueue_run(dep, max_attempts=5)
    await wait_until(lambda: metric("zeroth_runs_failed_total", dep, outcome="failed"),
                     "the failure to be counted", within=20)
    assert metric("zeroth_runs_failed_total", dep, outcome="retried") == 0
    assert metric("zeroth_handler_errors_total", dep) == 1


async def test_a_run_whose_worker_died_is_a_crash_seen_by_the_sweep_that_recovers_it(
        pool, spawn_worker):
    dep = unique_deployment("metrics")
    # A worker claims the run and dies: nobody renews, the lease ends (cleared here, as an
    # expiry would, without waiting for it).
    dead = LeaseManager(pool, lease_duration_seconds=60)
    run = (await dead.enqueue_run(dep)).run_id
    claimed = await dead.claim_and_start(dep, "dead-worker")
    assert claimed.run_id == run
    assert await LeaseManager(pool).clear_lease(run)

    async def handler(ctx: RunContext) -> Any:
        return {"recovered": ctx.recovered}

    before = _crashes(dep)
    await spawn_worker(dep, handler, orphan_sweep_interval=0.1)  # sweeps on start
    await wait_until(lambda: metric("zeroth_worker_crashes_total", dep, kind="orphan"),
                     "the orphan to be counted", within=20)
    assert _crashes(dep) == before + 1
    assert metric("zeroth_handler_errors_total", dep) == 0

    async def completed() -> bool:
        return await pool.fetchval(
            "SELECT status::text = 'completed' FROM zeroth.runs WHERE run_id = $1", run)

    await wait_until(completed, "the recovered run to complete", within=20)


async def test_workers_do_not_report_the_fleet_queue_depth_unless_asked(pool, spawn_worker):
    dep, asked = unique_deployment("metrics"), unique_deployment("metrics")

    async def handler(ctx: RunContext) -> Any:
        return None

    lm = LeaseManager(pool)
    later = datetime.now(UTC) + timedelta(hours=1)
    for name in (dep, asked):
        await lm.enqueue_run(name, run_after=later)  # pending, not due: stays there
    await spawn_worker(dep, handler)
    await spawn_worker(asked, handler, queue_depth_interval=0.05)
    await wait_until(lambda: REGISTRY.get_sample_value("zeroth_queue_depth",
                                                       {"deployment": asked}) == 1.0,
                     "the opted-in worker's sample", within=20)
    assert REGISTRY.get_sample_value("zeroth_queue_depth", {"deployment": dep}) is None
