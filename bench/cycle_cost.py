"""What one W = 4 worker cycle costs the server (issue 30, sixth session): the server side of
``zeroth.complete_and_claim`` completing 4 runs and claiming their 4 replacements, with no worker,
no handler and no producer around it, so that its counts are exact and its CPU is the backend's
own.

    python -m bench.cycle_cost [--version 18|15] [--cycles N] [--batch B] [--rounds R]
        [--plain] [--perf FILE]

A throwaway server with pg_stat_statements (track = all), a fresh migrated database, 2 × cycles ×
batch runs enqueued (the queue stays deep: half of it is left at the end), then one connection
(LeaseManager, lease 30 s, as the RunWorker calls it) runs ``claim_and_start`` once and
``complete_and_claim`` ``cycles`` times, each completing the batch the one before claimed. Per
round: the backend's CPU per cycle (utime + stime of its process from /proc, so it must run as
root or as the server's user), and the statements executed inside the functions per cycle, each
with its calls, time, rows and buffers hit per cycle (pg_stat_statements, reset before the
round). Rounds repeat the loop on the same queue (the dead tuples of the earlier ones stay, as in
a worker's first minute). Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from pathlib import Path

import asyncpg

from bench import harness
from bench.cpu_per_run import statements_on
from zeroth_pg import LeaseManager

DEPLOYMENT = "cycle-cost"

STATEMENTS = """
SELECT toplevel, calls, total_exec_time AS ms, rows, shared_blks_hit AS hit, jit_functions AS jit, jit_generation_time + jit_inlining_time + jit_optimization_time + jit_emission_time AS jit_ms,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 120) AS query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND query NOT LIKE '%pg_stat_statements%'
 ORDER BY total_exec_time DESC"""


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


async def run(args: argparse.Namespace) -> None:
    started = (harness.debian_server() if args.version == "15" else harness.server("durable"))
    with started as server:
        if not args.plain:
            await statements_on(server)
        dsn = await asyncio.to_thread(server.zeroth_database, "cycle_cost")
        if not args.plain:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            finally:
                await conn.close()
        worker = await asyncpg.connect(dsn)
        admin = await asyncpg.connect(dsn)
        try:
            lm = LeaseManager(worker, lease_duration_seconds=30.0)
            total = 2 * args.cycles * args.batch * args.rounds
            for start in range(0, total, 1000):
                await lm.enqueue_runs(DEPLOYMENT, [{"payload": {"n": n}}
                                                   for n in range(start, min(total, start + 1000))])
            pid = await worker.fetchval("SELECT pg_backend_pid()")
            hz = os.sysconf("SC_CLK_TCK")
            claim = await lm.claim_and_start(DEPLOYMENT, "w", batch_size=args.batch)
            held = [(run.run_id, run.lease_generation) for run in claim.runs]
            for round_no in range(1, args.rounds + 1):
                if not args.plain:
                    await admin.execute("SELECT pg_stat_statements_reset()")
                perf = None
                if args.perf and round_no == args.rounds:
                    perf = subprocess.Popen(["perf", "record", "-q", "-F", "1000", "--call-graph", "dwarf,16384", "-o",
                                             args.perf, "-p", str(pid)])
                    await asyncio.sleep(0.5)
                ticks, t0 = cpu_ticks(pid), time.perf_counter()
                for _ in range(args.cycles):
                    result = await lm.complete_and_claim(DEPLOYMENT, "w", held,
                                                         batch_size=args.batch)
                    assert all(c.completed for c in result.completions)
                    held = [(run.run_id, run.lease_generation) for run in result.claim.runs]
                    assert len(held) == args.batch
                cpu = (cpu_ticks(pid) - ticks) / hz
                wall = time.perf_counter() - t0
                if perf is not None:
                    perf.send_signal(2)
                    perf.wait()
                rows = [] if args.plain else await admin.fetch(STATEMENTS)
                nested = [r for r in rows if not r["toplevel"]]
                print(f"round {round_no}: {args.cycles} cycles of {args.batch}: backend CPU "
                      f"{cpu * 1e6 / args.cycles:.0f} µs/cycle ({cpu * 1e6 / args.cycles / args.batch:.0f}"
                      f" µs/run), wall {wall * 1e6 / args.cycles:.0f} µs/cycle; statements inside "
                      f"the functions {'-' if args.plain else '%.2f' % (sum(r['calls'] for r in nested) / args.cycles)}/cycle; "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                if round_no == args.rounds:
                    for r in rows[:args.top]:
                        print(f"  {'top ' if r['toplevel'] else '    '}"
                              f"{r['calls'] / args.cycles:5.2f} calls {r['ms'] * 1000 / args.cycles:7.1f} µs "
                              f"{r['rows'] / args.cycles:5.1f} rows {r['hit'] / args.cycles:6.1f} hit"
                              f"{' jit %.0f fns %.0f ms' % (r['jit'], r['jit_ms']) if r['jit'] else ''}"
                              f" | {r['query']}")
        finally:
            await worker.close()
            await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=("18", "15"), default="18")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--top", type=int, default=60)
    parser.add_argument("--plain", action="store_true",
                        help="without pg_stat_statements (its own cost per statement is part of "
                             "the CPU otherwise; no statement counts then)")
    parser.add_argument("--perf", help="perf record (call graphs) of the backend's last round "
                                       "into this file")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
