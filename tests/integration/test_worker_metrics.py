"""What a worker counts, as an on-call alerts on it (issue 31 item 7): a handler's exceptions
(zeroth_handler_errors), the failures the database recorded by outcome (zeroth_runs_failed),
crashes of the worker machinery — a run whose worker died, as the sweep that recovers it sees
it (zeroth_worker_crashes{kind="orphan"}) — and lost leases (zeroth_lease_lost), each apart;
every label bounded whatever a handler raises; no fleet-wide queue depth from every worker.

In process, against a real database; each test has its own deployment, so the process-wide
counters are read per test."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from fleet_states import samples, value
from helpers import metric, unique_deployment, wait_until
from prometheus_client import REGISTRY
from test_worker_processes import (  # noqa: F401 - workers and events are fixtures used here
    deployment_name,
    events,
    workers,
)
from worker_apps import POISON_EXIT_CODE

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import NonRetryableError
from zeroth_pg.worker import RunContext, RunWorker

#: The label values a worker may use besides the deployment (metrics.py): fixed sets.
BOUNDED = {"outcome": {"retried", "failed", "dead_lettered"},
           "reason": {"rate_limit", "concurrency"}, "resource": {"concurrency"}}


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool,
                       database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    started: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]],
                    **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("poll_interval", 0.05)
        kwargs.setdefault("shutdown_timeout", 2.0)
        kwargs.setdefault("retry_base_seconds", 0.01)
        kwargs.setdefault("retry_max_seconds", 0.02)
        worker = RunWorker(pool, deployment, handler, **kwargs)
        started.append(worker)
        await worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in started:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


def _series(dep: str) -> list[tuple[str, dict[str, str]]]:
    """Every sample of the default registry labelled with ``dep``."""
    return [(sample.name, dict(sample.labels)) for family in REGISTRY.collect()
            for sample in family.samples if sample.labels.get("deployment") == dep]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as page:
        return page.read().decode()  # type: ignore[no-any-return]


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
        for key, label in labels.items():
            assert len(label) <= 64, (name, key)
            if key in ("outcome", "reason", "resource"):
                assert label in BOUNDED[key], (name, key, label)
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


async def test_a_handler_that_kills_its_process_is_a_crash_on_the_worker_that_recovers_it(
        workers: Any, events: asyncpg.Pool) -> None:  # noqa: F811 - the fixtures
    # Worker A's handler calls os._exit: A counts nothing (it is gone). Worker B, started
    # after, recovers the run once A's lease expires, and its /metrics shows one orphan crash
    # of the deployment, and no handler error.
    pool = events
    dep = deployment_name("crash")
    run = (await LeaseManager(pool).enqueue_run(dep, {"poison": True}, max_attempts=3)).run_id
    a = await workers(dep, "worker_apps:exit_on_poison", "--concurrency", "1")
    assert await a.wait_exit() == POISON_EXIT_CODE
    port = _free_port()
    await workers(dep, "worker_apps:tagged", "--metrics-port", str(port))

    async def completed() -> bool:
        return await pool.fetchval(
            "SELECT status::text = 'completed' FROM zeroth.runs WHERE run_id = $1", run)

    async def counted() -> bool:
        found = samples(await asyncio.to_thread(_scrape, port))
        return value(found, "zeroth_runs_completed_total", deployment=dep) == 1.0

    await wait_until(completed, "worker B to recover and complete the run", within=60)
    # B counts a completion once the database has acknowledged it, so a scrape made as soon as
    # the run reads completed can come before the count (seen: 0.0 == 1.0 under load).
    await wait_until(counted, "worker B to count the completion", within=20)
    found = samples(await asyncio.to_thread(_scrape, port))
    assert value(found, "zeroth_worker_crashes_total", deployment=dep, kind="orphan") == 1.0
    assert value(found, "zeroth_handler_errors_total", deployment=dep) in (None, 0.0)
    assert value(found, "zeroth_runs_completed_total", deployment=dep) == 1.0
