"""What each zeroth function costs the server per run, by language (issue 30: SQL functions
planned at every call before PostgreSQL 18).

    python -m bench.function_costs [--version 15|18] [--concurrency W] [--seconds S]

A throwaway server (Debian's PostgreSQL 15, or the bench's embedded 18; durable) with
track_functions = all and a fresh migrated database; a producer in the same process (every 2 ms
alternately one enqueue_run and an enqueue_runs of 10) and a RunWorker with W slots, a 1 ms handler
and a 2 s lease (so renew_leases runs too). After a 3 s warm-up, and again after S seconds more,
the producer pauses until the queue is empty and 2.5 s more (a backend flushes its statistics at
most once a second, when idle); between the two: one line per function called, with its calls per
run completed, its self time per run and per call (pg_stat_user_functions: a function the planner
inlined is never counted, one it calls is) and its language, and the total self time per run (the
idle worker's own calls while the queue drains are counted too). Before PostgreSQL 18 a called
SQL-language function is parsed and planned again at every call: on 15 most show tens of µs a call
(5-215) where 18 shows a few (2-13; `_wakeup_stripes_held`, which reads pg_locks, 87). Nothing
asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

import asyncpg
from prometheus_client import CollectorRegistry

from bench import harness
from zeroth_pg import LeaseManager, RunWorker
from zeroth_pg.metrics import WorkerMetrics

DEPLOYMENT = "function-costs"

FUNCTIONS = """
    SELECT f.funcname, l.lanname, f.calls, f.self_time
      FROM pg_stat_user_functions f
      JOIN pg_proc p ON p.oid = f.funcid
      JOIN pg_language l ON l.oid = p.prolang
     WHERE f.schemaname = 'zeroth'
     ORDER BY f.self_time DESC"""


async def run(args: argparse.Namespace) -> None:
    started = (harness.debian_server() if args.version == "15" else harness.server("durable"))
    with started as server:
        dsn = await asyncio.to_thread(server.zeroth_database, "function_costs")
        admin = await asyncpg.connect(server.admin_dsn)
        try:
            await admin.execute("ALTER SYSTEM SET track_functions = 'all'")
            await admin.execute("SELECT pg_reload_conf()")
        finally:
            await admin.close()
        reader = await asyncpg.connect(dsn)
        producer_pool = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
        producer = LeaseManager(producer_pool)
        producing = asyncio.Event()

        async def handler(_run: object) -> None:
            await asyncio.sleep(0.001)

        async def produce() -> None:
            n = 0
            while True:
                await producing.wait()
                if n % 2:
                    await producer.enqueue_run(DEPLOYMENT, {"n": n})
                else:
                    await producer.enqueue_runs(
                        DEPLOYMENT, [{"payload": {"n": n, "i": i}} for i in range(10)])
                n += 1
                await asyncio.sleep(0.002)

        async def quiet() -> tuple[dict[str, tuple[str, int, float]], int]:
            """Producer paused, the queue drained, every backend's statistics flushed (at most
            once a second, when idle): the functions' counters and the runs completed so far."""
            producing.clear()
            for _ in range(600):  # the queue drains in well under a minute
                if not await reader.fetchval(
                        "SELECT count(*) FROM zeroth.runs WHERE status IN ('pending', 'running')"):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.5)
            await reader.execute("SELECT pg_stat_clear_snapshot()")
            counters = {r["funcname"]: (r["lanname"], r["calls"], r["self_time"])
                        for r in await reader.fetch(FUNCTIONS)}
            done = await reader.fetchval(
                "SELECT count(*) FROM zeroth.runs WHERE status = 'completed'")
            return counters, done

        task = asyncio.create_task(produce())
        try:
            async with harness.pool(dsn, args.concurrency + 3) as workers:
                worker = RunWorker(workers, DEPLOYMENT, handler, dsn=dsn,
                                   max_concurrency=args.concurrency, lease_duration=2.0,
                                   metrics=WorkerMetrics.create(CollectorRegistry()))
                await worker.start()
                try:
                    producing.set()
                    await asyncio.sleep(3.0)  # warm-up: the sessions' plans made
                    before, first = await quiet()
                    producing.set()
                    await asyncio.sleep(args.seconds)
                    after, last = await quiet()
                finally:
                    await worker.graceful_shutdown()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await reader.close()
            await producer_pool.close()
    runs = last - first
    if runs <= 0:
        raise SystemExit("no run completed in the measured phase")
    rows = sorted(((name, lang, calls - before.get(name, (lang, 0, 0.0))[1],
                    self_time - before.get(name, (lang, 0, 0.0))[2])
                   for name, (lang, calls, self_time) in after.items()),
                  key=lambda row: -row[3])
    print(f"PostgreSQL {args.version}: {runs} runs completed in {args.seconds:g} s and the "
          f"drain, at concurrency {args.concurrency}")
    total = 0.0
    for name, lang, calls, self_time in rows:
        if calls <= 0:
            continue
        total += self_time
        print(f"  {calls / runs:7.3f} calls/run  self {self_time * 1000 / runs:7.1f} µs/run  "
              f"{self_time * 1000 / calls:7.1f} µs/call  {lang:8s} {name}")
    print(f"  total self time {total * 1000 / runs:.1f} µs/run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=("15", "18"), default="15")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
