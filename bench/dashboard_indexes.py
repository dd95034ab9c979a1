"""The dashboard's two indexes on zeroth.runs: what they cost the claim and completion path.

    python -m bench.dashboard_indexes [DSN] [--runs N] [--rounds R]

``runs_created_idx (created_at, run_id)`` and ``runs_run_id_idx (run_id)`` (migration 0015: the
dashboard's keyset pages and lookups by run id alone; dropped by 0019) had no predicate, and every
claim and completion is a non-HOT update (it changes ``status``, which the partial indexes name),
so each of those updates inserts an entry into both: four index entries per run on top of the rest.
Two variants of one database in alternating rounds — ``with`` (both re-created) and ``without`` (as
installed since 0019) — on the workloads of bench/attempt_history.py: the ``complete_and_claim``
chain at c=1, ``claim_and_start`` + ``complete_runs`` batches of 100, and a RunWorker with
max_concurrency 32 draining the runs. DSN: a migrated database (default: a throwaway embedded
server, migrated here); fsync, synchronous_commit and full_page_writes are turned on first (the
durable profile). The database is left as installed (without them) at the end. Nothing asserts a
speed: numbers go to stdout. Not part of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid

import asyncpg

from bench.attempt_history import _enqueue, batch, chain, worker
from bench.harness import migrated_or_throwaway
from zeroth_pg import LeaseManager

CREATE = ["CREATE INDEX IF NOT EXISTS runs_created_idx ON zeroth.runs (created_at, run_id)",
          "CREATE INDEX IF NOT EXISTS runs_run_id_idx ON zeroth.runs (run_id)"]
VARIANTS = {"with": CREATE,
            "without": ["DROP INDEX IF EXISTS zeroth.runs_created_idx",
                        "DROP INDEX IF EXISTS zeroth.runs_run_id_idx"]}
WORKLOADS = ("chain (complete_and_claim, c=1)", "batch (claim_and_start + complete_runs, B=100)",
             "worker (RunWorker, max_concurrency 32)")


async def one_round(pool: asyncpg.Pool, dsn: str, n: int,
                    install: list[str]) -> tuple[float, float, float]:
    lm = LeaseManager(pool, lease_duration_seconds=600)
    chained, batched, drained = (f"bench-idx-{kind}-{uuid.uuid4().hex[:8]}" for kind in "cbw")
    for deployment in (chained, batched, drained):
        await _enqueue(lm, deployment, n)
    async with pool.acquire() as conn:
        for statement in install:
            await conn.execute(statement)
        await conn.execute("VACUUM ANALYZE zeroth.runs")
    await pool.expire_connections()  # no session keeps a plan made with the other variant
    return (await chain(lm, chained, n), await batch(lm, batched, n, 100),
            await worker(dsn, drained, n))


async def main_async(dsn: str, n: int, rounds: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    try:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            await pool.execute(f"ALTER SYSTEM SET {setting} = on")
        await pool.execute("SELECT pg_reload_conf()")
        await pool.expire_connections()
        times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        try:
            await one_round(pool, dsn, min(n, 200), CREATE)  # warm-up
            for r in range(rounds):
                for variant in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
                    times[variant].append(await one_round(pool, dsn, n, VARIANTS[variant]))
        finally:
            for statement in VARIANTS["without"]:
                await pool.execute(statement)
        print(f"durable; {n} runs per round, {rounds} rounds per variant (alternating)")
        for index, name in enumerate(WORKLOADS):
            rates = {v: [n / t[index] for t in times[v]] for v in VARIANTS}
            medians = {v: statistics.median(r) for v, r in rates.items()}
            print(f"{name}:")
            for variant, values in rates.items():
                print(f"  {variant:8}: median {medians[variant]:7.0f} runs/s "
                      f"(min {min(values):.0f}, max {max(values):.0f})")
            print(f"  with ÷ without: {medians['with'] / medians['without']:.1%}")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", nargs="?")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with migrated_or_throwaway(args.dsn) as dsn:
        asyncio.run(main_async(dsn, args.runs, args.rounds))


if __name__ == "__main__":
    main()
