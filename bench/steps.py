"""Durable steps: what recording a step costs.

    python -m bench.steps DSN [--calls N] [--runs R]

DSN: a migrated database (zeroth-pg migrate up). Two measurements, on one connection each:

* per call: ``record_step`` of N fresh steps of one leased run (a first run: lock the run row,
  check the lease, insert) and ``get_step`` of each (what a replay pays per recorded step);
  median and p99 in ms, round trip included;
* per run: R runs through a RunWorker (defaults, one process) with handlers of 0, 5 and 20
  steps of a trivial function; runs/s. A step of a first attempt is two round trips (get_step,
  record_step); of a replay, one.

Nothing asserts a speed: numbers go to stdout (a noisy shared machine gives noisy numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import asyncpg

from zeroth_pg import LeaseManager, RunContext, RunWorker


def _ms(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"median {statistics.median(values) * 1000:.3f} ms, p99 {p99 * 1000:.3f} ms"


async def per_call(pool: asyncpg.Pool, calls: int) -> dict[str, str]:
    lm = LeaseManager(pool)
    deployment = f"bench-steps-{uuid.uuid4().hex[:8]}"
    await lm.enqueue_run(deployment, {})
    claimed = await pool.fetchrow(
        """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
               worker_id => 'bench', lease_seconds => 3600) WHERE run_id IS NOT NULL""",
        deployment)
    assert claimed is not None
    run_id, generation = claimed["run_id"], claimed["lease_generation"]
    record: list[float] = []
    read: list[float] = []
    async with pool.acquire() as conn:
        for i in range(calls):
            started = time.perf_counter()
            await lm.record_step(run_id, "bench", f"s{i}", {"i": i}, generation=generation,
                                 conn=conn)
            record.append(time.perf_counter() - started)
        for i in range(calls):
            started = time.perf_counter()
            await lm.get_step(run_id, "bench", f"s{i}", generation=generation, conn=conn)
            read.append(time.perf_counter() - started)
        baseline: list[float] = []
        for _ in range(calls):
            started = time.perf_counter()
            await conn.fetchval("SELECT 1")
            baseline.append(time.perf_counter() - started)
    return {"record_step": _ms(record), "get_step": _ms(read), "SELECT 1": _ms(baseline)}


async def per_run(pool: asyncpg.Pool, runs: int, steps: int) -> float:
    deployment = f"bench-steps-{uuid.uuid4().hex[:8]}"
    done = asyncio.Event()
    finished = 0

    async def handler(run: RunContext) -> Any:
        nonlocal finished
        for i in range(steps):
            await run.step("s", lambda i=i: i)
        finished += 1
        if finished == runs:
            done.set()
        return steps

    lm = LeaseManager(pool)
    await lm.enqueue_runs(deployment, [{} for _ in range(runs)])
    worker = RunWorker(pool, deployment, handler)
    started = time.perf_counter()
    await worker.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - started
    finally:
        await worker.graceful_shutdown()
    return runs / elapsed


async def main_async(dsn: str, calls: int, runs: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
    try:
        for name, figure in (await per_call(pool, calls)).items():
            print(f"{name:12s} {figure}  ({calls} calls)")
        for steps in (0, 5, 20):
            rate = await per_run(pool, runs, steps)
            print(f"handler with {steps:2d} steps: {rate:8.1f} runs/s ({runs} runs, one worker)")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main_async(args.dsn, args.calls, args.runs))


if __name__ == "__main__":
    main()
