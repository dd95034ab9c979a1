"""The systems under test, each on its own database of the same server.

Every system can be *drained*: ``enqueue(n)`` (untimed) puts n no-op runs in its queue, then
``drain(n, …)`` starts its consumer and returns the seconds until all n are finished and the
consumer has stopped. Every system can also measure *wakeup latency*: an idle consumer, runs
enqueued one by one, and for each the time from the enqueue's commit (the producer got its
answer) to the handler starting.

* ``zeroth-worker`` — :class:`zeroth_pg.RunWorker` with a no-op handler: claim → start_run →
  complete_run, every write fenced, LISTEN/NOTIFY wakeups, renewal task, orphan sweep.
* ``zeroth-lease`` — the :class:`zeroth_pg.LeaseManager` alone: ``concurrency`` loops of
  claim_and_start(batch) → complete_runs(batch), two fenced statements per batch.
* ``pgqueuer`` / ``procrastinate`` — the peers, configured as their docs recommend for throughput.
* ``raw`` — the floor: plain asyncpg ``UPDATE … SKIP LOCKED`` claim of ``batch`` rows, then one
  ``UPDATE`` marking them done. No lease, no fence, no scope, no retries: the cost of the work.
* ``seed`` — the upstream Zeroth statement sequence as client-side SQL (seed-spec §12): a policy
  read, then in one transaction the admission row ``FOR UPDATE``, a COUNT of live leases, a SKIP
  LOCKED select and an UPDATE; then a fenced start and a fenced completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench.harness import Server, pool, wait_until
from zeroth_pg import LeaseManager
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.worker import RunWorker

DEPLOYMENT = "bench"
REPO_ROOT = Path(__file__).resolve().parents[1]
DRAIN_TIMEOUT = 900.0


async def noop(_run: object) -> None:
    return None


class Latencies:
    """Commit-acknowledged instants (from the producer process) and handler-start instants (in
    this one) per job, on the shared monotonic clock."""

    def __init__(self) -> None:
        self.acked: dict[str, float] = {}
        self.started: dict[str, float] = {}

    def start(self, key: Any) -> None:
        self.started.setdefault(str(key), time.perf_counter())

    def milliseconds(self) -> list[float]:
        return [1000 * (self.started[key] - acked) for key, acked in self.acked.items()]


async def produce(latencies: Latencies, system: str, dsn: str, n: int, gap: float) -> None:
    """Run the producer process (bench/producer.py) against an idle consumer, then wait for
    every handler to start."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.producer", system, dsn, str(n), str(gap),
        stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    assert proc.stdout is not None
    async for line in proc.stdout:
        key, _, instant = line.decode().strip().partition(" ")
        if key != "ready":
            latencies.acked[key] = float(instant)
    if await proc.wait() != 0:
        raise RuntimeError(f"the {system} producer failed (exit {proc.returncode})")
    await wait_until(lambda: latencies.acked.keys() <= latencies.started.keys(), limit=60,
                     what=f"{system} handlers to start")


async def produce_while(consume: Coroutine[Any, Any, None], latencies: Latencies, system: str,
                        dsn: str, n: int, gap: float) -> None:
    """:func:`produce` while ``consume`` runs in the background; the consumer is cancelled
    after."""
    task = asyncio.create_task(consume)
    try:
        await produce(latencies, system, dsn, n, gap)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class System:
    """A system on its own fresh database; ``admin`` is a connection for setup and resets."""

    label = ""
    schema = ""  # SQL applied to the fresh database

    def __init__(self, server: Server) -> None:
        self.server = server
        self.dsn = ""
        self.admin: asyncpg.Connection | None = None

    async def _database(self) -> str:
        return await asyncio.to_thread(self.server.database, self.label)

    async def setup(self) -> None:
        self.dsn = await self._database()
        self.admin = await asyncpg.connect(self.dsn)
        if self.schema:
            await self.admin.execute(self.schema)

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.close()

    async def reconnect(self) -> None:
        if self.admin is not None:
            self.admin.terminate()
        self.admin = await asyncpg.connect(self.dsn)

    @property
    def conn(self) -> asyncpg.Connection:
        assert self.admin is not None
        return self.admin

    async def reset(self) -> None:
        """Empty the system's queue (and its history)."""
        raise NotImplementedError

    async def latency(self, n: int, gap: float) -> list[float]:
        """Wakeup latencies in ms of n runs enqueued ``gap`` seconds apart to an idle
        consumer."""
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# zeroth_pg


class Zeroth(System):
    """zeroth_pg on a migrated database: the worker and the bare LeaseManager."""

    label = "zeroth"

    async def _database(self) -> str:
        return await asyncio.to_thread(self.server.zeroth_database, self.label)

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE zeroth.runs, zeroth.admission_slots CASCADE")

    async def enqueue(self, n: int, *, status: str = "pending") -> None:
        """n runs straight into the table (what enqueue_runs writes, minus its NOTIFY), in
        chunks so a million rows do not make one giant transaction."""
        for start in range(0, n, 100_000):
            await self.conn.execute(
                """INSERT INTO zeroth.runs AS r (run_id, tenant_id, deployment_ref, status,
                       run_after, created_at, updated_at, finished_at, attempts)
                   SELECT gen_random_uuid(), 'default', $1, $2::zeroth.run_status, now(),
                          now() + g * interval '1 microsecond', now(),
                          CASE WHEN $2 = 'completed' THEN now() END,
                          CASE WHEN $2 = 'completed' THEN 1 ELSE 0 END
                     FROM generate_series(1, $3) AS g""",
                DEPLOYMENT, status, min(100_000, n - start))

    async def drain_worker(self, n: int, *, concurrency: int,
                           fleet_max_concurrency: int | None = None,
                           claim_ahead: int = 0) -> float:
        registry = CollectorRegistry()
        metrics = WorkerMetrics.create(registry)
        handled = 0

        async def count(_run: object) -> None:
            nonlocal handled
            handled += 1

        # A slot needs a connection only while it writes; the server allows 100 in all.
        async with pool(self.dsn, min(concurrency + 3, 40)) as workers:
            worker = RunWorker(workers, DEPLOYMENT, count, dsn=self.dsn,
                               max_concurrency=concurrency,
                               fleet_max_concurrency=fleet_max_concurrency,
                               claim_ahead=claim_ahead, metrics=metrics)
            started = time.perf_counter()
            await worker.start()
            try:
                # Cheap to poll (collecting the metrics registry 500 times a second is not): every
                # handler ran and every run has left the worker, i.e. its completion came back.
                await wait_until(lambda: handled >= n and not worker.active_run_ids,
                                 limit=DRAIN_TIMEOUT, what="zeroth-worker drain")
                elapsed = time.perf_counter() - started
            finally:
                await worker.graceful_shutdown()
        completed = registry.get_sample_value(
            "zeroth_runs_completed_total", {"deployment": DEPLOYMENT})
        assert completed == n, f"zeroth-worker completed {completed} of {n}"
        return elapsed

    async def drain_lease(self, n: int, *, concurrency: int, batch: int = 1,
                          max_concurrency: int | None = None) -> float:
        async with pool(self.dsn, concurrency) as loops:
            lm = LeaseManager(loops)

            async def loop(worker_id: str) -> int:
                done = 0
                while True:
                    claim = await lm.claim_and_start(
                        DEPLOYMENT, worker_id, batch_size=batch, max_concurrency=max_concurrency)
                    if not claim.runs:
                        if claim.concurrency_saturated:
                            await asyncio.sleep(0)
                            continue
                        return done
                    results = await lm.complete_runs(
                        worker_id, [(run.run_id, run.lease_generation) for run in claim.runs])
                    assert all(result.completed for result in results)
                    done += len(results)

            started = time.perf_counter()
            done = await asyncio.gather(*(loop(f"lease-{i}") for i in range(concurrency)))
            elapsed = time.perf_counter() - started
        assert sum(done) == n, f"zeroth-lease finished {sum(done)} of {n}"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        latencies = Latencies()

        async def handler(run: Any) -> None:
            latencies.start(run.run_id)

        async with pool(self.dsn, 10) as workers:
            worker = RunWorker(workers, DEPLOYMENT, handler, dsn=self.dsn, max_concurrency=8,
                               metrics=WorkerMetrics.create(CollectorRegistry()))
            await worker.start()
            try:
                assert worker.notifier is not None
                await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
                await produce(latencies, self.label, self.dsn, n, gap)
            finally:
                await worker.graceful_shutdown()
        return latencies.milliseconds()


# ---------------------------------------------------------------------------------------------
# The raw floor and the seed-style baseline (plain asyncpg, their own tables)

_RAW_SCHEMA = """
CREATE TABLE raw_jobs (
    id          bigserial PRIMARY KEY,
    status      text        NOT NULL DEFAULT 'pending',
    payload     jsonb       NOT NULL DEFAULT '{}',
    locked_at   timestamptz,
    finished_at timestamptz
) WITH (fillfactor = 80);
CREATE INDEX raw_jobs_pending_idx ON raw_jobs (id) WHERE status = 'pending';
"""

_RAW_CLAIM = """UPDATE raw_jobs j SET status = 'running', locked_at = now()
    FROM (SELECT p.id FROM raw_jobs p WHERE p.status = 'pending' ORDER BY p.id LIMIT $1
          FOR UPDATE SKIP LOCKED) c
   WHERE j.id = c.id
   RETURNING j.id, j.payload"""

_RAW_DONE = "UPDATE raw_jobs SET status = 'done', finished_at = now() WHERE id = ANY($1::bigint[])"


class Raw(System):
    """The floor: claim ``batch`` rows with one UPDATE … SKIP LOCKED, mark them done with one
    UPDATE. What any Postgres queue must at least do for a run."""

    label = "raw"
    schema = _RAW_SCHEMA

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE raw_jobs")

    async def enqueue(self, n: int, *, status: str = "pending") -> None:
        for start in range(0, n, 100_000):
            await self.conn.execute(
                """INSERT INTO raw_jobs (status, finished_at)
                   SELECT $1, CASE WHEN $1 = 'done' THEN now() END
                     FROM generate_series(1, $2)""",
                "done" if status == "completed" else status, min(100_000, n - start))

    async def drain(self, n: int, *, concurrency: int, batch: int = 1) -> float:
        async with pool(self.dsn, concurrency) as loops:

            async def loop() -> int:
                done = 0
                async with loops.acquire() as conn:
                    while rows := await conn.fetch(_RAW_CLAIM, batch):
                        await conn.execute(_RAW_DONE, [row["id"] for row in rows])
                        done += len(rows)
                return done

            started = time.perf_counter()
            done = await asyncio.gather(*(loop() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        assert sum(done) == n, f"raw finished {sum(done)} of {n}"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        """LISTEN on a dedicated connection; the producer inserts and notifies in one statement."""
        latencies = Latencies()
        wake = asyncio.Event()
        listener = await asyncpg.connect(self.dsn)
        consumer = await asyncpg.connect(self.dsn)
        await listener.add_listener("raw_wakeup", lambda *_: wake.set())

        async def consume() -> None:
            while True:
                await wake.wait()
                wake.clear()
                while rows := await consumer.fetch(_RAW_CLAIM, 1):
                    for row in rows:
                        latencies.start(row["id"])
                    await consumer.execute(_RAW_DONE, [row["id"] for row in rows])

        try:
            await produce_while(consume(), latencies, self.label, self.dsn, n, gap)
        finally:
            await listener.close()
            await consumer.close()
        return latencies.milliseconds()


_SEED_SCHEMA = """
CREATE TABLE seed_runs (
    tenant_id         text        NOT NULL,
    workspace_scope   text        NOT NULL,
    run_id            uuid        NOT NULL,
    deployment_ref    text        NOT NULL,
    status            text        NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    payload           jsonb       NOT NULL DEFAULT '{}',
    lease_worker_id   text,
    lease_acquired_at timestamptz,
    lease_expires_at  timestamptz,
    lease_generation  integer     NOT NULL DEFAULT 0,
    failure_count     integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, workspace_scope, run_id)
);
CREATE INDEX idx_runs_dispatch ON seed_runs (tenant_id, deployment_ref, status, lease_expires_at);
CREATE TABLE seed_admission (
    tenant_id       text NOT NULL,
    workspace_scope text NOT NULL,
    deployment_ref  text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, workspace_scope, deployment_ref)
);
CREATE TABLE seed_policies (
    tenant_id       text NOT NULL,
    deployment_ref  text NOT NULL,
    max_concurrency integer,
    PRIMARY KEY (tenant_id, deployment_ref)
);
"""

_SEED_SCOPE = ("default", "null", DEPLOYMENT)


class Seed(System):
    """Upstream Zeroth's claim, start and completion as client-side SQL (seed-spec §12).

    With ``admission`` on (a guardrail policy with max_concurrency, upstream's default of 8 in
    production), every claim locks the deployment's one admission row FOR UPDATE and counts the
    live leases under it, so claims serialise. Off: the policy read still happens, the admission
    lock and the count do not (upstream without a concurrency policy).
    """

    label = "seed"
    schema = _SEED_SCHEMA

    async def setup(self) -> None:
        await super().setup()
        await self.conn.execute(
            "INSERT INTO seed_admission (tenant_id, workspace_scope, deployment_ref) "
            "VALUES ($1, $2, $3)", *_SEED_SCOPE)

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE seed_runs")

    async def enqueue(self, n: int, *, status: str = "pending") -> None:
        for start in range(0, n, 100_000):
            await self.conn.execute(
                """INSERT INTO seed_runs (tenant_id, workspace_scope, run_id, deployment_ref,
                                          status, started_at)
                   SELECT $1, $2, gen_random_uuid(), $3, $4,
                          clock_timestamp() + g * interval '1 microsecond'
                     FROM generate_series(1, $5) AS g""",
                *_SEED_SCOPE, status.upper(), min(100_000, n - start))

    async def set_policy(self, max_concurrency: int | None) -> None:
        await self.conn.execute(
            """INSERT INTO seed_policies (tenant_id, deployment_ref, max_concurrency)
               VALUES ($1, $2, $3) ON CONFLICT (tenant_id, deployment_ref)
               DO UPDATE SET max_concurrency = excluded.max_concurrency""",
            "default", DEPLOYMENT, max_concurrency)

    @staticmethod
    async def claim(conn: asyncpg.Connection, worker_id: str,
                    lease_seconds: float = 60.0) -> tuple[uuid.UUID, int] | None:
        tenant, scope, deployment = _SEED_SCOPE
        limit = await conn.fetchval(
            "SELECT p.max_concurrency FROM seed_policies p "
            "WHERE p.tenant_id = $1 AND p.deployment_ref = $2", tenant, deployment)
        async with conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '5s'")
            if limit is not None:
                now = await conn.fetchval(
                    "SELECT clock_timestamp() FROM seed_admission a WHERE a.tenant_id = $1 "
                    "AND a.workspace_scope = $2 AND a.deployment_ref = $3 FOR UPDATE",
                    tenant, scope, deployment)
                active = await conn.fetchval(
                    "SELECT count(*) FROM seed_runs r WHERE r.tenant_id = $1 "
                    "AND r.workspace_scope = $2 AND r.deployment_ref = $3 "
                    "AND r.status IN ('PENDING', 'RUNNING') AND r.lease_worker_id IS NOT NULL "
                    "AND r.lease_expires_at >= $4", tenant, scope, deployment, now)
                if active >= limit:
                    return None
            else:
                now = await conn.fetchval("SELECT clock_timestamp()")
            run_id = await conn.fetchval(
                "SELECT r.run_id FROM seed_runs r WHERE r.tenant_id = $1 "
                "AND r.workspace_scope = $2 AND r.deployment_ref = $3 AND r.status = 'PENDING' "
                "AND (r.lease_worker_id IS NULL OR r.lease_expires_at < $4) "
                "ORDER BY r.started_at LIMIT 1 FOR UPDATE SKIP LOCKED",
                tenant, scope, deployment, now)
            if run_id is None:
                return None
            generation = await conn.fetchval(
                "UPDATE seed_runs r SET lease_worker_id = $4, lease_acquired_at = $5::timestamptz, "
                "lease_expires_at = $5::timestamptz + make_interval(secs => $6), "
                "lease_generation = r.lease_generation + 1 "
                "WHERE r.tenant_id = $1 AND r.workspace_scope = $2 AND r.run_id = $3 "
                "RETURNING r.lease_generation", tenant, scope, run_id, worker_id, now,
                lease_seconds)
        return run_id, generation

    @staticmethod
    async def fenced(conn: asyncpg.Connection, assignment: str, expected_status: str,
                     run_id: uuid.UUID, worker_id: str, generation: int) -> bool:
        """One fenced UPDATE: holder, generation and live lease in the predicate."""
        status = await conn.execute(
            f"UPDATE seed_runs r SET {assignment} WHERE r.tenant_id = 'default' "
            "AND r.workspace_scope = 'null' AND r.run_id = $1 AND r.status = $2 "
            "AND r.lease_worker_id = $3 AND r.lease_generation = $4 "
            "AND r.lease_expires_at >= clock_timestamp()",
            run_id, expected_status, worker_id, generation)
        return bool(status == "UPDATE 1")

    async def run_one(self, conn: asyncpg.Connection, run_id: uuid.UUID, worker_id: str,
                      generation: int, on_start: Callable[[uuid.UUID], None] | None = None) -> None:
        assert await self.fenced(conn, "status = 'RUNNING'", "PENDING", run_id, worker_id,
                                 generation)
        if on_start is not None:
            on_start(run_id)
        assert await self.fenced(
            conn, "status = 'COMPLETED', lease_worker_id = NULL, lease_acquired_at = NULL, "
            "lease_expires_at = NULL", "RUNNING", run_id, worker_id, generation)

    async def drain(self, n: int, *, concurrency: int, admission: bool = True) -> float:
        await self.set_policy(1_000_000 if admission else None)
        async with pool(self.dsn, concurrency) as loops:

            async def loop(worker_id: str) -> int:
                done = 0
                async with loops.acquire() as conn:
                    while claimed := await self.claim(conn, worker_id):
                        await self.run_one(conn, claimed[0], worker_id, claimed[1])
                        done += 1
                return done

            started = time.perf_counter()
            done = await asyncio.gather(*(loop(f"seed-{i}") for i in range(concurrency)))
            elapsed = time.perf_counter() - started
        assert sum(done) == n, f"seed finished {sum(done)} of {n}"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        """Upstream's default wakeup path: no ARQ, a poll every 0.5 s."""
        await self.set_policy(8)
        latencies = Latencies()
        consumer = await asyncpg.connect(self.dsn)

        async def consume() -> None:
            while True:
                claimed = await self.claim(consumer, "seed-latency")
                if claimed is None:
                    await asyncio.sleep(0.5)
                    continue
                await self.run_one(consumer, claimed[0], "seed-latency", claimed[1],
                                   on_start=latencies.start)

        try:
            await produce_while(consume(), latencies, self.label, self.dsn, n, gap)
        finally:
            await consumer.close()
        return latencies.milliseconds()

    async def renew_each(self, conn: asyncpg.Connection, worker_id: str,
                         leases: list[tuple[uuid.UUID, int]]) -> int:
        """Upstream renews one run per transaction: read the row, lock the admission row,
        sample the clock, guarded UPDATE. Returns how many were renewed."""
        tenant, scope, deployment = _SEED_SCOPE
        renewed = 0
        for run_id, generation in leases:
            async with conn.transaction():
                await conn.fetchrow(
                    "SELECT r.status, r.lease_worker_id, r.lease_generation FROM seed_runs r "
                    "WHERE r.tenant_id = $1 AND r.workspace_scope = $2 AND r.run_id = $3",
                    tenant, scope, run_id)
                now = await conn.fetchval(
                    "SELECT clock_timestamp() FROM seed_admission a WHERE a.tenant_id = $1 "
                    "AND a.workspace_scope = $2 AND a.deployment_ref = $3 FOR UPDATE",
                    tenant, scope, deployment)
                status = await conn.execute(
                    "UPDATE seed_runs r "
                    "SET lease_expires_at = $5::timestamptz + interval '60 seconds' "
                    "WHERE r.tenant_id = $1 AND r.workspace_scope = $2 AND r.run_id = $3 "
                    "AND r.lease_worker_id = $4 AND r.lease_generation = $6 "
                    "AND r.lease_expires_at >= $5", tenant, scope, run_id, worker_id, now,
                    generation)
                renewed += status == "UPDATE 1"
        return renewed


# ---------------------------------------------------------------------------------------------
# Peers


class PgQueuer(System):
    """pgqueuer (latest release) on its own database: its QueueManager on one dedicated asyncpg
    connection (as its performance guide recommends), its ``pgq autovac`` settings, durable
    tables (the default, like zeroth_pg's), ``batch_size`` and ``max_concurrent_tasks`` set."""

    label = "pgqueuer"
    queries: Any = None

    async def setup(self) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        await super().setup()
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()
        await self.queries.optimize_autovacuum()

    async def reconnect(self) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        await super().reconnect()
        self.queries = Queries(AsyncpgDriver(self.conn))

    async def reset(self) -> None:
        await self.queries.clear_queue()
        await self.queries.clear_queue_log()
        await self.queries.clear_statistics_log()

    async def enqueue(self, n: int) -> None:
        for start in range(0, n, 10_000):
            size = min(10_000, n - start)
            await self.queries.enqueue(["noop"] * size, [None] * size, [0] * size)

    @staticmethod
    def max_tasks(concurrency: int, batch: int) -> int:
        """pgqueuer refuses max_concurrent_tasks < 2 × batch_size."""
        return max(concurrency, 2 * batch)

    async def _manager(self, handler: Callable[[Any], Any]) -> tuple[Any, asyncpg.Connection]:
        from pgqueuer import PgQueuer as PgQ

        conn = await asyncpg.connect(self.dsn)
        pgq = PgQ.from_asyncpg_connection(conn)
        pgq.entrypoint("noop")(handler)
        return pgq, conn

    async def drain(self, n: int, *, concurrency: int, batch: int) -> float:
        from pgqueuer.domain.types import QueueExecutionMode

        async def handler(_job: Any) -> None:
            return None

        pgq, conn = await self._manager(handler)
        try:
            started = time.perf_counter()
            await asyncio.wait_for(pgq.run(
                batch_size=batch, max_concurrent_tasks=self.max_tasks(concurrency, batch),
                mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1),
                log_aggregation_interval=timedelta(0)), timeout=DRAIN_TIMEOUT)
            elapsed = time.perf_counter() - started
        finally:
            await conn.close()
        left = await self.conn.fetchval("SELECT count(*) FROM pgqueuer")
        assert left == 0, f"pgqueuer left {left} of {n} jobs"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        latencies = Latencies()

        async def handler(job: Any) -> None:
            latencies.start(job.id)

        pgq, conn = await self._manager(handler)
        task = asyncio.create_task(pgq.run(batch_size=10, max_concurrent_tasks=20,
                                           dequeue_timeout=timedelta(seconds=30)))
        try:
            await asyncio.sleep(0.5)  # verify_structure and LISTEN
            await produce(latencies, self.label, self.dsn, n, gap)
        finally:
            pgq.shutdown.set()
            await asyncio.wait_for(task, timeout=30)
            await conn.close()
        return latencies.milliseconds()


class Procrastinate(System):
    """procrastinate (latest release) on its own database: the async worker with
    ``concurrency`` = the scenario's, a psycopg pool larger than it, LISTEN/NOTIFY on."""

    label = "procrastinate"

    def _app(self, pool_size: int) -> tuple[Any, Any]:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=self.dsn, min_size=min(4, pool_size), max_size=pool_size))
        return app, app.task(name="noop", queue="bench", pass_context=True)

    async def setup(self) -> None:
        await super().setup()
        app, _ = self._app(2)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def reset(self) -> None:
        await self.conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    async def enqueue(self, n: int) -> None:
        app, register = self._app(2)

        async def handler(_context: Any) -> None:
            return None

        task = register(handler)
        async with app.open_async():
            for start in range(0, n, 5_000):
                await task.batch_defer_async(*({} for _ in range(min(5_000, n - start))))

    async def drain(self, n: int, *, concurrency: int) -> float:
        app, register = self._app(concurrency + 4)

        async def handler(_context: Any) -> None:
            return None

        register(handler)
        async with app.open_async():
            started = time.perf_counter()
            await asyncio.wait_for(app.run_worker_async(
                queues=["bench"], concurrency=concurrency, wait=False,
                install_signal_handlers=False, listen_notify=True), timeout=DRAIN_TIMEOUT)
            elapsed = time.perf_counter() - started
        left = await self.conn.fetchval(
            "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
        assert left == 0, f"procrastinate left {left} of {n} jobs"
        return elapsed

    async def latency(self, n: int, gap: float) -> list[float]:
        latencies = Latencies()
        app, register = self._app(8)

        async def handler(context: Any) -> None:
            latencies.start(context.job.id)

        register(handler)
        async with app.open_async():
            worker = asyncio.create_task(app.run_worker_async(
                queues=["bench"], concurrency=4, install_signal_handlers=False,
                listen_notify=True, fetch_job_polling_interval=30))
            try:
                await asyncio.sleep(0.5)  # worker registration and LISTEN
                await produce(latencies, self.label, self.dsn, n, gap)
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(worker, timeout=30)
        return latencies.milliseconds()
