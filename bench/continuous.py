"""The load drivers of the cold-start cells (bench/cold_start.py): a producer at a fixed
offered rate *while* the consumer runs, or a queue held at a fixed depth, for every system.

Issue 13: an outside harness found zeroth_pg falling behind a steady producer from startup
(157 of 200 runs/s, pickup p50 0.5 s; 93 of 600 runs/s) until its connections were replaced.
The cause was plans cached while the table was empty (tests/plans/test_generic_plans*.py). The
drain scenarios never showed it: they start from a full queue, and their sessions never see an
empty table grow. Issue 30: the same harness on a stock PostgreSQL 15 with a monitor beside the
load; hence the cold-start scenario runs these cells on both server versions.

A cell (:class:`Load`) runs one system on its fresh database: new connections, a consumer with
W slots and a 1 ms handler, and one producer in the same process (pg-boss: in its Node process)
that either every 10 ms enqueues the runs due by then at the offered rate (through each
system's own batch enqueue), or keeps the queue ``depth`` deep (the queue's length read, then at
most 500 enqueued). :class:`Trace` records when each run's enqueue came back committed and when
its handler started: runs started per 5-second window and pickup latency. After a continuous
producer stops, the consumer gets up to ``drain_limit`` seconds to finish the backlog.

A restart cell restarts PostgreSQL (``pg_ctl restart -m fast``) ``restart_after`` seconds in,
from a thread; the producer retries an enqueue that failed ("recovered after": the first second
after the restart in which ≥ 95% of the offered rate started). Only on a server the bench
started itself (not ``ZEROTH_PG_BENCH_DSN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench import pgboss
from bench.harness import percentile, pool, wait_until
from zeroth_pg import LeaseManager
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.worker import RunWorker

DEPLOYMENT = "bench"
WINDOW = 5.0
WARMUP = 10.0
TICK = 0.01
HANDLER_SECONDS = 0.001
DRAIN_LIMIT = 30.0
RETRY_PAUSE = 0.05
RECOVERY_GRACE = 10.0
DEPTH_CHUNK = 500
DEPTH_PAUSE = 0.05

Restart = Callable[[], None]


@dataclass
class Trace:
    """When each run's enqueue came back and when its handler started (perf_counter)."""

    t0: float = field(default_factory=time.perf_counter)
    acked: dict[int, float] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    #: (began, back) of the server restart, seconds after t0; None without one.
    restart: tuple[float, float] | None = None
    #: Errors a peer's own process logged and survived (pg-boss: unhandled rejections).
    peer_errors: int = 0
    #: Set once the producer started (t0 is then the load's start).
    loading: asyncio.Event = field(default_factory=asyncio.Event)

    def start(self, n: int) -> None:
        self.started.setdefault(n, time.perf_counter())

    def windows(self, seconds: float) -> list[float]:
        """Runs started per second in each whole 5-second window of the producing time."""
        counts = [0] * int(seconds // WINDOW)
        for instant in self.started.values():
            index = int((instant - self.t0) // WINDOW)
            if 0 <= index < len(counts):
                counts[index] += 1
        return [c / WINDOW for c in counts]

    def window_p99(self, seconds: float) -> list[float]:
        """Pickup p99 (ms) of the runs acknowledged in each whole 5-second window (nan for a
        window with none, or whose runs never started)."""
        buckets: list[list[float]] = [[] for _ in range(int(seconds // WINDOW))]
        for n, acked in self.acked.items():
            index = int((acked - self.t0) // WINDOW)
            if 0 <= index < len(buckets) and n in self.started:
                buckets[index].append(1000 * (self.started[n] - acked))
        return [percentile(b, 99) for b in buckets]

    def pickups_ms(self, since: float = 0.0) -> list[float]:
        """Pickup latencies of the runs acknowledged ``since`` seconds after t0 or later."""
        return [1000 * (self.started[n] - acked) for n, acked in self.acked.items()
                if n in self.started and acked - self.t0 >= since]

    def recovered_after(self, rate: float) -> float | None:
        """Seconds from the server being back to the end of the first whole second after it
        in which ≥ 95% of the offered rate started; None if none did."""
        if self.restart is None:
            return None
        back = self.restart[1]
        starts = sorted(instant - self.t0 for instant in self.started.values())
        second = 0
        while back + second + 1 <= (starts[-1] if starts else 0):
            low, high = back + second, back + second + 1
            if sum(1 for t in starts if low <= t < high) >= 0.95 * rate:
                return second + 1.0
            second += 1
        return None


def restart_at(seconds: float) -> float:
    """When a restart cell restarts the server: half-way through a full cell; after the warm-up
    in a quick one (whose cells are short)."""
    return max(WARMUP, seconds / 2)


def restart_cell_seconds(seconds: float) -> float:
    """A restart cell runs long enough for three whole windows after the recovery grace."""
    return max(seconds, restart_at(seconds) + 2 + RECOVERY_GRACE + 3 * WINDOW)


async def produce(trace: Trace, rate: float, seconds: float,
                  enqueue: Callable[[list[int]], Awaitable[object]],
                  restart: Restart | None = None, restart_after: float | None = None) -> int:
    """Enqueue ``rate`` runs per second for ``seconds``, every TICK the ones due by then; with
    ``restart``, call it (in a thread) ``restart_after`` seconds in (default
    :func:`restart_at`) and retry enqueues that fail."""
    at = restart_at(seconds) if restart_after is None else restart_after
    sent = 0
    trace.t0 = time.perf_counter()
    trace.loading.set()
    restarting: asyncio.Task[None] | None = None

    async def restart_server(call: Restart) -> None:
        began = time.perf_counter() - trace.t0
        await asyncio.to_thread(call)
        trace.restart = (began, time.perf_counter() - trace.t0)

    while (elapsed := time.perf_counter() - trace.t0) < seconds:
        if restart is not None and restarting is None and elapsed >= at:
            restarting = asyncio.create_task(restart_server(restart))
        due = int(elapsed * rate)
        if due > sent:
            numbers = list(range(sent, due))
            try:
                await enqueue(numbers)
            except Exception:
                if restart is None:
                    raise
                await asyncio.sleep(RETRY_PAUSE)  # the server is restarting: try again
                continue
            acked = time.perf_counter()
            for n in numbers:
                trace.acked[n] = acked
            sent = due
        await asyncio.sleep(TICK)
    if restarting is not None:
        await restarting
    return sent


async def hold_depth(trace: Trace, depth: int, seconds: float,
                     enqueue: Callable[[list[int]], Awaitable[object]],
                     queued: Callable[[], Awaitable[int]]) -> int:
    """Keep ``depth`` runs queued for ``seconds``: read the queue's length, top it up with at
    most DEPTH_CHUNK per enqueue (the outside harness's producer), else wait DEPTH_PAUSE."""
    sent = 0
    trace.t0 = time.perf_counter()
    trace.loading.set()
    while time.perf_counter() - trace.t0 < seconds:
        room = min(DEPTH_CHUNK, depth - await queued())
        if room <= 0:
            await asyncio.sleep(DEPTH_PAUSE)
            continue
        numbers = list(range(sent, sent + room))
        await enqueue(numbers)
        acked = time.perf_counter()
        for n in numbers:
            trace.acked[n] = acked
        sent += room
    return sent


@dataclass(frozen=True, slots=True)
class Load:
    """What a cell's producer does: ``rate`` runs/s for ``seconds`` (with a server restart
    half-way when ``restart`` is given), or, with ``depth``, the queue held that deep."""

    seconds: float
    rate: float = 0.0
    depth: int | None = None
    restart: Restart | None = None
    restart_after: float = WARMUP
    #: How long the consumer gets for the backlog after a continuous producer stops.
    drain_limit: float = DRAIN_LIMIT

    async def drive(self, trace: Trace, enqueue: Callable[[list[int]], Awaitable[object]],
                    queued: Callable[[], Awaitable[int]]) -> int:
        if self.depth is not None:
            return await hold_depth(trace, self.depth, self.seconds, enqueue, queued)
        sent = await produce(trace, self.rate, self.seconds, enqueue, self.restart,
                             self.restart_after)
        await _finish(trace, sent, self.drain_limit)
        return sent


async def _finish(trace: Trace, sent: int, limit: float = DRAIN_LIMIT) -> None:
    """Give the consumer up to ``limit`` seconds for the backlog (what it never starts shows
    in the report as started < sent)."""
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: len(trace.started) >= sent, limit=limit,
                         what="the backlog", interval=0.05)


# -- one consumer + producer per system ----------------------------------------------------------
# Each takes the system's fresh database (zeroth_pg, pg-boss: a DSN; the Python peers: their
# System, set up on it), the trace, the load and the consumer's slots W; returns runs sent.

async def zeroth_cell(dsn: str, trace: Trace, load: Load, concurrency: int, *,
                      call_timeout: float | None = 5.0, claim_ahead: int = 0) -> int:
    """The RunWorker at its defaults but for the cell's settings; ``call_timeout`` is the
    worker's call bound (its default, 5 s; bench.cpu_per_run --call-timeout compares),
    ``claim_ahead`` its runs claimed beyond its handler slots (default 0)."""
    async def handler(run: Any) -> None:
        trace.start(run.payload["n"])
        await asyncio.sleep(HANDLER_SECONDS)

    async with pool(dsn, concurrency + 4) as workers, pool(dsn, 2) as producers:
        worker = RunWorker(workers, DEPLOYMENT, handler, dsn=dsn, max_concurrency=concurrency,
                           lease_duration=30.0, call_timeout=call_timeout,
                           claim_ahead=claim_ahead,
                           metrics=WorkerMetrics.create(CollectorRegistry()))
        lm = LeaseManager(producers)
        await worker.start()
        try:
            assert worker.notifier is not None
            await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
            return await load.drive(trace, lambda numbers: lm.enqueue_runs(
                DEPLOYMENT, [{"payload": {"n": n}} for n in numbers]),
                lambda: lm.count_pending(DEPLOYMENT))
        finally:
            await worker.graceful_shutdown()


async def pgqueuer_cell(system: Any, trace: Trace, load: Load, concurrency: int) -> int:
    from pgqueuer import AsyncpgPoolDriver, Queries
    from pgqueuer import PgQueuer as PgQ

    await system.reset()

    async def handler(job: Any) -> None:
        trace.start(int(job.payload.decode()))
        await asyncio.sleep(HANDLER_SECONDS)

    conn = await asyncpg.connect(system.dsn)
    # A pool of one for the producer: it replaces a connection a restart broke.
    producer = await asyncpg.create_pool(system.dsn, min_size=1, max_size=1)
    queries = Queries(AsyncpgPoolDriver(producer))
    pgq = PgQ.from_asyncpg_connection(conn)
    pgq.entrypoint("job")(handler)
    batch = max(1, min(10, concurrency // 2))
    task = asyncio.create_task(pgq.run(batch_size=batch,
                                       max_concurrent_tasks=max(concurrency, 2 * batch),
                                       dequeue_timeout=timedelta(seconds=30)))
    try:
        await asyncio.sleep(0.5)  # verify_structure and LISTEN

        async def enqueue(numbers: list[int]) -> None:
            await queries.enqueue(["job"] * len(numbers), [str(n).encode() for n in numbers],
                                  [0] * len(numbers))

        async def queued() -> int:
            return int(await producer.fetchval(
                "SELECT count(*) FROM pgqueuer WHERE status = 'queued'"))

        return await load.drive(trace, enqueue, queued)
    finally:
        pgq.shutdown.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        with contextlib.suppress(Exception):  # broken by the restart
            await conn.close()
        await producer.close()


async def procrastinate_cell(system: Any, trace: Trace, load: Load, concurrency: int) -> int:
    await system.reset()
    app, register = system._app(concurrency + 4)

    async def handler(_context: Any, n: int) -> None:
        trace.start(n)
        await asyncio.sleep(HANDLER_SECONDS)

    task = register(handler)
    counter = await asyncpg.create_pool(system.dsn, min_size=1, max_size=1)
    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(
            queues=["bench"], concurrency=concurrency, install_signal_handlers=False,
            listen_notify=True))
        try:
            await asyncio.sleep(0.5)  # worker registration and LISTEN

            async def enqueue(numbers: list[int]) -> None:
                await task.batch_defer_async(*({"n": n} for n in numbers))

            async def queued() -> int:
                return int(await counter.fetchval(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'"))

            return await load.drive(trace, enqueue, queued)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(worker, timeout=30)
            await counter.close()


async def pgboss_cell(dsn: str, trace: Trace, load: Load, concurrency: int) -> int:
    """pg-boss in a Node process of its own (bench/pgboss/driver.js): its times are converted
    to this trace (t0 = when the driver said it was ready, within milliseconds of its own)."""
    ready = asyncio.Event()

    async def origin() -> None:
        await ready.wait()
        trace.t0 = time.perf_counter()
        trace.loading.set()

    marking = asyncio.create_task(origin())
    restarting: asyncio.Task[None] | None = None
    if load.restart is not None:
        restart = load.restart

        async def restart_server() -> None:
            await ready.wait()
            await asyncio.sleep(load.restart_after)
            began = time.perf_counter() - trace.t0
            await asyncio.to_thread(restart)
            trace.restart = (began, time.perf_counter() - trace.t0)

        restarting = asyncio.create_task(restart_server())
    try:
        found = await pgboss.run(dsn, mode="depth" if load.depth is not None else "continuous",
                                 seconds=load.seconds, concurrency=concurrency, rate=load.rate,
                                 depth=load.depth or 0, drain=load.drain_limit,
                                 batch=concurrency, ready=ready)
    finally:
        marking.cancel()
        if restarting is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await restarting
    trace.peer_errors = int(found.get("unhandled", 0))
    for n, t in found["acked"]:
        trace.acked[int(n)] = trace.t0 + float(t)
    for n, t in found["started"]:
        trace.started.setdefault(int(n), trace.t0 + float(t))
    return int(found["sent"])


def window_starts(seconds: float) -> list[float]:
    return [i * WINDOW for i in range(int(seconds // WINDOW))]
