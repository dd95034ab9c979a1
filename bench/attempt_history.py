"""Attempt history: what the trigger that writes zeroth.run_attempts costs the hot path.

    python -m bench.attempt_history [DSN] [--runs N] [--batch B] [--rounds R] [--durable]

DSN: a migrated database (default: a throwaway embedded server, migrated here; its tuning is
fsync, synchronous_commit and full_page_writes off, the CPU-bound view where a trigger's cost is
the largest share; --durable turns the three on with ALTER SYSTEM first). Two workloads, each
timed around the SQL calls only:

* chain — the RunWorker's path at concurrency 1: complete_and_claim completes the previous run
  and claims and starts the next, one call per run (one history row inserted per call: the
  attempt it ends);
* batch — claim_and_start of B runs, then complete_runs of those B.

Rounds alternate between the trigger enabled (as shipped) and disabled (ALTER TABLE … DISABLE
TRIGGER runs_attempt_history: the table without a history), the order flipped every round, so
drift on a shared machine hits both alike. Every run costs the history one INSERT (when its
attempt ends) through one index; its claim and its start write nothing (the open attempt is
read from zeroth.runs by zeroth.attempt_history). Nothing asserts a
speed: numbers go to stdout (a noisy shared machine gives noisy numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from uuid import UUID

import asyncpg

from zeroth_pg import LeaseManager

TRIGGERS = ("runs_attempt_history",)


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


async def one_round(pool: asyncpg.Pool, n: int, size: int, enabled: bool) -> tuple[float, float]:
    lm = LeaseManager(pool, lease_duration_seconds=600)
    chained, batched = (f"bench-att-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("c", "b"))
    await _enqueue(lm, chained, n)
    await _enqueue(lm, batched, n)
    verb = "ENABLE" if enabled else "DISABLE"
    for name in TRIGGERS:
        await pool.execute(f"ALTER TABLE zeroth.runs {verb} TRIGGER {name}")
    try:
        return await chain(lm, chained, n), await batch(lm, batched, n, size)
    finally:
        for name in TRIGGERS:
            await pool.execute(f"ALTER TABLE zeroth.runs ENABLE TRIGGER {name}")


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
        await one_round(pool, min(n, 200), size, True)  # warm-up
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for r in range(rounds):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                times[enabled].append(await one_round(pool, n, size, enabled))
        history = await pool.fetchval("SELECT count(*) FROM zeroth.run_attempts")

        def line(values: list[float]) -> str:
            us = [v / n * 1e6 for v in values]
            return (f"median {statistics.median(us):7.1f} us/run (min {min(us):.1f}, "
                    f"max {max(us):.1f}; {n / statistics.median(values):.0f} runs/s)")

        print(f"server: {settings}; {n} runs per round, {rounds} rounds per setting; "
              f"{history} history rows written in all")
        for index, name in ((0, "chain (complete_and_claim, c=1)"),
                            (1, f"batch (claim_and_start + complete_runs, B={size})")):
            on = [t[index] for t in times[True]]
            off = [t[index] for t in times[False]]
            delta = (statistics.median(on) - statistics.median(off)) / n * 1e6
            ratio = statistics.median(off) / statistics.median(on)
            print(f"{name}:")
            print(f"  history on  : {line(on)}")
            print(f"  history off : {line(off)}")
            print(f"  difference of medians: {delta:+.1f} us/run; throughput with/without "
                  f"{ratio:.1%}")
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
    with contextlib.ExitStack() as stack:
        dsn = args.dsn
        if dsn is None:
            from zeroth_pg import migrate
            from zeroth_pg._server import _start_embedded

            dsn, _ = _start_embedded(stack)
            migrate.upgrade(dsn)
        asyncio.run(main_async(dsn, args.runs, args.batch, args.rounds, args.durable))


if __name__ == "__main__":
    main()
