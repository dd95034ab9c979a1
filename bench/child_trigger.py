"""Child runs: what the trigger that reports a child's end costs the hot path.

    python -m bench.child_trigger [DSN] [--runs N] [--batch B] [--rounds R]

DSN: a migrated database (default: a throwaway embedded server, migrated here). Each round
enqueues N runs that are no child, claims them (claim_and_start, batches of B) and completes
them with complete_runs in batches of B; only the complete_runs calls are timed. Rounds
alternate between the triggers enabled (as shipped) and disabled (ALTER TABLE … DISABLE
TRIGGER runs_child_run_finished, runs_cancel_children: what the table costs without them), so
drift on a shared machine hits both alike. Two last measurements complete N children of one
parent (parent_run_id set: the trigger runs and copies the outcome), first while the parent is
not waiting, then while it waits for all N (fan-in: each end also counts the wait down).

The guard is the trigger's WHEN (NEW.parent_run_id IS NOT NULL …), evaluated before any call is
queued, so a run that is no child should pay one NULL test. Nothing asserts a speed: numbers go
to stdout (a noisy shared machine gives noisy numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from uuid import UUID

import asyncpg

from bench.harness import migrated_or_throwaway
from zeroth_pg import LeaseManager

TRIGGERS = ("runs_child_run_finished", "runs_cancel_children")


async def _leased(lm: LeaseManager, deployment: str, n: int, batch: int) -> list[tuple[UUID, int]]:
    leases: list[tuple[UUID, int]] = []
    while len(leases) < n:
        result = await lm.claim_and_start(deployment, "bench", batch_size=batch)
        leases += [(c.run_id, c.lease_generation) for c in result.runs]
        if not result.runs:
            break
    return leases


async def _complete(lm: LeaseManager, leases: list[tuple[UUID, int]], batch: int) -> float:
    """Seconds spent in complete_runs over all the leases."""
    spent = 0.0
    for i in range(0, len(leases), batch):
        chunk = [(run_id, gen, {"ok": True}) for run_id, gen in leases[i:i + batch]]
        started = time.perf_counter()
        done = await lm.complete_runs("bench", chunk)
        spent += time.perf_counter() - started
        assert all(c.completed for c in done)
    return spent


async def one_round(pool: asyncpg.Pool, n: int, batch: int, enabled: bool) -> float:
    lm = LeaseManager(pool, lease_duration_seconds=600)
    deployment = f"bench-trig-{uuid.uuid4().hex[:8]}"
    for i in range(0, n, 1000):
        await lm.enqueue_runs(deployment, [{} for _ in range(min(1000, n - i))])
    leases = await _leased(lm, deployment, n, batch)
    verb = "ENABLE" if enabled else "DISABLE"
    for name in TRIGGERS:
        await pool.execute(f"ALTER TABLE zeroth.runs {verb} TRIGGER {name}")
    try:
        return await _complete(lm, leases, batch)
    finally:
        for name in TRIGGERS:
            await pool.execute(f"ALTER TABLE zeroth.runs ENABLE TRIGGER {name}")


async def children_round(pool: asyncpg.Pool, n: int, batch: int, *, fan_in: bool = False
                         ) -> float:
    lm = LeaseManager(pool, lease_duration_seconds=600)
    parent_dep = f"bench-parent-{uuid.uuid4().hex[:8]}"
    child_dep = f"bench-child-{uuid.uuid4().hex[:8]}"
    await lm.enqueue_run(parent_dep, {})
    (parent_id, parent_gen), = await _leased(lm, parent_dep, 1, 1)
    ids: list[UUID] = []
    async with pool.acquire() as conn:
        for i in range(n):
            started = await lm.start_child_run(parent_id, "bench", f"c{i}", child_dep, {},
                                               generation=parent_gen, conn=conn)
            assert started is not None
            ids.append(started.child_run_id)
    if fan_in:  # the parent waits for all of them: every end counts its wait down
        waited = await lm.wait_for_children(parent_id, "bench", "#children", ids,
                                            generation=parent_gen)
        assert waited is not None
        assert waited.outcome.value == "waiting"
    spent = await _complete(lm, await _leased(lm, child_dep, n, batch), batch)
    if fan_in:
        status = await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                     parent_id)
        assert status == "pending", status  # the last end woke it
    return spent


async def main_async(dsn: str, n: int, batch: int, rounds: int) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    try:
        await one_round(pool, min(n, 500), batch, True)  # warm-up
        with_t: list[float] = []
        without: list[float] = []
        for r in range(rounds):
            for enabled in ((True, False) if r % 2 == 0 else (False, True)):
                (with_t if enabled else without).append(await one_round(pool, n, batch, enabled))
        kids = await children_round(pool, n, batch)
        fan_in = await children_round(pool, n, batch, fan_in=True)

        def per_run(values: list[float]) -> str:
            us = [v / n * 1e6 for v in values]
            rate = n / statistics.median(values)
            return (f"median {statistics.median(us):.1f} us/run "
                    f"(min {min(us):.1f}, max {max(us):.1f}; {rate:.0f} runs/s)")

        print(f"complete_runs, {n} runs per round in batches of {batch}, {rounds} rounds each:")
        print(f"  triggers enabled  (runs that are no child): {per_run(with_t)}")
        print(f"  triggers disabled (runs that are no child): {per_run(without)}")
        print(f"  difference of medians: "
              f"{(statistics.median(with_t) - statistics.median(without)) / n * 1e6:+.1f} us/run")
        print(f"  children of one waiting-free parent (trigger runs): {kids / n * 1e6:.1f} us/run")
        print(f"  children of one parent waiting for all {n} (fan-in): "
              f"{fan_in / n * 1e6:.1f} us/run")
    finally:
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dsn", nargs="?")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with migrated_or_throwaway(args.dsn) as dsn:
        asyncio.run(main_async(dsn, args.runs, args.batch, args.rounds))


if __name__ == "__main__":
    main()
