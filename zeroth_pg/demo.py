"""A demo of real workers: ``zeroth-pg demo`` (also ``python -m zeroth_pg.demo``).

It uses ``--dsn`` / ``ZEROTH_PG_DSN`` or, without one, the embedded PostgreSQL; applies the
migrations; enqueues a few thousand runs; starts worker **processes**; SIGKILLs one of them
mid-way so its leases expire and the others recover its runs from their last checkpoints; and
prints a summary table (``--json``: one JSON object). Some runs fail once or twice (retried with
backoff) and a few always fail (dead-lettered after ``max_attempts``). Every number in the
summary is read back from the database. Progress goes to stderr, the summary to stdout.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from zeroth_pg._connect import create_pool
from zeroth_pg.client import LeaseManager
from zeroth_pg.embedded import running_server
from zeroth_pg.worker import RunContext

__all__ = ["DemoOptions", "DemoSummary", "handle", "run"]

ENQUEUE_BATCH = 500


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


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What the demo's runs came to, read back from ``zeroth.runs``."""

    deployment: str
    runs: int
    completed: int
    failed: int
    dead_lettered: int
    retries: int
    recovered: int
    steps_saved: int
    open: int
    wall_seconds: float
    killed_worker: bool

    @property
    def throughput(self) -> float:
        """Finished runs per second of wall time, from the first worker start."""
        return (self.completed + self.failed) / self.wall_seconds if self.wall_seconds else 0.0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "throughput": round(self.throughput, 1)}

    def table(self) -> Table:
        table = Table(title=f"zeroth_pg demo · {self.deployment}", title_justify="left",
                      show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
        table.add_row("runs", f"{self.runs:,}")
        table.add_row("completed", f"{self.completed:,}")
        table.add_row("failed (dead-lettered)", f"{self.failed:,} ({self.dead_lettered:,})")
        table.add_row("retries (and recoveries)", f"{self.retries:,}")
        table.add_row("recovered after the kill" if self.killed_worker else "recovered",
                      f"{self.recovered:,} (checkpointed steps not redone: {self.steps_saved:,})")
        table.add_row("wall time", f"{self.wall_seconds:.1f} s")
        table.add_row("throughput", f"{self.throughput:,.0f} runs/s")
        return table


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
                  args: DemoOptions) -> subprocess.Popen[bytes]:
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


async def _demo(dsn: str, args: DemoOptions, console: Console) -> DemoSummary | None:
    deployment = f"demo-{uuid.uuid4().hex[:8]}"
    rng = random.Random(args.seed)
    pool = await create_pool(dsn, min_size=1, max_size=4)
    workers: list[subprocess.Popen[bytes]] = []
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console)
    killed = False
    try:
        lm = LeaseManager(pool)
        console.print(f"database: {dsn}")
        payloads = _payloads(args.runs, rng)
        with progress:
            enqueue = progress.add_task(f"enqueue · {deployment}", total=args.runs)
            for start in range(0, len(payloads), ENQUEUE_BATCH):
                batch = payloads[start:start + ENQUEUE_BATCH]
                await lm.enqueue_runs(deployment, batch)
                progress.advance(enqueue, len(batch))
            started = time.monotonic()
            workers = [_spawn_worker(dsn, deployment, i, args) for i in range(args.workers)]
            progress.console.print(f"started {len(workers)} worker processes "
                                   f"(lease {args.lease:g}s, {args.concurrency} slots each)")
            finished = progress.add_task("finished", total=args.runs)
            while True:
                counts = await _counts(pool, deployment)
                done = counts["completed"] + counts["failed"]
                progress.update(finished, completed=done)
                if not killed and args.kill and done >= args.runs * 0.3 and len(workers) > 1:
                    workers[0].send_signal(signal.SIGKILL)
                    workers[0].wait()
                    killed = True
                    progress.console.print(
                        f"SIGKILLed demo-worker-0 at {done} finished: its leases expire within "
                        f"{args.lease:g}s and the other workers resume its runs")
                if counts["open"] == 0:
                    break
                if time.monotonic() - started > args.timeout:
                    progress.console.print("[red]timed out waiting for the runs to finish")
                    return None
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
    return DemoSummary(
        deployment=deployment, runs=counts["total"], completed=counts["completed"],
        failed=counts["failed"], dead_lettered=counts["dead_lettered"], retries=counts["retries"],
        recovered=counts["recovered"], steps_saved=counts["steps_saved"], open=counts["open"],
        wall_seconds=round(elapsed, 2), killed_worker=killed)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """The demo's settings (``zeroth-pg demo --help`` names their ``ZEROTH_PG_*`` variables)."""

    dsn: str | None = None  # None: ZEROTH_PG_DSN, else the embedded server
    runs: int = 2000
    workers: int = 3  # worker processes
    concurrency: int = 16  # slots per worker
    lease: float = 3.0  # lease seconds, short for the demo
    kill: bool = True  # SIGKILL a worker mid-way
    seed: int = 7  # seed of the run mix
    timeout: float = 600.0  # give up after this many seconds
    json: bool = False  # print the summary as one JSON object
    web: bool = False  # serve the read-only dashboard (zeroth_pg.web) while the demo runs
    web_port: int = 8787


def _start_web(dsn: str, port: int) -> Any:
    """The read-only dashboard on 127.0.0.1:port in a daemon thread (uvicorn); its URL goes to
    stderr, with the token it needs (generated for this run, as ``zeroth-pg web`` does: the
    database may be the user's own, through ZEROTH_PG_DSN, and every local user can reach
    127.0.0.1). Returns the uvicorn server (set should_exit to stop it)."""
    import secrets
    import threading

    import uvicorn

    from zeroth_pg.web import create_app

    token = secrets.token_urlsafe(24)
    config = uvicorn.Config(create_app(dsn, token=token), host="127.0.0.1", port=port,
                            log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True, name="zeroth-pg web").start()
    print(f"dashboard: http://127.0.0.1:{port}/?token={token} (read-only, while the demo runs)",
          file=sys.stderr, flush=True)
    return server


def run(args: DemoOptions) -> int:
    """Run the demo; 0 when every run finished, 1 otherwise (timeout, runs left open)."""
    if args.runs < 1 or args.workers < 1:
        raise ValueError("--runs and --workers must be at least 1")
    if args.dsn:
        os.environ["ZEROTH_PG_DSN"] = args.dsn
    with running_server() as dsn:
        server = _start_web(dsn, args.web_port) if args.web else None
        try:
            summary = asyncio.run(_demo(dsn, args, Console(stderr=True, soft_wrap=True)))
        finally:
            if server is not None:
                server.should_exit = True
    if summary is None:
        return 1
    if args.json:
        print(json.dumps(summary.as_json()))
    else:
        Console().print(summary.table())
    return 0 if summary.open == 0 and summary.completed + summary.failed == args.runs else 1


if __name__ == "__main__":
    from zeroth_pg._console import run_command

    run_command("zeroth_pg.cli.demo", prog_name="python -m zeroth_pg.demo")
