"""Attempt history: what writing zeroth.run_attempts costs the hot path.

    python -m bench.attempt_history [DSN] [--runs N] [--batch B] [--rounds R] [--durable]

DSN: a migrated database (default: a throwaway embedded server, migrated here; its tuning is
fsync, synchronous_commit and full_page_writes off, the CPU-bound view where the history's cost is
the largest share; --durable turns the three on with ALTER SYSTEM first). Two workloads, each
timed around the SQL calls only:

* chain — the RunWorker's path at concurrency 1: complete_and_claim completes the previous run
  and claims and starts the next, one call per run (one history row per call: the attempt it
  ends);
* batch — claim_and_start of B runs, then complete_runs of those B;
* worker — end to end: a RunWorker with max_concurrency 32 drains N enqueued no-op runs (its
  own claim, renewal and completion batching: complete_and_claim and complete_runs), timed from
  its start to the last completion.

Three variants of the same schema, in alternating rounds (the order rotated every round, so drift
on a shared machine hits all alike):

* ``shipped`` — as installed: the completion functions insert their ended attempts set-based in
  the completing statement (one INSERT … SELECT per batch), the trigger runs_attempt_history
  skips those completions;
* ``trigger`` — the previous design: the completion functions without their INSERT and the
  trigger without that exception (one trigger call and one INSERT per completed run);
* ``none`` — no history: the completion functions without their INSERT, the trigger disabled.

The variants are made from the shipped files in sql/functions (the ``recorded`` CTE cut out, the
trigger's exception cut out) and the shipped definitions are restored at the end. Every run
costs the history one row when its attempt ends; its claim and its start write nothing (the open
attempt is read from zeroth.runs by zeroth.attempt_history). Nothing asserts a speed: numbers go
to stdout (a noisy shared machine gives noisy numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
import uuid
from uuid import UUID

import asyncpg

from bench.harness import migrated_or_throwaway, wait_until
from bench.harness import pool as worker_pool
from zeroth_pg import LeaseManager, RunWorker
from zeroth_pg.migrate import sql_functions_dir

VARIANTS = ("shipped", "trigger", "none")
#: The settle path's file: zeroth._settle writes its ended attempts in a CTE named ``recorded``.
COMPLETIONS = ("internal/settle.sql",)
#: The trigger's exception for the ends the settle path records itself.
EXCEPTION = re.compile(r"\n\s*AND NEW\.attempt_recorded_generation IS DISTINCT FROM "
                       r"OLD\.lease_generation")
TRIGGER = re.compile(r"CREATE OR REPLACE TRIGGER runs_attempt_history.*?;", re.S)


def _variant_sql() -> dict[str, list[str]]:
    """The statements that install each variant (``shipped`` restores the files as they are)."""
    functions = sql_functions_dir()
    shipped = [(functions / name).read_text() for name in COMPLETIONS]
    without_insert = [re.sub(r"    \), recorded AS \(.*?\n(    \), freed AS \()", r"\1", text,
                             count=1, flags=re.S) for text in shipped]
    assert all("recorded AS" not in text for text in without_insert), "recorded CTE not found"
    match = TRIGGER.search((functions / "triggers.sql").read_text())
    assert match, "runs_attempt_history not found in triggers.sql"
    trigger = match.group(0)
    every_end = EXCEPTION.sub("", trigger)
    assert every_end != trigger, "the trigger's completion exception was not found"
    enable = "ALTER TABLE zeroth.runs ENABLE TRIGGER runs_attempt_history"
    return {"shipped": [*shipped, trigger, enable],
            "trigger": [*without_insert, every_end, enable],
            "none": [*without_insert, trigger,
                     "ALTER TABLE zeroth.runs DISABLE TRIGGER runs_attempt_history"]}


async def _enqueue(lm: LeaseManager, deployment: str, n: int) -> None:
    for i in range(0, n, 1000):
        await lm.enqueue_runs(deployment, [{} for _ in range(min(1000, n - i))])


async def chain(lm: LeaseManager, deployment: str, n: int) -> float:
    """Seconds for n runs through complete_and_claim, one call per run."""
    started = time.perf_counter()
    claim = await lm.claim_and_start(deployment, "bench")
    done = 0
    while claim.runs:
        run = claim.runs[0]
        result = await lm.complete_and_claim(deployment, "bench",
                                             [(run.run_id, run.lease_generation, {"ok": True})])
        assert result.completions[0].completed
        done += 1
        claim = result.claim
    assert done == n, done
    return time.perf_counter() - started


async def batch(lm: LeaseManager, deployment: str, n: int, size: int) -> float:
    """Seconds for n runs claimed and completed size at a time."""
    spent = 0.0
    done = 0
    while done < n:
        started = time.perf_counter()
        claim = await lm.claim_and_start(deployment, "bench", batch_size=size)
        leases: list[tuple[UUID, int, object]] = [
            (c.run_id, c.lease_generation, {"ok": True}) for c in claim.runs]
        completed = await lm.complete_runs("bench", leases)
        spent += time.perf_counter() - started
        assert leases
        assert all(c.completed for c in completed)
        done += len(leases)
    return spent


async def worker(dsn: str, deployment: str, n: int, concurrency: int = 32) -> float:
    """Seconds for a RunWorker to drain n enqueued runs (start to the last completion)."""
    handled = 0

    async def count(_run: object) -> None:
        nonlocal handled
        handled += 1

    async with worker_pool(dsn, min(concurrency + 3, 40)) as workers:
        run_worker = RunWorker(workers, deployment, count, dsn=dsn, max_concurrency=concurrency)
        started = time.perf_counter()
        await run_worker.start()
        try:
            await wait_until(lambda: handled >= n and not run_worker.active_run_ids,
                             limit=300, what="attempt-history worker drain")
            return time.perf_counter() - started
        finally:
            await run_worker.graceful_shutdown()


async def one_round(pool: asyncpg.Pool, dsn: str, n: int, size: int,
                    install: list[str]) -> tuple[float, float, float]:
    lm = LeaseManager(pool, lease_duration_seconds=600)
    chained, batched, drained = (f"bench-att-{kind}-{uuid.uuid4().hex[:8]}"
                                 for kind in ("c", "b", "w"))
    for deployment in (chained, batched, drained):
        await _enqueue(lm, deployment, n)
    async with pool.acquire() as conn, conn.transaction():
        for statement in install:
            await conn.execute(statement)
    await pool.expire_connections()  # no session keeps a plan of the other variant
    return (await chain(lm, chained, n), await batch(lm, batched, n, size),
            await worker(dsn, drained, n))


async def main_async(dsn: str, n: int, size: int, rounds: int, durable: bool) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    try:
        if durable:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                await pool.execute(f"ALTER SYSTEM SET {setting} = on")
            await pool.execute("SELECT pg_reload_conf()")
            await pool.expire_connections()
        settings = {s: await pool.fetchval(f"SHOW {s}")
                    for s in ("fsync", "synchronous_commit", "full_page_writes")}
        variants = _variant_sql()
        times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        try:
            await one_round(pool, dsn, min(n, 200), size, variants["shipped"])  # warm-up
            for r in range(rounds):
                for variant in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                    times[variant].append(await one_round(pool, dsn, n, size, variants[variant]))
        finally:
            async with pool.acquire() as conn, conn.transaction():
                for statement in variants["shipped"]:
                    await conn.execute(statement)
        history = await pool.fetchval("SELECT count(*) FROM zeroth.run_attempts")

        def line(values: list[float]) -> str:
            us = [v / n * 1e6 for v in values]
            return (f"median {statistics.median(us):7.1f} us/run (min {min(us):.1f}, "
                    f"max {max(us):.1f}; {n / statistics.median(values):.0f} runs/s)")

        print(f"server: {settings}; {n} runs per round, {rounds} rounds per variant; "
              f"{history} history rows in the table after all rounds")
        for index, name in ((0, "chain (complete_and_claim, c=1)"),
                            (1, f"batch (claim_and_start + complete_runs, B={size})"),
                            (2, "worker (RunWorker, max_concurrency 32)")):
            medians = {v: statistics.median(t[index] for t in times[v]) for v in VARIANTS}
            print(f"{name}:")
            for variant in VARIANTS:
                print(f"  {variant:8}: {line([t[index] for t in times[variant]])}")
            for variant in ("shipped", "trigger"):
                delta = (medians[variant] - medians["none"]) / n * 1e6
                print(f"  {variant} over none: {delta:+.1f} us/run; throughput "
                      f"{medians['none'] / medians[variant]:.1%} of none")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", nargs="?")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--durable", action="store_true",
                        help="fsync, synchronous_commit and full_page_writes on first")
    args = parser.parse_args()
    with migrated_or_throwaway(args.dsn) as dsn:
        asyncio.run(main_async(dsn, args.runs, args.batch, args.rounds, args.durable))


if __name__ == "__main__":
    main()
