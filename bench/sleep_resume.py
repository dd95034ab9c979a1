"""Durable sleep: how long after its resume time T a sleeping run's handler is entered again,
with a RunWorker at its defaults (poll_interval 0.5 s). A sleeping run is not due, so nothing
notifies it: the worker's next poll after T claims it.

    python -m bench.sleep_resume DSN [--rounds N] [--seconds S]

DSN: a migrated database (zeroth-pg migrate up). One run sleeps N times for S seconds; for each
resume it prints the database time from T (the run_after sleep_run returned) to the handler's
entry, and the median and maximum. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from datetime import datetime
from typing import Any

import asyncpg

from zeroth_pg import LeaseManager, RunContext, RunWorker


async def measure(dsn: str, *, rounds: int, seconds: float) -> list[float]:
    """Resume delays in seconds, one per sleep of one run."""
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    deployment = f"bench-sleep-{uuid.uuid4().hex[:8]}"
    resume_at: list[datetime] = []
    delays: list[float] = []
    done = asyncio.Event()

    async def handler(run: RunContext) -> Any:
        entered = await pool.fetchval("SELECT clock_timestamp()")
        if resume_at:
            delays.append((entered - resume_at[-1]).total_seconds())
        if len(resume_at) == rounds:
            done.set()
            return {"rounds": rounds}
        try:
            await run.sleep(seconds, checkpoint={"round": len(resume_at) + 1})
        finally:
            if run.slept is not None and run.slept.run_after is not None:
                resume_at.append(run.slept.run_after)

    worker = RunWorker(pool, deployment, handler)  # every option at its default
    await worker.start()
    try:
        await LeaseManager(pool).enqueue_run(deployment, {})
        await asyncio.wait_for(done.wait(), timeout=rounds * (seconds + 10) + 30)
    finally:
        await worker.graceful_shutdown()
        await pool.close()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    delays = asyncio.run(measure(args.dsn, rounds=args.rounds, seconds=args.seconds))
    for n, delay in enumerate(delays, 1):
        print(f"resume {n}: {delay * 1000:.0f} ms after T")
    print(f"median {statistics.median(delays) * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms "
          f"({len(delays)} resumes, default RunWorker, poll_interval 0.5 s)")


if __name__ == "__main__":
    main()
