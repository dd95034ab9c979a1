"""A worker's start-up against a database that is away (zeroth_pg/worker/_startup.py), in
process: the schedules a worker declares when it starts wait for a database that went away
after its pool opened, a schedule the database refuses still fails the start at once, a
SIGTERM while the start waits ends it with nothing held (one that comes as a step finishes too),
a cancelled run_until_stopped or a graceful_shutdown() while it waits leave nothing starting
behind, and ``App.run_worker`` waits for its
first connection as ``zeroth-pg worker`` does (the process's own case: test_worker_processes.py,
TestStartingBeforeItsDatabase). The database goes away and comes back as a TCP proxy in front
of the test's server that is closed (every connection cut, the port refusing) and opened again
on the same port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from helpers import unique_deployment, wait_until
from tcp_proxy import TcpProxy, server_target, uri_through

from zeroth_pg import App
from zeroth_pg._libpq import asyncpg_dsn
from zeroth_pg.errors import ConnectionLostError, InvalidArgumentError
from zeroth_pg.worker import PeriodicSchedule, RunWorker
from zeroth_pg.worker._startup import StartInterrupted, StartupSignals, retry_starting


async def _noop(_run: Any) -> None:
    return None


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


class _Outage:
    """The test's database behind a proxy that can be taken away and brought back."""

    def __init__(self, database_dsn: str) -> None:
        self.target = server_target(database_dsn)
        self.proxy = TcpProxy(self.target)
        self.dsn = ""

    async def up(self) -> None:
        port = self.proxy.port
        self.proxy = TcpProxy(self.target)
        await self.proxy.start(port)
        self.dsn = uri_through(self.target, [self.proxy])

    async def down(self) -> None:
        await self.proxy.close()


@pytest.fixture
async def outage(database_dsn: str) -> Any:
    away = _Outage(database_dsn)
    await away.up()
    try:
        yield away
    finally:
        await away.down()


@contextlib.asynccontextmanager
async def _pool_then_away(outage: _Outage) -> AsyncIterator[asyncpg.Pool]:
    """A pool opened through the proxy, then the database taken away: its connection is cut
    and the port refuses."""
    through = await asyncpg.create_pool(outage.dsn, min_size=1, max_size=2)
    try:
        await outage.down()
        yield through
    finally:
        await through.close()


def _scheduling_worker(pool: asyncpg.Pool, deployment: str, **options: Any) -> RunWorker:
    """A worker that declares one schedule when it starts."""
    return RunWorker(pool, deployment, _noop, poll_interval=0.05,
                     schedules=[PeriodicSchedule(name="tick", deployment_ref=deployment,
                                                 interval_seconds=3600)], **options)


async def _waiting_to_register(caplog: pytest.LogCaptureFixture) -> None:
    await wait_until(lambda: _logged(caplog, "could not register its schedules yet"),
                     "the worker to say it waits for its database", within=15)


async def test_a_worker_whose_database_went_away_declares_its_schedules_once_it_is_back(
        outage: _Outage, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zeroth_pg.worker")
    deployment = unique_deployment("startup-schedules")
    async with _pool_then_away(outage) as through:
        worker = _scheduling_worker(through, deployment)
        starting = asyncio.create_task(worker.start())
        await _waiting_to_register(caplog)
        assert not starting.done()
        assert await pool.fetchval("SELECT count(*) FROM zeroth.schedules") == 0
        await outage.up()
        await asyncio.wait_for(starting, timeout=30)  # started, without an error
        try:
            row = await pool.fetchrow(
                "SELECT name, deployment_ref, interval_seconds FROM zeroth.schedules")
            assert row is not None
            assert (row["name"], row["deployment_ref"], row["interval_seconds"]) == (
                "tick", deployment, 3600)
        finally:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


async def test_a_schedule_the_database_refuses_still_fails_the_start_at_once(
        pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zeroth_pg.worker")
    deployment = unique_deployment("startup-refused")
    worker = RunWorker(pool, deployment, _noop,
                       schedules=[PeriodicSchedule(name="bad", deployment_ref=deployment,
                                                   cron="0 25 * * *")])
    with pytest.raises(InvalidArgumentError, match="cron hour"):
        await asyncio.wait_for(worker.start(), timeout=10)
    assert not _logged(caplog, "could not register its schedules yet")
    assert await pool.fetchval("SELECT count(*) FROM zeroth.schedules") == 0


async def test_a_sigterm_while_the_start_waits_for_its_database_ends_it_holding_nothing(
        outage: _Outage, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    deployment = unique_deployment("startup-sigterm")
    run_id = await pool.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1)", deployment)
    async with _pool_then_away(outage) as through:
        worker = _scheduling_worker(through, deployment)
        serving = asyncio.create_task(worker.run_until_stopped())
        await _waiting_to_register(caplog)
        # run_until_stopped's handlers are installed before the start: this is caught there.
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, timeout=10)
        assert _logged(caplog, f"worker {worker.worker_id}: stopped before it could start")
        assert not _logged(caplog, f"worker {worker.worker_id} started for")
        # Nothing was claimed, and the database coming back afterwards changes nothing.
        await outage.up()
        row = await pool.fetchrow(
            "SELECT status::text AS status, lease_worker_id FROM zeroth.runs WHERE run_id = $1",
            run_id)
        assert row is not None
        assert (row["status"], row["lease_worker_id"]) == ("pending", None)


async def test_app_run_worker_waits_for_its_first_connection(
        database_dsn: str, pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    away = _Outage(database_dsn)
    await away.up()
    late = away.dsn  # this port, with nothing listening on it for now
    await away.down()
    app = App(late)
    deployment = unique_deployment("startup-app")
    handled = asyncio.Event()

    @app.deployment(deployment)
    async def handle(run: Any) -> dict[str, bool]:
        handled.set()
        return {"ok": True}

    worker_id = "startup-app-worker"
    serving = asyncio.create_task(app.run_worker(worker_id=worker_id, poll_interval=0.05))
    try:
        await wait_until(lambda: _logged(caplog, f"worker {worker_id}: could not connect yet"),
                         "run_worker to say it waits for its database", within=15)
        assert not serving.done()
        await away.up()
        await wait_until(lambda: _logged(caplog, f"worker {worker_id} started for"),
                         "the worker to start once its database is back", within=30)
        await pool.execute("SELECT zeroth.enqueue_run(deployment_ref => $1)", deployment)
        await asyncio.wait_for(handled.wait(), timeout=15)
        os.kill(os.getpid(), signal.SIGTERM)  # drains, and run_worker returns
        await asyncio.wait_for(serving, timeout=30)
        assert _logged(caplog, f"worker {worker_id} stopped")
    finally:
        if not serving.done():
            serving.cancel()
        await app.close()
        await away.down()


async def test_app_run_worker_signalled_before_it_could_connect_returns(
        database_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)  # the App's logger and the worker's
    away = _Outage(database_dsn)
    await away.up()
    late = away.dsn
    await away.down()
    app = App(late)
    deployment = unique_deployment("startup-app-sigterm")

    @app.deployment(deployment)
    async def handle(run: Any) -> None:
        return None

    serving = asyncio.create_task(app.run_worker(worker_id="startup-app-gone"))
    try:
        await wait_until(
            lambda: _logged(caplog, "worker startup-app-gone: could not connect yet"),
            "run_worker to say it waits for its database", within=15)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, timeout=10)
        assert _logged(caplog, "worker startup-app-gone: stopped before it could connect")
    finally:
        if not serving.done():
            serving.cancel()
        await app.close()


async def test_a_signal_as_the_first_connection_opens_still_stops_the_start(
        database_dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    # The signal comes while the awaited step takes its last step: the step's result comes
    # back, and the start must still stop before it serves (the signal is not lost).
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    connections: list[asyncpg.Connection] = []

    async def connect_then_signalled() -> asyncpg.Connection:
        conn = await asyncpg.connect(asyncpg_dsn(database_dsn))
        connections.append(conn)
        os.kill(os.getpid(), signal.SIGTERM)  # caught by StartupSignals' handler
        await asyncio.sleep(0)
        return conn

    try:
        with StartupSignals("signalled-late") as startup:
            conn = await startup.run(connect_then_signalled())
            assert await conn.fetchval("SELECT 1") == 1  # the step did finish
            assert startup.signalled
            with pytest.raises(StartInterrupted):
                startup.check()
        assert _logged(caplog, "worker signalled-late: stopped before it could connect")
    finally:
        for conn in connections:
            await conn.close()


def _start_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks()
            if getattr(task.get_coro(), "__qualname__", "") == "RunWorker.start"]


async def test_run_until_stopped_cancelled_while_it_starts_leaves_no_start_behind(
        outage: _Outage, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zeroth_pg.worker")
    deployment = unique_deployment("startup-cancelled")
    async with _pool_then_away(outage) as through:
        worker = _scheduling_worker(through, deployment)
        serving = asyncio.create_task(worker.run_until_stopped(install_signal_handlers=False))
        await _waiting_to_register(caplog)
        assert len(_start_tasks()) == 1
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        # The start went with it: nothing would start the worker once the database is back.
        assert _start_tasks() == []
        assert worker._claim_task is None


async def test_a_graceful_shutdown_while_the_start_waits_starts_nothing_after(
        outage: _Outage, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zeroth_pg.worker")
    deployment = unique_deployment("startup-shutdown")
    async with _pool_then_away(outage) as through:
        worker = _scheduling_worker(through, deployment, dsn=outage.dsn)
        starting = asyncio.create_task(worker.start())
        await _waiting_to_register(caplog)
        await asyncio.wait_for(worker.graceful_shutdown(), timeout=10)
        await outage.up()
        await asyncio.wait_for(starting, timeout=30)  # registered, then started nothing
        assert worker._claim_task is None
        assert worker.notifier is None  # no LISTEN connection left looping
        assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("zeroth-")]


async def test_run_until_stopped_cancelled_as_its_start_finishes_drains_the_worker(
        pool: asyncpg.Pool) -> None:
    # The cancel lands in the same turn as the start's end: the worker started, so it must be
    # drained (it used to be left serving, its claim loop running with nobody to stop it).
    serving: asyncio.Task[None] | None = None

    class CancelledAsItStarts(RunWorker):
        async def start(self) -> None:
            await super().start()
            assert serving is not None
            serving.cancel()

    worker = CancelledAsItStarts(pool, unique_deployment("startup-cancel-late"), _noop,
                                 poll_interval=0.05)
    serving = asyncio.create_task(worker.run_until_stopped(install_signal_handlers=False))
    with pytest.raises(asyncio.CancelledError):
        await serving
    assert worker._claim_task is not None  # it did start
    assert worker.stopping  # and was drained
    assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("zeroth-")]


async def test_start_after_a_graceful_shutdown_starts_nothing(outage: _Outage) -> None:
    worker = RunWorker(await asyncpg.create_pool(outage.dsn, min_size=0, max_size=1),
                       unique_deployment("startup-after-stop"), _noop, dsn=outage.dsn)
    try:
        await worker.graceful_shutdown()
        await worker.start()
        assert worker._claim_task is None
        assert worker.notifier is None  # no LISTEN task left reconnecting for ever
        assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("zeroth-")]
    finally:
        await worker.pool.close()


async def test_a_start_up_step_that_outlasts_its_window_fails_typed(outage: _Outage) -> None:
    async with _pool_then_away(outage) as through:
        with pytest.raises(ConnectionLostError, match=r"could not probe within 0\.3s"):
            await retry_starting(lambda: through.fetchval("SELECT 1"), what="probe",
                                 worker_id="window", seconds=0.3)
