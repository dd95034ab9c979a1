"""CPU per run of the deep-queue cell (issue 30): the worker's process and the server, each in a
cpuacct cgroup of its own, so that the count is far less sensitive than runs/s to whatever else
the machine runs.

    python -m bench.cpu_per_run [--version 18|15] [--concurrency W] [--seconds S] [--every S]
        [--call-timeout S] [--claim-ahead N] [--settle-in-flight N]

The cell is cold_start's depth cell (bench/continuous.py: a fresh database, a RunWorker with W
slots and a 1 ms handler, the queue held 4,000 deep by a producer in the same process, as in
cold_start) on the embedded PostgreSQL 18 or Debian's 15 (bench/harness.py). Every ``--every``
seconds from ``--warmup`` on, one line per segment: runs/s; the CPU-µs per run of the worker's
process (producer included) and of the server (every backend, autovacuum and the checkpointer
included: the cgroup holds the postmaster and everything it forks); transactions per run;
calls per run of the functions the worker and its producer call (pg_stat_user_functions);
the claim index's size and the index tuples each of its scans read; the table's live and dead
tuples, autovacuums and heap size. Needs root and the cgroup v1 cpuacct hierarchy
(/sys/fs/cgroup/cpuacct); the cgroups are removed at the end. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg

from bench import harness
from bench.cold_start import TABLES
from bench.continuous import Load, Trace, zeroth_cell
from bench.monitor import Monitor

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
#: The functions a deep-queue worker and its producer call (complete_and_claim calls
#: complete_runs inside: not listed, track_functions = all would count it too).
CALLS = ("complete_and_claim", "claim_and_start", "settle_runs", "renew_leases",
         "claim_orphaned", "enqueue_runs", "count_pending")


@contextlib.contextmanager
def cgroups(*names: str) -> Iterator[list[Path]]:
    """cpuacct cgroups of these names (under CPUACCT), removed on exit (this process is moved
    back to the root group first; the server's processes have exited by then)."""
    made = []
    try:
        for name in names:
            path = CPUACCT / f"zeroth-bench-{os.getpid()}-{name}"
            path.mkdir(exist_ok=True)
            made.append(path)
        yield made
    finally:
        with contextlib.suppress(OSError):
            (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()


def usage(group: Path) -> int:
    """Nanoseconds of CPU used by the group's processes so far."""
    return int((group / "cpuacct.usage").read_text())


def move_tree(root_pid: int, group: Path) -> None:
    """The postmaster and its children (every backend forked later inherits the group)."""
    children = subprocess.run(["pgrep", "-P", str(root_pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    for pid in [root_pid, *map(int, children)]:
        with contextlib.suppress(OSError):
            (group / "cgroup.procs").write_text(str(pid))


async def postmaster(admin_dsn: str) -> int:
    conn = await asyncpg.connect(admin_dsn)
    try:
        pid = await conn.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'")
    finally:
        await conn.close()
    return parent_of(int(pid))


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().split()[3])


def join(group: Path) -> None:
    """This process joins ``group``."""
    (group / "cgroup.procs").write_text(str(os.getpid()))


SNAPSHOT = """
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS xacts,
       (SELECT coalesce(jsonb_object_agg(funcname, calls), '{}') FROM pg_stat_user_functions
         WHERE schemaname = 'zeroth' AND funcname = ANY($1::text[]))::text AS calls,
       t.n_live_tup AS live, t.n_dead_tup AS dead, t.autovacuum_count AS autovacuums,
       pg_relation_size('zeroth.runs') AS heap,
       i.idx_scan AS claim_scans, i.idx_tup_read AS claim_read,
       pg_relation_size(i.indexrelid) AS claim_index
  FROM pg_stat_user_tables t
  JOIN pg_stat_user_indexes i ON i.relid = t.relid AND i.indexrelname = 'runs_claim_pending_idx'
 WHERE t.relid = 'zeroth.runs'::regclass"""


#: --statements: per statement (pg_stat_statements, track = all: the statements inside the
#: functions too) and per relation of schema zeroth (pg_statio_*), cumulative counters.
STATEMENTS = """
SELECT queryid::text AS id, left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query,
       calls, total_exec_time AS ms, shared_blks_hit AS hit, shared_blks_read AS read,
       shared_blks_dirtied AS dirtied, rows
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"""
RELATIONS = """
SELECT relname AS name, coalesce(heap_blks_hit, 0) AS hit, coalesce(heap_blks_read, 0) AS read,
       pg_relation_size(relid) AS bytes
  FROM pg_statio_user_tables WHERE schemaname = 'zeroth'
UNION ALL
SELECT indexrelname, coalesce(idx_blks_hit, 0), coalesce(idx_blks_read, 0),
       pg_relation_size(indexrelid)
  FROM pg_statio_user_indexes WHERE schemaname = 'zeroth'"""


async def statements_on(server: harness.Server) -> None:
    """pg_stat_statements loaded (a restart) and tracking nested statements."""
    assert server.restart is not None
    # Its settings only once it is loaded (PostgreSQL 15 refuses them before): two restarts.
    for statements in (["ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"],
                       ["ALTER SYSTEM SET pg_stat_statements.track = 'all'",
                        "ALTER SYSTEM SET pg_stat_statements.max = 10000"]):
        conn = await asyncpg.connect(server.admin_dsn)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()
        await asyncio.to_thread(server.restart, "fast")


def print_statements(a: dict[str, Any], b: dict[str, Any], runs: int, top: int) -> None:
    """The segment's statements by execution time per run, and the relations' blocks per run."""
    before = {row["id"]: row for row in a["statements"]}
    deltas = []
    for row in b["statements"]:
        old = before.get(row["id"], {"calls": 0, "ms": 0.0, "hit": 0, "read": 0, "dirtied": 0,
                                     "rows": 0})
        calls = row["calls"] - old["calls"]
        if calls > 0:
            deltas.append((row["ms"] - old["ms"], calls, row, old))
    deltas.sort(key=lambda d: d[0], reverse=True)
    for ms, calls, row, old in deltas[:top]:
        print(f"    {ms * 1000 / runs:7.1f} µs/run {calls / runs:6.3f} calls/run "
              f"{ms * 1000 / calls:8.1f} µs/call blks/call hit "
              f"{(row['hit'] - old['hit']) / calls:7.1f} "
              f"read {(row['read'] - old['read']) / calls:5.2f} "
              f"dirtied {(row['dirtied'] - old['dirtied']) / calls:5.2f} rows/call "
              f"{(row['rows'] - old['rows']) / calls:6.1f} | {row['query'][:110]}")
    rel_before = {row["name"]: row for row in a["relations"]}
    rels = []
    for row in b["relations"]:
        old = rel_before.get(row["name"], {"hit": 0, "read": 0})
        hit, read = row["hit"] - old["hit"], row["read"] - old["read"]
        if hit + read > 0:
            rels.append((hit + read, hit, read, row))
    rels.sort(key=lambda r: r[0], reverse=True)
    print("    blocks/run: " + ", ".join(
        f"{row['name']} {total / runs:.1f} (read {read / runs:.2f}, {row['bytes'] / 2**20:.0f} MB)"
        for total, hit, read, row in rels[:12]))


async def measure(args: argparse.Namespace) -> None:
    with cgroups("worker", "server") as (worker, server_group):
        join(worker)
        started = (harness.debian_server() if args.version == "15"
                   else harness.server("durable"))
        with started as server:
            if args.statements:
                await statements_on(server)
            root = await postmaster(server.admin_dsn)
            dsn = await asyncio.to_thread(server.zeroth_database, "cpu_per_run")
            conn = await asyncpg.connect(dsn)
            try:
                database = await conn.fetchval("SELECT current_database()")
                await conn.execute(f"ALTER DATABASE \"{database}\" SET track_functions = 'all'")
                if args.statements:
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            finally:
                await conn.close()
            move_tree(root, server_group)
            trace = Trace()
            samples: list[dict[str, Any]] = []

            async def sample() -> None:
                await trace.loading.wait()
                move_tree(root, server_group)
                at = args.warmup
                while at < args.seconds:
                    await asyncio.sleep(max(0.0, trace.t0 + at - time.perf_counter()))
                    conn = await asyncpg.connect(dsn)
                    try:
                        row = dict(await conn.fetchrow(SNAPSHOT, list(CALLS)))
                        if args.statements:
                            row["statements"] = [dict(r) for r in await conn.fetch(STATEMENTS)]
                            row["relations"] = [dict(r) for r in await conn.fetch(RELATIONS)]
                    finally:
                        await conn.close()
                    row.update(at=at, t=time.perf_counter() - trace.t0,
                               started=len(trace.started), worker=usage(worker),
                               server=usage(server_group), calls=json.loads(row["calls"]),
                               load=os.getloadavg()[0])
                    samples.append(row)
                    at += args.every

            sampling = asyncio.create_task(sample())
            stop_monitor = asyncio.Event()
            monitoring = None
            if args.monitor:  # cold_start's monitor beside the load, as its depth cell runs it
                monitor = Monitor(dsn, *TABLES["zeroth-worker"], origin=lambda: trace.t0)
                await monitor.prepare()

                async def watch() -> None:
                    await trace.loading.wait()
                    await monitor.run(stop_monitor)
                monitoring = asyncio.create_task(watch())
            await zeroth_cell(dsn, trace, Load(args.seconds, depth=args.depth), args.concurrency,
                              call_timeout=args.call_timeout or None,
                              claim_ahead=args.claim_ahead)
            sampling.cancel()
            stop_monitor.set()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
            if monitoring is not None:
                await monitoring
    ahead = f", claim_ahead {args.claim_ahead}" if args.claim_ahead else ""
    print(f"PostgreSQL {args.version}, depth {args.depth}, W={args.concurrency}{ahead}: runs/s "
          "per 5 s window", " ".join(f"{w:.0f}" for w in trace.windows(args.seconds)))
    for a, b in itertools.pairwise(samples):
        runs = b["started"] - a["started"]
        if runs <= 0:
            continue
        calls = {name: (b["calls"].get(name, 0) - a["calls"].get(name, 0)) / runs
                 for name in CALLS if b["calls"].get(name, 0) > a["calls"].get(name, 0)}
        scans = b["claim_scans"] - a["claim_scans"]
        print(f"{a['at']:.0f}-{b['at']:.0f} s: {runs / (b['t'] - a['t']):.0f} runs/s, "
              f"worker {(b['worker'] - a['worker']) / 1000 / runs:.0f} µs/run, "
              f"server {(b['server'] - a['server']) / 1000 / runs:.0f} µs/run, "
              f"xact/run {(b['xacts'] - a['xacts']) / runs:.3f}, calls/run "
              + ", ".join(f"{k} {v:.3f}" for k, v in calls.items())
              + f"; claim index {b['claim_index'] // 8192} pages, "
              f"{(b['claim_read'] - a['claim_read']) / max(1, scans):.0f} tuples/scan; "
              f"live {b['live']} dead {b['dead']} autovacuums {b['autovacuums']} "
              f"heap {b['heap'] / 2**20:.0f} MB; load {b['load']:.1f}", flush=True)
        if args.statements:
            print_statements(a, b, runs, args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", choices=("18", "15"), default="18")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--statements", action="store_true",
                        help="per segment: pg_stat_statements (track = all) and pg_statio_* "
                             "deltas per run (loads pg_stat_statements: one restart first)")
    parser.add_argument("--call-timeout", type=float, default=5.0,
                        help="the RunWorker's call bound in seconds (its default 5; 0: none)")
    parser.add_argument("--claim-ahead", type=int, default=0,
                        help="the RunWorker's claim_ahead (default 0)")
    parser.add_argument("--settle-in-flight", type=int, default=None,
                        help="settling calls out at once (zeroth_pg.worker._settle."
                             "MAX_IN_FLIGHT; default: the worker's)")
    parser.add_argument("--monitor", action="store_true",
                        help="cold_start's monitor beside the load (pgstattuple, pgstatindex, "
                             "pg_stat_activity every 5 s)")
    parser.add_argument("--top", type=int, default=14, help="statements shown per segment")
    args = parser.parse_args()
    if args.settle_in_flight is not None:
        from zeroth_pg.worker import _settle
        _settle.MAX_IN_FLIGHT = args.settle_in_flight
    if not (CPUACCT / "cpuacct.usage").exists():
        raise SystemExit(f"no cpuacct cgroup hierarchy at {CPUACCT}")
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
