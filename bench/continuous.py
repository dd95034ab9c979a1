"""Continuous load from an empty queue: a producer at a fixed offered rate *while* the workers
consume, for every system, measured as production sees it.

Issue 13: an outside harness found zeroth_pg falling behind a steady producer from startup
(157 of 200 runs/s, pickup p50 0.5 s; 93 of 600 runs/s) until its connections were replaced.
The cause was plans cached while the table was empty (tests/plans/test_generic_plans*.py). The
drain scenarios never showed it: they start from a full queue, and their sessions never see an
empty table grow. This one does.

For each cell (offered rate, consumer concurrency W) and each system: a fresh queue (zeroth_pg:
a freshly migrated database; the peers: their tables emptied), new connections, a consumer with
W slots and a 1 ms handler, and one producer in the same process that every 10 ms enqueues the
runs that are due by then (through each system's own batch enqueue), for ``seconds``. Measured:
runs started per 5-second window (their median and minimum after the first 10 s: stalls show
in the minimum, not in a mean) and pickup latency (the producer's enqueue came back committed →
the handler starts) percentiles. The consumer then gets up to 30 s to finish the backlog.

The restart cells do the same and restart PostgreSQL (``pg_ctl restart -m fast``) half-way
through (quick runs: after 10 s, and the cell runs 37 s); the producer retries an enqueue that
failed. Measured besides: the 5 s windows that begin 10 s or more after the server is back
(the target: each ≥ 95% of the offered rate), the pickup p99 of the runs enqueued from then
on, and the first second after the restart in which ≥ 95% of the offered rate started
("recovered after"). Only on a server the bench started itself (not ``ZEROTH_PG_BENCH_DSN``).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench.harness import (
    Config,
    Result,
    ScenarioReport,
    Target,
    percentile,
    pool,
    wait_until,
)
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

Restart = Callable[[], None]


@dataclass
class Trace:
    """When each run's enqueue came back and when its handler started (perf_counter)."""

    t0: float = field(default_factory=time.perf_counter)
    acked: dict[int, float] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    #: (began, back) of the server restart, seconds after t0; None without one.
    restart: tuple[float, float] | None = None

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
                  enqueue: Callable[[list[int]], Awaitable[None]],
                  restart: Restart | None = None) -> int:
    """Enqueue ``rate`` runs per second for ``seconds``, every TICK the ones due by then; with
    ``restart``, call it (in a thread) at :func:`restart_at` and retry enqueues that fail."""
    sent = 0
    trace.t0 = time.perf_counter()
    restarting: asyncio.Task[None] | None = None

    async def restart_server(call: Restart) -> None:
        began = time.perf_counter() - trace.t0
        await asyncio.to_thread(call)
        trace.restart = (began, time.perf_counter() - trace.t0)

    while (elapsed := time.perf_counter() - trace.t0) < seconds:
        if restart is not None and restarting is None and elapsed >= restart_at(seconds):
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


async def _finish(trace: Trace, sent: int) -> None:
    """Give the consumer up to DRAIN_LIMIT seconds for the backlog (what it never starts shows
    in the report as started < sent)."""
    with contextlib.suppress(TimeoutError):
        await wait_until(lambda: len(trace.started) >= sent, limit=DRAIN_LIMIT,
                         what="the backlog", interval=0.05)


# -- one consumer + producer per system ----------------------------------------------------------

async def zeroth_cell(server: Any, trace: Trace, rate: float, concurrency: int,
                      seconds: float, restart: Restart | None) -> int:
    label = f"cont{int(rate)}w{concurrency}{'r' if restart else ''}"
    dsn = await asyncio.to_thread(server.zeroth_database, label)

    async def handler(run: Any) -> None:
        trace.start(run.payload["n"])
        await asyncio.sleep(HANDLER_SECONDS)

    async with pool(dsn, concurrency + 4) as workers, pool(dsn, 2) as producers:
        worker = RunWorker(workers, DEPLOYMENT, handler, dsn=dsn, max_concurrency=concurrency,
                           lease_duration=30.0, metrics=WorkerMetrics.create(CollectorRegistry()))
        lm = LeaseManager(producers)
        await worker.start()
        try:
            assert worker.notifier is not None
            await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
            sent = await produce(trace, rate, seconds, lambda numbers: lm.enqueue_runs(
                DEPLOYMENT, [{"payload": {"n": n}} for n in numbers]), restart)
            await _finish(trace, sent)
        finally:
            await worker.graceful_shutdown()
    return sent


async def pgqueuer_cell(system: Any, trace: Trace, rate: float, concurrency: int,
                        seconds: float, restart: Restart | None) -> int:
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

        sent = await produce(trace, rate, seconds, enqueue, restart)
        await _finish(trace, sent)
    finally:
        pgq.shutdown.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        with contextlib.suppress(Exception):  # broken by the restart
            await conn.close()
        await producer.close()
    return sent


async def procrastinate_cell(system: Any, trace: Trace, rate: float, concurrency: int,
                             seconds: float, restart: Restart | None) -> int:
    await system.reset()
    app, register = system._app(concurrency + 4)

    async def handler(_context: Any, n: int) -> None:
        trace.start(n)
        await asyncio.sleep(HANDLER_SECONDS)

    task = register(handler)
    async with app.open_async():
        worker = asyncio.create_task(app.run_worker_async(
            queues=["bench"], concurrency=concurrency, install_signal_handlers=False,
            listen_notify=True))
        try:
            await asyncio.sleep(0.5)  # worker registration and LISTEN

            async def enqueue(numbers: list[int]) -> None:
                await task.batch_defer_async(*({"n": n} for n in numbers))

            sent = await produce(trace, rate, seconds, enqueue, restart)
            await _finish(trace, sent)
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(worker, timeout=30)
    return sent


# -- the scenario ---------------------------------------------------------------------------------


def cells(cfg: Config) -> list[tuple[float, int, bool]]:
    """(offered runs/s, consumer slots, restart half-way): the outside harness's two cells, and
    the 600/s one again with a restart (quick: one cell, and it again with a restart)."""
    if cfg.quick:
        return [(200.0, 4, False), (200.0, 4, True)]
    return [(200.0, 4, False), (600.0, 32, False), (600.0, 32, True)]


def _window_starts(seconds: float) -> list[float]:
    return [i * WINDOW for i in range(int(seconds // WINDOW))]


async def continuous(cfg: Config, s: Any) -> ScenarioReport:
    seconds = 20.0 if cfg.quick else 60.0
    rep = ScenarioReport("continuous", f"Continuous load from an empty queue: a producer at a "
                         f"fixed rate while the consumer runs, {seconds:.0f} s per cell")
    systems: list[tuple[str, Callable[..., Awaitable[int]], Any]] = [
        ("zeroth-worker", zeroth_cell, s.zeroth.server),
        ("pgqueuer", pgqueuer_cell, s.pgqueuer),
        ("procrastinate", procrastinate_cell, s.procrastinate),
    ]
    restart = s.zeroth.server.restart
    lines = ["| offered / W | system | started | 5 s windows after 10 s: median (min) runs/s | "
             "pickup p50 / p99 / max ms |", "|---|---|---|---|---|"]
    restart_lines = ["| offered / W | system | started | restart took s | recovered after s | "
                     "windows from 10 s after: median (min) runs/s | pickup p99 from then ms |",
                     "|---|---|---|---|---|---|---|"]
    for rate, concurrency, restarts in cells(cfg):
        if restarts and restart is None:
            rep.notes.append("The restart cells need a server the bench started itself; "
                             "skipped on ZEROTH_PG_BENCH_DSN.")
            continue
        # Quick runs restart under zeroth_pg only (a peer that never recovers costs the whole
        # drain limit); full runs restart under every system.
        for name, cell, target in systems[:1] if restarts and cfg.quick else systems:
            trace = Trace()
            if restarts:
                length = restart_cell_seconds(seconds)
                sent = await cell(target, trace, rate, concurrency, length, restart)
                _restart_row(rep, restart_lines, trace, name, rate, concurrency, length, sent)
                await s.reconnect()  # every system's setup connection died with the server
                continue
            sent = await cell(target, trace, rate, concurrency, seconds, None)
            windows = trace.windows(seconds)[int(WARMUP // WINDOW):]
            pickups = trace.pickups_ms()
            params = {"offered": rate, "concurrency": concurrency}
            rep.results.append(Result(rep.name, name, "window_median", "runs/s",
                                      (statistics.median(windows),), params,
                                      extra={"windows": trace.windows(seconds), "sent": sent,
                                             "started": len(trace.started)}))
            rep.results.append(Result(rep.name, name, "window_min", "runs/s", (min(windows),),
                                      params))
            for q in (50, 99):
                rep.results.append(Result(rep.name, name, f"pickup_p{q}", "ms",
                                          (percentile(pickups, q),), params,
                                          higher_is_better=False))
            lines.append(
                f"| {rate:.0f}/s, W={concurrency} | {name} | {len(trace.started)} of {sent} | "
                f"{statistics.median(windows):.0f} ({min(windows):.0f}) | "
                f"{percentile(pickups, 50):.1f} / {percentile(pickups, 99):.1f} / "
                f"{max(pickups, default=float('nan')):.0f} |")
            if name == "zeroth-worker":
                kept_up = min(windows) >= 0.95 * rate
                p99 = percentile(pickups, 99)
                rep.targets.append(Target(
                    f"continuous {rate:.0f}/s W={concurrency}: every 5 s window after 10 s ≥ 95% "
                    "of offered, pickup p99 ≤ 100 ms",
                    f"min window {min(windows):.0f}/s ({100 * min(windows) / rate:.0f}%), "
                    f"p99 {p99:.1f} ms", kept_up and p99 <= 100))
            print(lines[-1], flush=True)
    rep.tables.append("\n".join(lines))
    if len(restart_lines) > 2:
        rep.tables.append("\n".join(restart_lines))
    rep.notes.append(
        "One process runs the producer and the consumer (as the outside harness did). The "
        "producer enqueues every 10 ms the runs due by then, in one call of the system's batch "
        "enqueue (zeroth_pg LeaseManager.enqueue_runs, pgqueuer Queries.enqueue, procrastinate "
        "batch_defer_async); pickup is from that call's return (committed) to the handler's "
        "start. zeroth_pg gets a freshly migrated database per cell (the bug this scenario "
        "guards against lived in sessions that met an empty table); the peers' tables are "
        "emptied and their connections are new. Restart cells: pg_ctl restart -m fast half-way, "
        "from a thread, while the producer keeps going (an enqueue that fails is retried every "
        f"{RETRY_PAUSE * 1000:.0f} ms; one that committed but lost its answer is enqueued twice, "
        "and only its first start counts).")
    return rep


def _restart_row(rep: ScenarioReport, lines: list[str], trace: Trace, name: str, rate: float,
                 concurrency: int, seconds: float, sent: int) -> None:
    """The restart cell's results: recovery, and the windows and pickups from RECOVERY_GRACE
    seconds after the server was back."""
    params = {"offered": rate, "concurrency": concurrency, "restart": True}
    assert trace.restart is not None
    began, back = trace.restart
    since = back + RECOVERY_GRACE
    all_windows = trace.windows(seconds)
    after = [w for start, w in zip(_window_starts(seconds), all_windows, strict=True)
             if start >= since]
    pickups = trace.pickups_ms(since)
    p99 = percentile(pickups, 99)
    recovered = trace.recovered_after(rate)
    rep.results.append(Result(rep.name, name, "restart_window_min", "runs/s",
                              (min(after, default=0.0),), params,
                              extra={"windows": all_windows, "sent": sent,
                                     "started": len(trace.started),
                                     "restart": [began, back], "recovered_after": recovered}))
    rep.results.append(Result(rep.name, name, "restart_pickup_p99", "ms", (p99,), params,
                              higher_is_better=False))
    median = statistics.median(after) if after else float("nan")
    lines.append(
        f"| {rate:.0f}/s, W={concurrency} | {name} | {len(trace.started)} of {sent} | "
        f"{back - began:.1f} | {'never' if recovered is None else f'{recovered:.0f}'} | "
        f"{median:.0f} ({min(after, default=float('nan')):.0f}) | {p99:.1f} |")
    print(lines[-1], flush=True)
    if name == "zeroth-worker":
        kept_up = bool(after) and min(after) >= 0.95 * rate
        rep.targets.append(Target(
            f"continuous {rate:.0f}/s W={concurrency}, PostgreSQL restarted half-way: back to "
            "≥ 95% of offered in every 5 s window and pickup p99 ≤ 100 ms within 10 s",
            f"recovered after {recovered} s; min window from 10 s after "
            f"{min(after, default=0.0):.0f}/s, p99 {p99:.1f} ms",
            kept_up and p99 <= 100 and recovered is not None and recovered <= RECOVERY_GRACE))
