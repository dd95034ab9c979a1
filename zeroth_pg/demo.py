"""A demo of real workers: ``python -m zeroth_pg.demo``.

It uses ``ZEROTH_PG_DSN`` or, without it, the embedded PostgreSQL; applies the migrations;
enqueues a few thousand runs; starts worker **processes**; SIGKILLs one of them mid-way so its
leases expire and the others recover its runs from their last checkpoints; and prints a summary.
Some runs fail once or twice (retried with backoff) and a few always fail (dead-lettered after
``max_attempts``). Every number in the summary is read back from the database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import asyncpg

from zeroth_pg.client import LeaseManager
from zeroth_pg.embedded import running_server
from zeroth_pg.worker import RunContext

__all__ = ["handle", "main"]


async def handle(ctx: RunContext) -> dict[str, Any]:
    """The demo handler: a few steps, each checkpointed; resumes from the last checkpoint."""
    steps = int(ctx.payload.get("steps", 3))
    first = int((ctx.checkpoint_data or {}).get("step", 0))
    for step in range(first, steps):
        await asyncio.sleep(float(ctx.payload.get("step_seconds", 0.01)))
        await ctx.checkpoint({"step": step + 1})
    if ctx.payload.get("always_fail"):
        raise RuntimeError("this run always fails (demo dead letter)")
    if ctx.attempt <= int(ctx.payload.get("fail_attempts", 0)):
        raise RuntimeError(f"transient failure on attempt {ctx.attempt} (demo retry)")
    return {"steps": steps, "resumed_from_step": first if ctx.recovered else None}


def _payloads(count: int, rng: random.Random) -> list[dict[str, Any]]:
    runs = []
    for _ in range(count):
        payload: dict[str, Any] = {"steps": 3, "step_seconds": rng.choice((0.005, 0.01, 0.02))}
        roll = rng.random()
        if roll < 0.005:
            payload["always_fail"] = True
        elif roll < 0.04:
            payload["fail_attempts"] = rng.choice((1, 2))
        elif roll < 0.10:
            payload["step_seconds"] = 0.5  # long runs: likely mid-flight when a worker dies
        runs.append({"payload": payload, "max_attempts": 3})
    return runs


def _spawn_worker(dsn: str, deployment: str, index: int,
                  args: argparse.Namespace) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "zeroth_pg.worker", "--dsn", dsn, "--deployment", deployment,
               "--app", "zeroth_pg.demo:handle", "--concurrency", str(args.concurrency),
               "--lease", str(args.lease), "--orphan-sweep-interval", "1", "--poll-interval", "1",
               "--retry-base", "0.2", "--worker-id", f"demo-worker-{index}",
               "--log-level", "ERROR"]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL)


async def _counts(pool: asyncpg.Pool, deployment: str) -> asyncpg.Record:
    return await pool.fetchrow(
        """SELECT count(*) AS total,
                  count(*) FILTER (WHERE r.status = 'completed') AS completed,
                  count(*) FILTER (WHERE r.status = 'failed') AS failed,
                  count(*) FILTER (WHERE r.dead_lettered_at IS NOT NULL) AS dead_lettered,
                  count(*) FILTER (WHERE r.status IN ('pending', 'running')) AS open,
                  coalesce(sum(greatest(r.attempts - 1, 0)), 0) AS retries,
                  count(*) FILTER (WHERE r.output ->> 'resumed_from_step' IS NOT NULL) AS recovered,
                  coalesce(sum((r.output ->> 'resumed_from_step')::int), 0) AS steps_saved
             FROM zeroth.runs r
            WHERE r.tenant_id = 'default' AND r.workspace_key = '' AND r.deployment_ref = $1""",
        deployment)


async def _demo(dsn: str, args: argparse.Namespace) -> int:
    deployment = f"demo-{uuid.uuid4().hex[:8]}"
    rng = random.Random(args.seed)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        lm = LeaseManager(pool)
        print(f"database: {dsn}")
        print(f"enqueuing {args.runs} runs for deployment {deployment} ...")
        payloads = _payloads(args.runs, rng)
        for start in range(0, len(payloads), 500):
            await lm.enqueue_runs(deployment, payloads[start:start + 500])
            print(f"  enqueued {min(start + 500, len(payloads))}/{len(payloads)}", flush=True)
        started = time.monotonic()
        workers = [_spawn_worker(dsn, deployment, i, args) for i in range(args.workers)]
        print(f"started {len(workers)} worker processes (lease {args.lease:g}s)")
        killed = False
        last_print = 0.0
        while True:
            counts = await _counts(pool, deployment)
            done = counts["completed"] + counts["failed"]
            now = time.monotonic()
            if not killed and args.kill and done >= args.runs * 0.3 and len(workers) > 1:
                workers[0].send_signal(signal.SIGKILL)
                workers[0].wait()
                killed = True
                print(f"  SIGKILLed demo-worker-0 at {done} done: its leases will expire in "
                      f"{args.lease:g}s and the other workers will resume its runs")
            if now - last_print >= 1.0:
                print(f"  {done}/{args.runs} finished ({counts['open']} open)", flush=True)
                last_print = now
            if counts["open"] == 0:
                break
            if now - started > args.timeout:
                print("timed out waiting for the runs to finish", file=sys.stderr)
                return 1
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - started
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        await pool.close()
    rows = [
        ("runs", counts["total"]),
        ("completed", counts["completed"]),
        ("failed (dead-lettered)", f"{counts['failed']} ({counts['dead_lettered']})"),
        ("retries", counts["retries"]),
        ("recovered after the kill", f"{counts['recovered']} (checkpointed steps not redone: "
                                     f"{counts['steps_saved']})"),
        ("wall time", f"{elapsed:.1f} s"),
        ("throughput", f"{counts['total'] / elapsed:.0f} runs/s"),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    print("summary".center(width + 30, "-"))
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    ok = counts["open"] == 0 and counts["completed"] + counts["failed"] == args.runs
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zeroth_pg.demo", description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16, help="slots per worker")
    parser.add_argument("--lease", type=float, default=3.0, help="lease seconds (short for demo)")
    parser.add_argument("--no-kill", dest="kill", action="store_false",
                        help="do not SIGKILL a worker mid-way")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.workers < 1:
        parser.error("--runs and --workers must be at least 1")
    with running_server() as dsn:
        os.environ.setdefault("ZEROTH_PG_DSN", dsn)
        return asyncio.run(_demo(dsn, args))


if __name__ == "__main__":
    sys.exit(main())
