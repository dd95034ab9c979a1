"""A/B of the claim floor's page count (branch decay) against the code before it, with pg-boss as
the peer, in one run: on each server version (Debian's PostgreSQL 15, stock settings; the embedded
18), three cells on fresh databases, one after the other: zeroth_pg with the functions before the
changes (the function files of c6e3dac that this branch changed re-applied over a migrated
database), zeroth_pg as on this branch, pg-boss (one work() loop of batchSize W) — the
cold-start depth cell of bench/continuous.py (queue held 4,000 deep, one process, W slots, 1 ms
handler, no VACUUM or ANALYZE by the bench). The client process (the worker and its producer;
pg-boss's Node process) and the server (postmaster and everything it forks) each in a cpuacct
cgroup: CPU-µs per run per 10 s segment, with the dead tuples and autovacuums of the system's
tables. Needs root and cgroup v1 (/sys/fs/cgroup/cpuacct).

    PYTHONPATH=. python bench/results/2026-12-06-decay/ab_decay.py BASE_DIR [--versions 15,18]
        [--concurrency 64] [--seconds 100]

BASE_DIR holds the function files of c6e3dac this branch changed, all applied (git show
c6e3dac:sql/functions/internal/X.sql for claim_floor, claims, scopes; c6e3dac:sql/functions/
count_pending.sql).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from pathlib import Path

import asyncpg

from bench import harness
from bench.continuous import Load, Trace, pgboss_cell, zeroth_cell
from bench.cpu_per_run import CPUACCT, cgroups, join, move_tree, postmaster, usage

TICK_US = 1_000_000 / os.sysconf("SC_CLK_TCK")
BACKENDS = """SELECT pid FROM pg_stat_activity
                WHERE backend_type = 'client backend' AND datname = current_database()
                  AND pid <> pg_backend_pid()"""


def cpu_of(pids: list[int]) -> dict[int, float]:
    """µs of CPU (user + system) each process has used so far (gone ones left out)."""
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = (int(fields[11]) + int(fields[12])) * TICK_US
    return found


STATS = """SELECT coalesce(sum(n_dead_tup), 0)::bigint AS dead, coalesce(sum(n_live_tup), 0)::bigint AS live,
                  coalesce(sum(autovacuum_count), 0)::bigint AS autovacuums,
                  coalesce(sum(pg_relation_size(relid)), 0)::bigint AS heap
             FROM pg_stat_user_tables
            WHERE schemaname = $1 AND (relname = ANY ('{runs,job}'::text[]) OR relname LIKE 'j%')"""


async def apply_base(dsn: str, base: Path) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
            for path in sorted(base.glob("*.sql")):
                await conn.execute(path.read_text())
    finally:
        await conn.close()


async def cell(server: harness.Server, label: str, kind: str, args, groups, root: int,
               base: Path) -> dict:
    client, server_group = groups
    if kind == "pg-boss":
        dsn = await asyncio.to_thread(server.database, label)
        schema = "pgboss"
    else:
        dsn = await asyncio.to_thread(server.zeroth_database, label)
        schema = "zeroth"
        if kind == "base":
            await apply_base(dsn, base)
    move_tree(root, server_group)
    trace = Trace()
    samples = []

    async def sample() -> None:
        await trace.loading.wait()
        at = 0.0
        while at <= args.seconds:
            await asyncio.sleep(max(0.0, trace.t0 + at - time.perf_counter()))
            conn = await asyncpg.connect(dsn)
            try:
                row = dict(await conn.fetchrow(STATS, schema))
                row["backends"] = cpu_of([r["pid"] for r in await conn.fetch(BACKENDS)])
            finally:
                await conn.close()
            row.update(at=at, t=time.perf_counter() - trace.t0, started=len(trace.started),
                       client=usage(client), server=usage(server_group),
                       load=os.getloadavg()[0])
            samples.append(row)
            at += 10.0

    sampling = asyncio.create_task(sample())
    load = Load(args.seconds, depth=4000)
    if kind == "pg-boss":
        await pgboss_cell(dsn, trace, load, args.concurrency)
    else:
        await zeroth_cell(dsn, trace, load, args.concurrency)
    await asyncio.sleep(0.2)
    sampling.cancel()
    await asyncio.gather(sampling, return_exceptions=True)
    windows = trace.windows(args.seconds)
    print(f"== PG {args.version_now} W={args.concurrency} {kind}: runs/s per 5 s window "
          + " ".join(f"{w:.0f}" for w in windows), flush=True)
    first_av = None
    for a, b in itertools.pairwise(samples):
        runs = b["started"] - a["started"]
        if runs <= 0:
            continue
        if first_av is None and b["autovacuums"] > 0:
            first_av = b["at"]
        # the client backends alive at both ends (the pools' connections); the rest of the
        # server's CPU is autovacuum, the checkpointer, the WAL writer and short connections
        backends = sum(b["backends"][p] - a["backends"][p]
                       for p in b["backends"] if p in a["backends"])
        print(f"   {a['at']:.0f}-{b['at']:.0f} s: {runs / (b['t'] - a['t']):.0f} runs/s, "
              f"client {(b['client'] - a['client']) / 1000 / runs:.0f} µs/run, "
              f"server {(b['server'] - a['server']) / 1000 / runs:.0f} µs/run "
              f"(backends {backends / runs:.0f}, rest "
              f"{((b['server'] - a['server']) / 1000 - backends) / runs:.0f}); "
              f"dead {b['dead']} live {b['live']} autovacuums {b['autovacuums']} "
              f"heap {b['heap'] / 2**20:.0f} MB; load {b['load']:.1f}", flush=True)
    # runs started between the second sample and the last, from the trace (pg-boss's start times
    # reach the trace only when its process ends)
    total = (sum(1 for t in trace.started.values()
                 if trace.t0 + samples[1]["t"] <= t < trace.t0 + samples[-1]["t"])
             if len(samples) > 2 else 0)
    cpu = ((samples[-1]["server"] - samples[1]["server"]) / 1000 / max(1, total),
           (samples[-1]["client"] - samples[1]["client"]) / 1000 / max(1, total))
    print(f"   10-{args.seconds:.0f} s: server {cpu[0]:.0f} µs/run, client {cpu[1]:.0f} µs/run, "
          f"median window {statistics.median(windows[2:]):.0f} runs/s, first autovacuum of "
          f"its tables by {first_av} s", flush=True)
    await asyncio.to_thread(server.drop, label)
    return {"windows": windows, "samples": samples}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("--versions", default="15,18")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--order", default="base,new,pg-boss")
    args = parser.parse_args()
    with cgroups("client", "server") as groups:
        join(groups[0])
        for version in args.versions.split(","):
            args.version_now = version
            started = harness.debian_server() if version == "15" else harness.server("durable")
            with started as server:
                root = await postmaster(server.admin_dsn)
                move_tree(root, groups[1])
                for kind in args.order.split(","):
                    await cell(server, f"ab_{kind.replace('-', '')}", kind, args, groups, root,
                               args.base)


if __name__ == "__main__":
    asyncio.run(main())
