"""A worker whose own calls keep failing logs one traceback per streak, not one per retry: a
role that lost its grant (or a database that is down) fails every claim pass and every orphan
sweep, each retried within a second, and an operator reading the log must find the first error
and the moment it ended, not a wall of identical tracebacks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import psycopg
import pytest
from helpers import unique_deployment, wait_until
from roles import dsn_as, login_role
from worker_probes import wait_for_status, worker_errors

import zeroth_pg
from zeroth_pg.client import LeaseManager
from zeroth_pg.testing import libpq_dsn
from zeroth_pg.worker import RunContext, RunWorker


@contextlib.asynccontextmanager
async def _worker_as(member_of: str | None, pg_server_dsn: str, database_dsn: str, dep: str,
                     handler: Any, **settings: Any) -> AsyncIterator[tuple[RunWorker, str]]:
    """A started RunWorker on a pool of a new LOGIN role (member of ``member_of``; None: no
    grant at all), its claim passes and sweeps due every 50 ms unless ``settings`` say
    otherwise; yields it and the role's name; drained and its pool closed at exit."""
    with login_role(pg_server_dsn, member_of) as (name, password):
        worker_pool = await zeroth_pg.create_pool(dsn_as(database_dsn, name, password),
                                                  min_size=1, max_size=4)
        settings = {"poll_interval": 0.05, "orphan_sweep_interval": 0.05,
                    "lease_duration": 30.0, "shutdown_timeout": 2.0, **settings}
        worker = RunWorker(worker_pool, dep, handler, **settings)
        try:
            await worker.start()
            yield worker, name
        finally:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)
            await worker_pool.close()


def _as_superuser(pg_server_dsn: str, statement: str) -> None:
    with psycopg.connect(libpq_dsn(pg_server_dsn), autocommit=True) as admin:
        admin.execute(statement)


def _records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "zeroth_pg.worker" and text in r.getMessage()]



async def _ok(ctx: RunContext) -> Any:
    """A handler for the tests whose runs are never claimed (the worker cannot call in)."""
    return {"ok": True}

async def test_a_worker_that_lost_its_grant_logs_one_traceback_and_one_line_when_it_is_back(
        pool: asyncpg.Pool, pg_server_dsn: str, database_dsn: str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    dep = unique_deployment("streak")
    run = await LeaseManager(pool).enqueue_run(dep, {"n": 1})
    done = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        done.set()
        return {"ok": True}

    # A sweep due at every pass: both loops fail on every try while the grant is missing.
    async with _worker_as(None, pg_server_dsn, database_dsn, dep, handler) as (_, name):
        await wait_until(lambda: worker_errors(dep, "claim") >= 6
                         and worker_errors(dep, "sweep") >= 6,
                         "six failed claim passes and six failed sweeps", within=60)
        # One traceback each, for all of them.
        passes = _records(caplog, "claim pass failed")
        sweeps = _records(caplog, "orphan sweep failed")
        messages = [r.getMessage() for r in caplog.records]
        assert len(passes) == 1, messages
        assert len(sweeps) == 1, messages
        for record in passes + sweeps:
            assert record.levelno == logging.ERROR
            assert record.exc_info is not None
            assert "permission denied" in str(record.exc_info[1])
        assert not done.is_set()

        _as_superuser(pg_server_dsn, f'GRANT zeroth_worker TO "{name}"')
        await asyncio.wait_for(done.wait(), timeout=60)
        await wait_for_status(pool, run.run_id, "completed")
        back = _records(caplog, "claim pass answers again")
        assert len(back) == 1
        assert back[0].levelno == logging.INFO
        failures = int(back[0].getMessage().split("after ")[1].split(" ")[0])
        assert failures >= 6
        assert len(_records(caplog, "orphan sweep answers again")) == 1
        # Still one traceback each: the streak ended without another.
        assert len(_records(caplog, "claim pass failed")) == 1


async def test_a_worker_that_lost_its_grant_logs_one_traceback_for_its_timed_out_waits_too(
        pool: asyncpg.Pool, pg_server_dsn: str, database_dsn: str,
        caplog: pytest.LogCaptureFixture) -> None:
    # Each orphan sweep first wakes the timed-out event waits (zeroth.wake_due_waits), which
    # fails on the same missing grant; the sweep is retried within a second while it fails, so a
    # traceback per try was a wall of them again, beside the sweep's single one.
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    dep = unique_deployment("streak_waits")

    async with _worker_as(None, pg_server_dsn, database_dsn, dep, _ok) as (_, name):
        await wait_until(lambda: worker_errors(dep, "wake_due_waits") >= 6
                         and worker_errors(dep, "sweep") >= 6,
                         "six failed wakes of timed-out waits and six failed sweeps", within=60)
        wakes = _records(caplog, "waking timed-out event waits failed")
        assert len(wakes) == 1, [r.getMessage() for r in caplog.records]
        assert wakes[0].levelno == logging.ERROR
        assert wakes[0].exc_info is not None
        _as_superuser(pg_server_dsn, f'GRANT zeroth_worker TO "{name}"')
        await wait_until(lambda: bool(_records(caplog, "waking timed-out event waits "
                                                       "answers again")),
                         "the wakes answering again", within=60)
        assert len(_records(caplog, "waking timed-out event waits failed")) == 1


def _reported_failures(caplog: pytest.LogCaptureFixture, what: str) -> int:
    """Failures of ``what`` the log accounts for: one per traceback, N per "N more" line."""
    tracebacks = len(_records(caplog, f"{what} failed"))
    repeats = sum(int(r.getMessage().split("still failing: ")[1].split(" ")[0])
                  for r in _records(caplog, f"{what} still failing: "))
    return tracebacks + repeats


async def test_a_worker_stopped_while_its_calls_fail_logs_every_failure_of_the_streak(
        pool: asyncpg.Pool, pg_server_dsn: str, database_dsn: str,
        caplog: pytest.LogCaptureFixture) -> None:
    # Repeats are reported at most every 30 s, or when the streak ends: a worker stopped meanwhile
    # (a deploy, a scale-down, the pod killed for its failing readiness) must not take the count
    # of its last failures with it: the log is what an operator reads after the outage.
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    dep = unique_deployment("streak_stop")

    async with _worker_as(None, pg_server_dsn, database_dsn, dep, _ok):
        await wait_until(lambda: worker_errors(dep, "claim") >= 4
                         and worker_errors(dep, "sweep") >= 4
                         and worker_errors(dep, "wake_due_waits") >= 4,
                         "four failures of each", within=60)
    assert _reported_failures(caplog, "claim pass") == worker_errors(dep, "claim")
    assert _reported_failures(caplog, "orphan sweep") == worker_errors(dep, "sweep")
    assert (_reported_failures(caplog, "waking timed-out event waits")
            == worker_errors(dep, "wake_due_waits"))


async def test_a_busy_worker_whose_sweeps_fail_never_logs_that_they_answer_again(
        pool: asyncpg.Pool, pg_server_dsn: str, database_dsn: str,
        caplog: pytest.LogCaptureFixture) -> None:
    # Every slot busy: a sweep has nothing to re-lease into and calls the database only for its
    # end-only pass, once per interval; the other sweeps wake the timed-out waits (which fail
    # too) and return. Not having called is not having answered: "answers again" while the role
    # still has no grant would tell the operator the outage was over.
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    dep = unique_deployment("streak_busy")
    await LeaseManager(pool).enqueue_run(dep, {"n": 1})
    started, release = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        started.set()
        await release.wait()
        return {"ok": True}

    try:
        async with _worker_as("zeroth_worker", pg_server_dsn, database_dsn, dep, handler,
                              max_concurrency=1, orphan_sweep_interval=1.0) as (_, name):
            await asyncio.wait_for(started.wait(), timeout=60)
            _as_superuser(pg_server_dsn, f'REVOKE zeroth_worker FROM "{name}"')
            await wait_until(lambda: worker_errors(dep, "sweep") >= 3
                             and worker_errors(dep, "wake_due_waits") >= 3,
                             "three failed sweeps", within=60)
            assert _records(caplog, "orphan sweep answers again") == []
            assert _records(caplog, "claim pass answers again") == []
            release.set()
    finally:
        release.set()
