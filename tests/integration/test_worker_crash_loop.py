"""A run that kills its worker process is dead-lettered after max_attempts, not recovered for ever.

Regression: claim_orphaned never counted an attempt, so a handler that OOM-kills or segfaults its
process went round the fleet taking every worker down. Now every re-lease of an orphan by
claim_orphaned counts an attempt, and a resumable orphan out of attempts is dead-lettered
(failed, ``dead_lettered_at`` set, ``error.stop_reason = 'attempts_exhausted'``).

Three real ``python -m zeroth_pg.worker`` processes (``worker_apps:exit_on_poison``, one run at
a time each, 2 s leases, orphan sweeps every 0.5 s) work through normal runs and two poison runs
whose handler calls ``os._exit(9)``. The test restarts every process that dies, as a supervisor
would, and counts the deaths. The harness (subprocesses, the events table) is the one of
test_worker_processes.py; every wait has a failure bound and nothing is timed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import wait_until
from test_worker_processes import (  # noqa: F401 - workers and events are fixtures used here
    LIVE_LEASES,
    WorkerProcess,
    deployment_name,
    events,
    workers,
)
from worker_apps import POISON_EXIT_CODE

from zeroth_pg.client import LeaseManager

FLEET_SIZE = 3
NORMAL_RUNS = 20
POISON_MAX_ATTEMPTS = (2, 3)  # one below the default, and the default
WITHIN = 45.0  # failure bound of the whole crash loop; it takes about 10 s


class Supervisor:
    """Keeps ``FLEET_SIZE`` worker processes running: a process that exited with the poison
    exit code is counted and replaced; any other exit fails the test."""

    def __init__(self, spawn: Callable[..., Awaitable[WorkerProcess]], deployment: str, *,
                 app: str = "worker_apps:exit_on_poison", exit_code: int = POISON_EXIT_CODE,
                 extra: tuple[str, ...] = ()) -> None:
        self._spawn = spawn
        self._deployment = deployment
        self._app, self._exit_code, self._extra = app, exit_code, extra
        self.current: list[WorkerProcess] = []
        self.deaths: list[WorkerProcess] = []

    async def _start_one(self) -> WorkerProcess:
        # One run at a time: a process that dies takes only its poison run down with it.
        return await self._spawn(self._deployment, self._app, "--concurrency", "1", *self._extra)

    async def start(self) -> None:
        self.current = [await self._start_one() for _ in range(FLEET_SIZE)]

    async def reap(self) -> None:
        """Replace every process that has exited since the last look."""
        for index, proc in enumerate(self.current):
            if proc.proc.returncode is None:
                continue
            code = await proc.wait_exit()
            if code != self._exit_code:
                pytest.fail(f"worker {proc.worker_id} exited {code}, not by a poison run:\n"
                            f"{proc.log}")
            self.deaths.append(proc)
            self.current[index] = await self._start_one()


async def started_events(pool: asyncpg.Pool, run_id: UUID) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        """SELECT e.worker_id, e.generation, e.data::text AS data_text FROM public.events e
            WHERE e.run_id = $1 AND e.kind = 'started' ORDER BY e.id""", run_id)
    return [{"worker_id": r["worker_id"], "generation": r["generation"],
             **json.loads(r["data_text"])} for r in rows]


@pytest.mark.slow
class TestCrashLoop:
    async def test_a_run_that_kills_every_worker_is_dead_lettered_after_max_attempts(
            self, workers: Any, events: asyncpg.Pool) -> None:  # noqa: F811 - fixtures
        pool = events
        dep = deployment_name("crashloop")
        client = LeaseManager(pool)
        # The poison runs go first (priority), so the fleet dies while it has normal work.
        poison = {run.run_id: max_attempts for run, max_attempts in zip(
            await client.enqueue_runs(dep, [
                {"payload": {"poison": True}, "max_attempts": max_attempts, "priority": 1}
                for max_attempts in POISON_MAX_ATTEMPTS]),
            POISON_MAX_ATTEMPTS, strict=True)}
        normal = [run.run_id for run in await client.enqueue_runs(
            dep, [{"payload": {"seconds": 0.2}}] * NORMAL_RUNS)]

        began = time.monotonic()
        supervisor = Supervisor(workers, dep)
        await supervisor.start()

        async def crash_loop_over() -> bool:
            await supervisor.reap()
            if len(supervisor.deaths) > sum(POISON_MAX_ATTEMPTS):
                pytest.fail(f"{len(supervisor.deaths)} worker processes died, more than the "
                            f"poison runs have attempts ({sum(POISON_MAX_ATTEMPTS)}): the "
                            "crash loop goes on")
            return bool(await pool.fetchval(
                """SELECT count(*) FILTER (WHERE r.run_id = ANY ($2) AND r.status = 'failed') = $3
                      AND count(*) FILTER (WHERE r.run_id = ANY ($4)
                                             AND r.status = 'completed') = $5
                     FROM zeroth.runs r WHERE r.deployment_ref = $1""",
                dep, list(poison), len(poison), normal, len(normal)))

        await wait_until(crash_loop_over, "the poison runs dead-lettered and the normal runs "
                         "completed", within=WITHIN, interval=0.05)
        await supervisor.reap()  # a death that came with the last dead letter
        elapsed = time.monotonic() - began

        # Each poison run ended failed and dead-lettered, out of attempts.
        for run_id, max_attempts in poison.items():
            row = await pool.fetchrow(
                """SELECT r.status::text AS status, r.attempts, r.dead_lettered_at,
                          r.lease_worker_id, r.error::text AS error_text
                     FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
            assert row is not None
            error = json.loads(row["error_text"])
            assert (row["status"], row["attempts"], error["stop_reason"]) == (
                "failed", max_attempts, "attempts_exhausted"), error
            assert row["dead_lettered_at"] is not None
            assert row["lease_worker_id"] is None

            # Every attempt ran on a process of its own, and took it down: attempt 1 claimed
            # from pending, each later one re-leased as an orphan by claim_orphaned.
            starts = await started_events(pool, run_id)
            assert [s["attempt"] for s in starts] == list(range(1, max_attempts + 1))
            assert [s["recovered"] for s in starts] == [False] + [True] * (max_attempts - 1)
            assert [s["generation"] for s in starts] == sorted({s["generation"] for s in starts})
            assert len({s["worker_id"] for s in starts}) == max_attempts

        # One worker death per poison attempt, and no other.
        poison_workers = [s["worker_id"] for run_id in poison
                          for s in await started_events(pool, run_id)]
        dead = [proc.worker_id for proc in supervisor.deaths]
        assert len(dead) == sum(POISON_MAX_ATTEMPTS)
        assert sorted(dead) == sorted(poison_workers)
        assert all(proc.proc.returncode is None for proc in supervisor.current), [
            (proc.worker_id, proc.proc.returncode) for proc in supervisor.current]

        # Every normal run completed; nothing is left pending, running or leased.
        statuses = {row["status"]: row["n"] for row in await pool.fetch(
            """SELECT r.status::text AS status, count(*) AS n FROM zeroth.runs r
                WHERE r.deployment_ref = $1 GROUP BY r.status""", dep)}
        assert statuses == {"completed": NORMAL_RUNS, "failed": len(poison)}
        assert await pool.fetchval(LIVE_LEASES, dep) == 0
        retried = await pool.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.run_id = ANY ($1) AND r.attempts > 1",
            normal)
        print(f"\n[crash-loop] {len(dead)} worker deaths ({len(poison)} poison runs, "
              f"max_attempts {list(POISON_MAX_ATTEMPTS)}), {NORMAL_RUNS} normal runs completed "
              f"({retried} needed another attempt) on {FLEET_SIZE} supervised processes: "
              f"{elapsed:.2f} s")


@pytest.mark.slow
class TestShutdownLoop:
    async def test_a_run_that_stops_its_worker_every_time_is_dead_lettered(
            self, workers: Any, events: asyncpg.Pool) -> None:  # noqa: F811 - fixtures
        """A handler that sends its own worker SIGTERM and outlives the shutdown timeout is not
        handed back with its attempt refunded, by every worker process in turn, for ever. The
        first max_attempts hand-backs refund; after them the attempts count, and the hand-back
        that finds none left dead-letters the run: 2 x max_attempts executions at most."""
        pool = events
        dep = deployment_name("shutdownloop")
        client = LeaseManager(pool)
        max_attempts = 2
        poison = (await client.enqueue_run(dep, payload={"poison": True},
                                           max_attempts=max_attempts, priority=1)).run_id
        normal = [run.run_id for run in await client.enqueue_runs(
            dep, [{"payload": {"seconds": 0.1}}] * 6)]
        # A drained worker exits 0; every exit of this fleet is one.
        supervisor = Supervisor(workers, dep, app="worker_apps:sigterm_on_poison", exit_code=0,
                                extra=("--shutdown-timeout", "0.3"))
        await supervisor.start()
        executions = 2 * max_attempts

        async def loop_over() -> bool:
            await supervisor.reap()
            if len(supervisor.deaths) > executions:
                pytest.fail(f"{len(supervisor.deaths)} worker processes stopped, more than "
                            f"{executions}: the shutdown loop goes on")
            return bool(await pool.fetchval(
                """SELECT count(*) FILTER (WHERE r.run_id = $2 AND r.status = 'failed') = 1
                      AND count(*) FILTER (WHERE r.run_id = ANY ($3)
                                             AND r.status = 'completed') = $4
                     FROM zeroth.runs r WHERE r.deployment_ref = $1""",
                dep, poison, normal, len(normal)))

        await wait_until(loop_over, "the poison run dead-lettered and the normal runs "
                         "completed", within=WITHIN, interval=0.05)
        await supervisor.reap()

        row = await pool.fetchrow(
            """SELECT r.status::text AS status, r.attempts, r.hand_backs, r.dead_lettered_at,
                      r.lease_worker_id, r.error::text AS error_text
                 FROM zeroth.runs r WHERE r.run_id = $1""", poison)
        assert row is not None
        error = json.loads(row["error_text"])
        assert (row["status"], row["attempts"], row["hand_backs"], error["stop_reason"]) == (
            "failed", max_attempts, executions, "attempts_exhausted"), (dict(row), error)
        assert row["dead_lettered_at"] is not None
        assert row["lease_worker_id"] is None
        starts = await started_events(pool, poison)
        # Refunded hand-backs: every execution is attempt 1 until max_attempts of them.
        assert [s["attempt"] for s in starts] == [1] * max_attempts + list(
            range(1, max_attempts + 1))
        assert len({s["worker_id"] for s in starts}) == executions

        async def last_one_exited() -> bool:  # it dead-letters the run, then finishes draining
            await supervisor.reap()
            return len(supervisor.deaths) >= executions

        await wait_until(last_one_exited, "the last stopped worker to exit", within=WITHIN)
        assert len(supervisor.deaths) == executions
        assert await pool.fetchval(LIVE_LEASES, dep) == 0
