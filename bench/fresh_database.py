"""A fresh database before its first ANALYZE: a RunWorker's rate per 5-second window (issue 30).

    python -m bench.fresh_database DSN [--seconds 60] [--monitor] [--analyze-at S]

DSN: a freshly migrated database nobody has analyzed (``python -m zeroth_pg.migrate upgrade
--dsn DSN``), on a server with its stock settings; the script does not tune it. One process holds
the queue 4,000 deep with ``enqueue_runs`` while a RunWorker (max_concurrency 16, 1 ms handler,
lease 30 s) drains it. ``--monitor``: a session beside it runs ``pgstattuple('zeroth.runs')`` and
``pgstatindex('zeroth.runs_claim_pending_idx')`` every 5 s (it creates the extension), each one
a moment with the xmin horizon pinned. ``--analyze-at S``: a plain ``ANALYZE zeroth.runs`` once,
about S seconds in. Printed per window: runs started per second, the table's dead tuples and
whether an autovacuum or autoanalyze of zeroth.runs has run yet. Nothing asserts a speed; the
deterministic check is tests/plans/test_fresh_database.py (blocks read per call).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from zeroth_pg import LeaseManager, RunWorker
from zeroth_pg.metrics import WorkerMetrics

DEPLOYMENT = "fresh"
DEPTH = 4000


async def main_async(dsn: str, seconds: float, monitor: bool, analyze_at: float | None) -> None:
    started = 0

    async def handler(_ctx: Any) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(0.001)

    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=10)
    producers = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    lm = LeaseManager(producers)
    reader = await asyncpg.connect(dsn)
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            pending = await producers.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'pending'",
                DEPLOYMENT)
            if pending < DEPTH:
                await lm.enqueue_runs(DEPLOYMENT, [{"payload": {}}] * min(500, DEPTH - pending))
            else:
                await asyncio.sleep(0.05)

    async def watch() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            while not stop.is_set():
                await asyncio.sleep(5)
                await conn.fetchrow("SELECT * FROM pgstattuple('zeroth.runs')")
                await conn.fetchrow("SELECT * FROM pgstatindex('zeroth.runs_claim_pending_idx')")
        finally:
            await conn.close()

    for _ in range(DEPTH // 500):
        await lm.enqueue_runs(DEPLOYMENT, [{"payload": {}}] * 500)
    worker = RunWorker(pool, DEPLOYMENT, handler, dsn=dsn, max_concurrency=16, lease_duration=30.0,
                       metrics=WorkerMetrics.create(CollectorRegistry()))
    tasks = [asyncio.create_task(produce())]
    if monitor:
        tasks.append(asyncio.create_task(watch()))
    await worker.start()
    t0, last, analyzed = time.monotonic(), 0, False
    try:
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(5)
            if analyze_at is not None and not analyzed and time.monotonic() - t0 >= analyze_at:
                await reader.execute("ANALYZE zeroth.runs")
                analyzed = True
                print(f"-- ANALYZE zeroth.runs at {time.monotonic() - t0:.1f} s", flush=True)
            row = await reader.fetchrow(
                """SELECT n_dead_tup, autovacuum_count, autoanalyze_count
                     FROM pg_stat_user_tables WHERE relid = 'zeroth.runs'::regclass""")
            print(f"{time.monotonic() - t0:6.1f} s  {(started - last) / 5:7.0f} runs/s  "
                  f"dead {row['n_dead_tup']:7d}  autovacuums {row['autovacuum_count']}  "
                  f"autoanalyzes {row['autoanalyze_count']}", flush=True)
            last = started
    finally:
        stop.set()
        await worker.graceful_shutdown()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await reader.close()
        await pool.close()
        await producers.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dsn")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--monitor", action="store_true")
    parser.add_argument("--analyze-at", type=float, default=None)
    args = parser.parse_args()
    asyncio.run(main_async(args.dsn, args.seconds, args.monitor, args.analyze_at))


if __name__ == "__main__":
    main()
