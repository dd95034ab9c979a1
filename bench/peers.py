"""The durable-execution peers (issue 13): Absurd, DBOS and chancy, each on its own database.

They are optional: :func:`missing` says which of their libraries are not importable (the
``bench`` extra installs them all); a missing one is skipped with a note, not a crash. Each is
configured as its own docs describe for throughput, and measured like the systems of
bench/systems.py: ``enqueue(n)`` untimed, ``drain(n, concurrency=…)`` the seconds until all n
no-op jobs are finished and the consumer has stopped, ``latency(n, gap)`` commit-ack → handler
start against an idle consumer.

* ``absurd`` — the Absurd SQL schema (shipped in the ``absurdctl`` wheel as
  ``absurdctl.BUNDLED_SCHEMA_SQL``; ``absurdctl init`` would apply it with psql) and the
  ``absurd-sdk`` async worker: ``start_worker(concurrency=C)``, which claims ``batch_size`` = C
  tasks per ``claim_task`` call and runs them as asyncio tasks on its one psycopg connection.
  No LISTEN/NOTIFY: an idle worker polls every ``poll_interval`` (default 0.25 s, kept).
* ``dbos`` — DBOS queues on a Postgres system database, in a process of its own
  (bench/dbos_peer.py says why and how it is configured).
* ``chancy`` — chancy's worker with the queue on its asyncio executor (the docs' choice for
  IO-bound async jobs; the default executor is a process pool), ``concurrency`` = C,
  ``eager_polling`` on (poll again as soon as a slot frees), NOTIFY wakeups on (its default).
  Its worker persists job results in batches (every second, and on stop), which its docs name
  as its throughput design; the drain ends when ``Worker.stop()`` has flushed them.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import sys
import time
from typing import Any

from bench.harness import wait_until
from bench.systems import DRAIN_TIMEOUT, REPO_ROOT, Latencies, System, produce

#: The modules each peer needs, by label.
REQUIRES = {"absurd": ("absurd_sdk", "absurdctl"), "dbos": ("dbos",), "chancy": ("chancy",)}


def missing(label: str) -> list[str]:
    """The modules of peer ``label`` that are not importable (found without importing them)."""
    return [module for module in REQUIRES[label] if importlib.util.find_spec(module) is None]


# ---------------------------------------------------------------------------------------------
# Absurd

ABSURD_QUEUE = "bench"
ABSURD_TASK = "noop"


class Absurd(System):
    label = "absurd"

    async def setup(self) -> None:
        from absurdctl import BUNDLED_SCHEMA_SQL

        await super().setup()
        await self.conn.execute(BUNDLED_SCHEMA_SQL)
        await self.conn.execute("SELECT absurd.create_queue($1)", ABSURD_QUEUE)

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE " + ", ".join(
            f"absurd.{prefix}_{ABSURD_QUEUE}" for prefix in "trcew"))

    async def enqueue(self, n: int) -> None:
        """What ``AsyncAbsurd.spawn`` sends per task (absurd.spawn_task with the SDK's default
        max_attempts), n at a time."""
        for start in range(0, n, 10_000):
            await self.conn.execute(
                """SELECT absurd.spawn_task($1, $2, '{}'::jsonb, '{"max_attempts": 5}'::jsonb)
                     FROM generate_series(1, $3)""",
                ABSURD_QUEUE, ABSURD_TASK, min(10_000, n - start))

    def _app(self, handler: Any) -> Any:
        from absurd_sdk import AsyncAbsurd

        app = AsyncAbsurd(self.dsn, queue_name=ABSURD_QUEUE)
        app.register_task(ABSURD_TASK)(handler)
        return app

    async def drain(self, n: int, *, concurrency: int) -> float:
        handled = 0
        app: Any = None

        async def handler(_params: Any, _ctx: Any) -> None:
            nonlocal handled
            handled += 1
            if handled >= n:
                # The worker finishes the batch in hand (its completions included), then exits.
                app.stop_worker()

        app = self._app(handler)
        try:
            started = time.perf_counter()
            await asyncio.wait_for(app.start_worker(concurrency=concurrency),
                                   timeout=DRAIN_TIMEOUT)
            elapsed = time.perf_counter() - started
        finally:
            await app.close()
        left = await self.conn.fetchval(
            f"SELECT count(*) FROM absurd.r_{ABSURD_QUEUE} WHERE state <> 'completed'")
        assert left == 0, f"absurd left {left} of {n} runs"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        latencies = Latencies()

        async def handler(_params: Any, ctx: Any) -> None:
            latencies.start(ctx.task_id)

        app = self._app(handler)
        worker = asyncio.create_task(app.start_worker(concurrency=8))
        try:
            await asyncio.sleep(0.3)  # connected, first (empty) claim done
            await produce(latencies, self.label, self.dsn, n, gap)
        finally:
            app.stop_worker()
            await asyncio.wait_for(worker, timeout=30)
            await app.close()
        return latencies.milliseconds()


# ---------------------------------------------------------------------------------------------
# DBOS (its own process: bench/dbos_peer.py)


class Dbos(System):
    label = "dbos"

    async def _peer(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.dbos_peer", args[0], self.dsn, *args[1:],
            stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=DRAIN_TIMEOUT + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"bench.dbos_peer {args[0]} failed (exit {proc.returncode})")
        return out.decode()

    async def setup(self) -> None:
        await super().setup()
        await self._peer("setup")

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE dbos.workflow_status CASCADE")

    async def enqueue(self, n: int) -> None:
        await self._peer("enqueue", str(n))

    async def drain(self, n: int, *, concurrency: int) -> float:
        out = await self._peer("drain", str(n), str(concurrency))
        elapsed = float(out.split("elapsed ", 1)[1].split()[0])
        left = await self.conn.fetchval(
            "SELECT count(*) FROM dbos.workflow_status WHERE status <> 'SUCCESS'")
        done = await self.conn.fetchval(
            "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'")
        assert left == 0, f"dbos left {left} of {n} workflows unfinished"
        assert done == n, f"dbos finished {done} of {n} workflows"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        """The consumer process prints each workflow's start instant (CLOCK_MONOTONIC, like the
        producer's)."""
        latencies = Latencies()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.dbos_peer", "consume", self.dsn,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
        assert proc.stdin is not None
        assert proc.stdout is not None
        stdout = proc.stdout
        ready = asyncio.Event()

        async def read() -> None:
            async for line in stdout:
                key, _, instant = line.decode().strip().partition(" ")
                if key == "ready":
                    ready.set()
                elif instant:
                    latencies.started.setdefault(key, float(instant))

        reader = asyncio.create_task(read())
        try:
            await asyncio.wait_for(ready.wait(), timeout=60)
            await produce(latencies, self.label, self.dsn, n, gap)
        finally:
            proc.stdin.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=30)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        return latencies.milliseconds()


# ---------------------------------------------------------------------------------------------
# chancy

CHANCY_QUEUE = "bench"


class Chancy(System):
    label = "chancy"

    def _app(self, pool_size: int = 2) -> Any:
        from chancy import Chancy as App

        log = logging.getLogger("bench.chancy")
        log.setLevel(logging.WARNING)  # chancy logs every job it pulls at INFO
        return App(self.dsn, min_connection_pool_size=min(2, pool_size),
                   max_connection_pool_size=pool_size, log=log)

    async def _declare(self, app: Any, concurrency: int) -> None:
        from chancy import Chancy as App
        from chancy import Queue

        await app.declare(Queue(CHANCY_QUEUE, concurrency=concurrency, executor=App.Executor.Async,
                                eager_polling=True), upsert=True)

    async def setup(self) -> None:
        from chancy import Chancy as App
        from chancy import Queue

        await super().setup()
        async with self._app() as app:
            await app.migrate()
            # Every worker declares a "default" queue (process-pool executor, every worker's
            # tags) on start; declared here first with no tags, no worker runs it, so no
            # process pool is forked inside the suite.
            await app.declare(Queue("default", tags=set(), executor=App.Executor.Async))
            await self._declare(app, 1)

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE chancy_jobs")

    async def enqueue(self, n: int) -> None:
        from chancy import Job

        from bench.chancy_jobs import noop

        job = Job.from_func(noop, queue=CHANCY_QUEUE)
        async with self._app() as app:
            async for _ in app.push_many([job] * n, batch_size=1000):
                pass

    def _worker(self, app: Any) -> Any:
        from chancy import Worker

        return Worker(app, register_signal_handlers=False)

    async def drain(self, n: int, *, concurrency: int) -> float:
        handled = 0

        def count(_job: Any) -> None:
            nonlocal handled
            handled += 1

        from bench.chancy_jobs import hooks

        hooks.append(count)
        try:
            async with self._app(concurrency + 4) as app:
                await self._declare(app, concurrency)
                worker = self._worker(app)
                started = time.perf_counter()
                await worker.start()
                try:
                    await wait_until(lambda: handled >= n, limit=DRAIN_TIMEOUT,
                                     what="chancy drain")
                finally:
                    await worker.stop()  # lets the executors drain, flushes the results
                elapsed = time.perf_counter() - started
        finally:
            hooks.remove(count)
        left = await self.conn.fetchval(
            "SELECT count(*) FROM chancy_jobs WHERE state <> 'succeeded'")
        assert left == 0, f"chancy left {left} of {n} jobs"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        latencies = Latencies()

        def note(job: Any) -> None:
            latencies.start(job.id)

        from bench.chancy_jobs import hooks

        hooks.append(note)
        try:
            async with self._app(8) as app:
                await self._declare(app, 8)
                worker = self._worker(app)
                await worker.start()
                try:
                    await asyncio.sleep(0.5)  # the queue loop started and made its first poll
                    await produce(latencies, self.label, self.dsn, n, gap)
                finally:
                    await worker.stop()
        finally:
            hooks.remove(note)
        return latencies.milliseconds()
