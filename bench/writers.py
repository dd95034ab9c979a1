"""Many writers: a web service's request handlers, each enqueueing one run in its own transaction.

Issue 13: PostgreSQL takes one cluster-wide lock in the commit of every transaction that queued a
NOTIFY and holds it until the commit is flushed, so notifying writers commit one at a time and
lose group commit. zeroth_pg notifies only while a worker waits for work (the wakeup gate,
sql/functions/internal/notify.sql). This scenario measures what that is worth.

For P = 1, 16, 64 concurrent writers (the bench's throwaway server allows 250 connections; on
``ZEROTH_PG_BENCH_DSN`` it needs about 80 free) in one process (bench/producer.py ``--flood``),
each session enqueueing single runs in autocommit through the system's own enqueue path for a
few seconds, enqueue throughput in runs committed per second, with the system's consumer running:

* ``zeroth idle consumer`` — a RunWorker (32 slots, no-op handler) that keeps up and so waits for
  work between runs: writers notify while it waits;
* ``zeroth busy consumer`` — a RunWorker whose 2 slots are held by runs that never end: it claims
  nothing, so no writer notifies;
* ``zeroth always notifying`` — the idle consumer plus a session that holds every stripe of the
  scope's gate all the time, so every writer notifies (what every enqueue did before the gate);
* ``zeroth NOTIFY off`` — the idle consumer on a database whose ``zeroth._notify`` does nothing
  (the control: the cost of NOTIFY is the ratio to it);
* pgqueuer and procrastinate with their own consumers running (both notify on every enqueue).

For the zeroth idle cells it also reports enqueue→start latency from the runs table
(``started_at - created_at``, both the database clock: the enqueue's statement time to the
claim), for the runs created during the measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from bench.harness import Config, Result, ScenarioReport, Target, pool
from bench.systems import REPO_ROOT
from zeroth_pg.metrics import WorkerMetrics
from zeroth_pg.worker import RunWorker
from zeroth_pg.worker._gate import GateState

DEPLOYMENT = "bench"
NOTIFY_OFF = """CREATE OR REPLACE FUNCTION zeroth._notify(channel text, payload text) RETURNS void
    LANGUAGE sql VOLATILE BEGIN ATOMIC SELECT; END"""


async def flood(system: str, dsn: str, sessions: int, seconds: float) -> float:
    """Run ``sessions`` writers for ``seconds`` in their own process: runs committed per second."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.producer", "--flood", system, dsn, str(sessions),
        str(seconds), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"ready"
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    count, elapsed = (await proc.stdout.readline()).split()
    if await proc.wait() != 0:
        raise RuntimeError(f"the {system} writers failed (exit {proc.returncode})")
    return int(count) / float(elapsed)


@contextlib.asynccontextmanager
async def zeroth_consumer(dsn: str, *, busy: bool) -> AsyncIterator[None]:
    """A RunWorker on the scope: idle (32 slots, no-op handler) or busy (2 slots held for ever)."""
    never = asyncio.Event()

    async def handler(_run: Any) -> None:
        if busy:
            await never.wait()

    slots = 2 if busy else 32
    async with pool(dsn, slots + 4) as workers:
        if busy:
            await workers.execute(
                "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1,"
                " runs => '[{}, {}]'::jsonb)", DEPLOYMENT)
        worker = RunWorker(workers, DEPLOYMENT, handler, dsn=dsn, max_concurrency=slots,
                           lease_duration=30.0, shutdown_timeout=1.0,
                           metrics=WorkerMetrics.create(CollectorRegistry()))
        await worker.start()
        try:
            assert worker.notifier is not None
            await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
            deadline = asyncio.get_running_loop().time() + 10
            # Busy: both slots taken. Idle: it looked, found nothing and asked for the gate.
            while (len(worker.active_run_ids) < 2 if busy
                   else worker._gate.state is GateState.BUSY):
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError("the consumer did not settle")
                await asyncio.sleep(0.01)
            yield
        finally:
            never.set()
            await worker.graceful_shutdown()


@contextlib.asynccontextmanager
async def every_stripe_held(dsn: str) -> AsyncIterator[None]:
    """A session that holds every stripe of the scope's gate: every writer notifies."""
    conn = await asyncpg.connect(dsn)
    try:
        held = await conn.fetchval("SELECT zeroth.announce_idle(deployment_ref => $1)",
                                   DEPLOYMENT)
        assert len(held) == 8, held
        yield
    finally:
        await conn.close()


async def pgqueuer_consumer(system: Any) -> None:
    """pgqueuer's QueueManager with a no-op entrypoint until cancelled."""
    from pgqueuer import PgQueuer as PgQ

    conn = await asyncpg.connect(system.dsn)
    pgq = PgQ.from_asyncpg_connection(conn)

    async def handler(_job: Any) -> None:
        return None

    pgq.entrypoint("noop")(handler)
    try:
        await pgq.run(batch_size=10, max_concurrent_tasks=32,
                      dequeue_timeout=timedelta(seconds=30))
    finally:
        pgq.shutdown.set()
        await conn.close()


async def procrastinate_consumer(system: Any) -> None:
    """procrastinate's async worker (32 slots, LISTEN/NOTIFY on) until cancelled."""
    app, register = system._app(36)

    async def handler(_context: Any) -> None:
        return None

    register(handler)
    async with app.open_async():
        await app.run_worker_async(queues=["bench"], concurrency=32,
                                   install_signal_handlers=False, listen_notify=True)


async def pickup_ms(dsn: str) -> tuple[float, float]:
    """p50 / p99 of started_at - created_at (ms) over the runs the consumer started."""
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS p50,
                      percentile_cont(0.99) WITHIN GROUP (ORDER BY d) AS p99
                 FROM (SELECT extract(epoch FROM started_at - created_at) * 1000 AS d
                         FROM zeroth.runs WHERE started_at IS NOT NULL) s""")
        return float(row["p50"] or "nan"), float(row["p99"] or "nan")
    finally:
        await conn.close()


async def reset_zeroth(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE zeroth.runs, zeroth.admission_slots CASCADE")
        await conn.execute("VACUUM ANALYZE zeroth.runs")
    finally:
        await conn.close()


async def writers(cfg: Config, s: Any) -> ScenarioReport:
    seconds = 1.0 if cfg.quick else 6.0
    sessions_list = (4,) if cfg.quick else (1, 16, 64)
    rep = ScenarioReport("writers", f"Many writers: P sessions each enqueueing single runs in "
                         f"their own transaction, {seconds:g} s per cell, consumer running")
    gated = s.zeroth.dsn
    silent = await asyncio.to_thread(s.zeroth.server.zeroth_database, "zeroth_notify_off")
    off = await asyncpg.connect(silent)
    try:
        await off.execute(NOTIFY_OFF)
    finally:
        await off.close()

    Cell = Callable[[], contextlib.AbstractAsyncContextManager[None]]

    @contextlib.asynccontextmanager
    async def always(dsn: str) -> AsyncIterator[None]:
        async with every_stripe_held(dsn), zeroth_consumer(dsn, busy=False):
            yield

    @contextlib.asynccontextmanager
    async def peer(system: Any, consume: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
        await system.reset()
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)  # its LISTEN and registration
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=30)

    cells: list[tuple[str, str, str, Cell]] = [
        ("zeroth idle consumer", "zeroth", gated, lambda: zeroth_consumer(gated, busy=False)),
        ("zeroth busy consumer", "zeroth", gated, lambda: zeroth_consumer(gated, busy=True)),
        ("zeroth always notifying", "zeroth", gated, lambda: always(gated)),
        ("zeroth NOTIFY off", "zeroth", silent, lambda: zeroth_consumer(silent, busy=False)),
        ("pgqueuer", "pgqueuer", s.pgqueuer.dsn,
         lambda: peer(s.pgqueuer, lambda: pgqueuer_consumer(s.pgqueuer))),
        ("procrastinate", "procrastinate", s.procrastinate.dsn,
         lambda: peer(s.procrastinate, lambda: procrastinate_consumer(s.procrastinate))),
    ]
    rates: dict[tuple[str, int], float] = {}
    lines = ["| writers | system / consumer | enqueued runs/s | vs NOTIFY off | "
             "enqueue→start p50 / p99 ms |", "|---|---|---|---|---|"]
    for sessions in sessions_list:
        for label, system, dsn, consumer in cells:
            if system == "zeroth":
                await reset_zeroth(dsn)
            async with consumer():
                rate = await flood(system, dsn, sessions, seconds)
                latency = ""
                if "idle" in label or "off" in label or "always" in label:
                    await asyncio.sleep(0.5)  # the consumer catches up
                    p50, p99 = await pickup_ms(dsn)
                    latency = f"{p50:.1f} / {p99:.1f}"
                    for q, v in (("p50", p50), ("p99", p99)):
                        rep.results.append(Result(rep.name, label, f"enqueue_start_{q}", "ms",
                                                  (v,), {"writers": sessions},
                                                  higher_is_better=False))
            rates[(label, sessions)] = rate
            rep.results.append(Result(rep.name, label, "enqueue_rate", "runs/s", (rate,),
                                      {"writers": sessions}))
            control = rates.get(("zeroth NOTIFY off", sessions))
            lines.append(f"| {sessions} | {label} | {rate:.0f} | "
                         f"{'' if control is None else f'{rate / control:.2f}'} | {latency} |")
            print(lines[-1], flush=True)
    # Ratios against the control, once it is measured (it comes after the zeroth cells).
    table = []
    for line in lines:
        parts = line.split(" | ")
        if len(parts) == 5 and parts[0].strip("| ").isdigit():
            sessions, label = int(parts[0].strip("| ")), parts[1]
            control = rates.get(("zeroth NOTIFY off", sessions))
            if control:
                parts[3] = f"{rates[(label, sessions)] / control:.2f}"
            line = " | ".join(parts)
        table.append(line)
    rep.tables.append("\n".join(table))
    top = max(sessions_list)
    control = rates[("zeroth NOTIFY off", top)]
    for label in ("zeroth idle consumer", "zeroth busy consumer"):
        ratio = rates[(label, top)] / control
        rep.targets.append(Target(
            f"NOTIFY costs < 10% of enqueue throughput at {top} writers ({label})",
            f"{ratio:.2f} of the NOTIFY-off rate ({rates[(label, top)]:.0f} vs {control:.0f}/s)",
            ratio >= 0.9))
    rep.notes.append(
        "One producer process holds every writer session (bench/producer.py --flood); the "
        "consumer runs in the bench process. 'always notifying' is the same code with a session "
        "holding every stripe of the scope's wakeup gate, which makes every writer notify: the "
        "cost every enqueue paid before the gate. 'NOTIFY off' replaces zeroth._notify with a "
        "no-op in its own database (superuser; the measurement's control only). The peers notify "
        "on every enqueue (pgqueuer: a statement trigger; procrastinate: a row trigger). "
        "enqueue→start is started_at − created_at on the database clock.")
    return rep
