"""What one W = 4 worker cycle costs the server (issue 30, sixth session): the server side of
``zeroth.complete_and_claim`` completing 4 runs and claiming their 4 replacements, with no worker,
no handler and no producer around it, so that its counts are exact and its CPU is the backend's
own.

    python -m bench.cycle_cost [--version 18|15] [--cycles N] [--batch B] [--rounds R]
        [--against CHECKOUT] [--plain] [--perf FILE]

A throwaway server with pg_stat_statements (track = all), a fresh migrated database, 2 × cycles ×
batch runs enqueued (the queue stays deep: half of it is left at the end), then one connection
(LeaseManager, lease 30 s, as the RunWorker calls it) runs ``claim_and_start`` once and
``complete_and_claim`` ``cycles`` times, each completing the batch the one before claimed. Per
round: the backend's CPU per cycle (utime + stime of its process from /proc, so it must run as
root or as the server's user), and the statements executed inside the functions per cycle, each
with its calls, time, rows and buffers hit per cycle (pg_stat_statements, reset before the
round). Rounds repeat the loop on the same queue (the dead tuples of the earlier ones stay, as in
a worker's first minute). With --against CHECKOUT, a second database on the same server is
migrated by that checkout's zeroth_pg (another version of the SQL) and the two are cycled in
turn, one call each: the CPU of both backends then carries the same share of whatever else the
machine runs, which a run of each after the other does not. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench import harness
from bench.cpu_per_run import statements_on
from zeroth_pg import LeaseManager

DEPLOYMENT = "cycle-cost"

STATEMENTS = """
SELECT toplevel, calls, total_exec_time AS ms, rows, shared_blks_hit AS hit,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 120) AS query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT LIKE '%pg_stat_statements%'
 ORDER BY total_exec_time DESC"""


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class Side:
    """One database and its worker session: the queue, the runs it holds, its backend's CPU."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name, self.dsn = name, dsn
        self.held: list[tuple[Any, int]] = []
        self.cpu = 0.0

    async def open(self, args: argparse.Namespace) -> None:
        if not args.plain:
            conn = await asyncpg.connect(self.dsn)
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            finally:
                await conn.close()
        self.worker = await asyncpg.connect(self.dsn)
        self.admin = await asyncpg.connect(self.dsn)
        self.lm = LeaseManager(self.worker, lease_duration_seconds=30.0)
        total = 2 * args.cycles * args.batch * args.rounds
        for start in range(0, total, 1000):
            numbers = range(start, min(total, start + 1000))
            await self.lm.enqueue_runs(DEPLOYMENT, [{"payload": {"n": n}} for n in numbers])
        self.pid = await self.worker.fetchval("SELECT pg_backend_pid()")
        claim = await self.lm.claim_and_start(DEPLOYMENT, "w", batch_size=args.batch)
        self.held = [(run.run_id, run.lease_generation) for run in claim.runs]

    async def cycle(self, batch: int) -> None:
        ticks = cpu_ticks(self.pid)
        result = await self.lm.complete_and_claim(DEPLOYMENT, "w", self.held, batch_size=batch)
        self.cpu += cpu_ticks(self.pid) - ticks
        assert all(c.completed for c in result.completions)
        self.held = [(run.run_id, run.lease_generation) for run in result.claim.runs]
        assert len(self.held) == batch

    async def close(self) -> None:
        await self.worker.close()
        await self.admin.close()


def migrate_with(source: str, dsn: str) -> None:
    """Migrate dsn with the zeroth_pg of another checkout (its own SQL files)."""
    subprocess.run([sys.executable, "-c",
                    "import sys; from zeroth_pg import migrate; migrate.upgrade(sys.argv[1])", dsn],
                   env={**os.environ, "PYTHONPATH": source}, cwd=source, check=True)


async def run(args: argparse.Namespace) -> None:
    started = (harness.debian_server() if args.version == "15" else harness.server("durable"))
    with started as server:
        if not args.plain:
            await statements_on(server)
        sides = [Side("this", await asyncio.to_thread(server.zeroth_database, "cycle_cost"))]
        if args.against:
            dsn = await asyncio.to_thread(server.database, "cycle_cost_against")
            await asyncio.to_thread(migrate_with, args.against, dsn)
            sides.insert(0, Side("against", dsn))
        hz = os.sysconf("SC_CLK_TCK")
        try:
            for side in sides:
                await side.open(args)
            for round_no in range(1, args.rounds + 1):
                for side in sides:
                    side.cpu = 0.0
                    if not args.plain:
                        await side.admin.execute("SELECT pg_stat_statements_reset()")
                perf = None
                if args.perf and round_no == args.rounds:
                    perf = await asyncio.create_subprocess_exec(
                        "perf", "record", "-q", "-F", "1000", "--call-graph", "dwarf,16384",
                        "-o", args.perf, "-p", str(sides[-1].pid))
                    await asyncio.sleep(0.5)
                t0 = time.perf_counter()
                # With --against: one cycle of each in turn, so that whatever else the machine
                # runs lands on both alike.
                for _ in range(args.cycles):
                    for side in sides:
                        await side.cycle(args.batch)
                wall = time.perf_counter() - t0
                if perf is not None:
                    perf.send_signal(2)
                    await perf.wait()
                for side in sides:
                    rows = [] if args.plain else await side.admin.fetch(STATEMENTS)
                    nested = [r for r in rows if not r["toplevel"]]
                    cpu = side.cpu / hz
                    print(f"round {round_no} {side.name}: {args.cycles} cycles of {args.batch}: "
                          f"backend CPU {cpu * 1e6 / args.cycles:.0f} µs/cycle "
                          f"({cpu * 1e6 / args.cycles / args.batch:.0f} µs/run), wall "
                          f"{wall * 1e6 / args.cycles / len(sides):.0f} µs/cycle; statements "
                          "inside the functions "
                          + ("-" if args.plain
                             else f"{sum(r['calls'] for r in nested) / args.cycles:.2f}")
                          + f"/cycle; load {os.getloadavg()[0]:.1f}", flush=True)
                    if round_no == args.rounds:
                        for r in rows[:args.top]:
                            print(f"  {'top ' if r['toplevel'] else '    '}"
                                  f"{r['calls'] / args.cycles:5.2f} calls "
                                  f"{r['ms'] * 1000 / args.cycles:7.1f} µs "
                                  f"{r['rows'] / args.cycles:5.1f} rows "
                                  f"{r['hit'] / args.cycles:6.1f} hit | {r['query']}")
        finally:
            for side in sides:
                with contextlib.suppress(Exception):
                    await side.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=("18", "15"), default="18")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="a second database migrated with another checkout's zeroth_pg (its "
                             "SQL), cycled in turn with this one's: an A/B under the same load")
    parser.add_argument("--plain", action="store_true",
                        help="without pg_stat_statements (its own cost per statement is part of "
                             "the CPU otherwise; no statement counts then)")
    parser.add_argument("--perf", help="perf record (call graphs) of the backend's last round "
                                       "into this file")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
