"""What the failover soaks share (tests/failover/test_failover_soak.py on a hand-made replicated
pair, tests/ha/test_ha_soak.py under Patroni and pg_auto_failover): the backlog they enqueue,
the polls, the audit they read back and the comparison of what was acknowledged outside the
database with what the new primary holds."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from chaos_fleet import DEPLOYMENT, Fleet, FleetConfig, retrying
from chaos_history import EVENTS_QUERY, HISTORY_QUERY, RUNS_QUERY, SLOTS_QUERY, Report

from zeroth_pg.client import LeaseManager

__all__ = ["ENQUEUE_BATCH", "FLEET", "TERMINAL", "acknowledged_losses", "all_terminal",
           "compare_acknowledged",
           "completed", "counts", "enqueue_all", "first_claim_after", "read_audit",
           "sample_slots", "until"]

FLEET = FleetConfig(tenants=("t1", "t2", "t3"), workers=6, concurrency=10, lease=3.0,
                    fleet_limits={"t3": 6})
ENQUEUE_BATCH = 300
TERMINAL = ("completed", "failed", "cancelled")


async def enqueue_all(harness: asyncpg.Pool, first: int, stop: int) -> set[UUID]:
    """Runs number ``first`` to ``stop`` - 1, spread over the tenants; the ids the database
    acknowledged."""
    client = LeaseManager(harness)
    acknowledged: set[UUID] = set()
    tenants = len(FLEET.tenants)
    for start in range(first, stop, ENQUEUE_BATCH):
        for index, tenant in enumerate(FLEET.tenants):
            numbers = [n for n in range(start, min(start + ENQUEUE_BATCH, stop))
                       if n % tenants == index]
            items = [{"payload": {"steps_ms": [25 + (n * 37) % 100 for _ in range(2 + n % 3)],
                                  "fail_first_attempt": n % 50 == 0},
                      "idempotency_key": f"failover-{n}", "max_attempts": 10} for n in numbers]
            if items:
                done = await retrying(lambda items=items, tenant=tenant: client.enqueue_runs(
                    DEPLOYMENT, items, tenant_id=tenant))
                acknowledged |= {run.run_id for run in done}
    return acknowledged


async def counts(harness: asyncpg.Pool) -> dict[str, int]:
    rows = await retrying(lambda: harness.fetch(
        "SELECT r.status::text AS status, count(*) AS n FROM zeroth.runs r GROUP BY r.status"))
    return {row["status"]: row["n"] for row in rows}


async def until(condition: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await condition():
            return True
        await asyncio.sleep(0.5)
    return False


async def sample_slots(harness: asyncpg.Pool, rows: list[dict[str, Any]]) -> None:
    """The chaos soak's admission-slot snapshots (chaos_history.SLOTS_QUERY), every 0.2 s
    until cancelled, through the failover."""
    taken = 0
    while True:
        found = await retrying(lambda: harness.fetch(SLOTS_QUERY))
        taken += 1
        rows += [{"sample": taken, **dict(row)} for row in found]
        await asyncio.sleep(0.2)


async def read_audit(dsn: str) -> tuple[list[dict[str, Any]], ...]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                                  schema="pg_catalog")
        return tuple([[dict(row) for row in await conn.fetch(query)]
                      for query in (HISTORY_QUERY, EVENTS_QUERY, RUNS_QUERY)])
    finally:
        await conn.close()


def compare_acknowledged(enqueued: set[UUID], completions: list[tuple[str, int, str]],
                         runs: list[dict[str, Any]], history: list[dict[str, Any]]
                         ) -> dict[str, Any]:
    """What was acknowledged outside the database against what the new primary holds.
    ``completions`` are (run id, generation, worker id) as the workers were answered. An
    acknowledged completion is kept when the new primary's one accepted completion is that very
    one: same generation *and* worker (before the generation floor of each WAL timeline, a lossy
    failover could hand a generation number out again, to another worker; the soak now asserts
    it never does)."""
    final = {run["run_id"]: run for run in runs}
    acknowledged: dict[UUID, list[tuple[int, str]]] = defaultdict(list)
    for run_id, generation, worker in completions:
        acknowledged[UUID(run_id)].append((generation, worker))
    accepted = {row["run_id"]: (row["old_generation"], row["old_worker"]) for row in history
                if row["kind"] == "complete"}
    # Every acknowledgement of a run but the one its accepted outcome is was lost (the same
    # worker may have been answered twice under one generation number: two, one kept).
    lost: list[tuple[str, int, str]] = []
    for run_id, outcomes in acknowledged.items():
        kept = list(outcomes)
        if final.get(run_id, {}).get("status") == "completed" and accepted.get(run_id) in kept:
            kept.remove(accepted[run_id])
        lost += [(str(run_id), *outcome) for outcome in kept]
    generation_reused = sum(
        1 for run_id, outcomes in acknowledged.items()
        if len({generation for generation, _ in outcomes}) < len(set(outcomes)))
    return {
        "enqueued_acknowledged": len(enqueued),
        "enqueued_lost": len(enqueued - final.keys()),
        "completions_acknowledged": len(completions),
        "acknowledged_completions_lost": len(lost),
        "lost_examples": lost[:3],
        "runs_completed_twice": sum(len(outcomes) > 1 for outcomes in acknowledged.values()),
        "runs_completed_twice_under_one_generation_number": generation_reused,
        "runs_not_acknowledged_complete": len(final.keys() - acknowledged.keys()),
    }


def acknowledged_losses(enqueued: set[UUID], fleet: Fleet, runs: list[dict[str, Any]],
                        history: list[dict[str, Any]], report: Report) -> dict[str, Any]:
    """:func:`compare_acknowledged` for the completions the fleet's workers were answered, and
    the handler writes answered "accepted" whose history row the new primary lacks (their audit
    event was retried onto the new primary after the failover: a lower bound, an event lost with
    its write is not seen)."""
    completions = [(run_id, generation, worker.worker_id) for worker in fleet.every
                   for run_id, generation in worker.completed]
    losses = compare_acknowledged(enqueued, completions, runs, history)
    losses["acknowledged_handler_writes_lost"] = sum(
        "answered accepted but is not in the history" in message
        for message in report.violations.get("handler_log_agrees", []))
    return losses


def first_claim_after(history: list[dict[str, Any]], at: datetime) -> datetime | None:
    claims = [row["acquired_at"] for row in history
              if row["kind"] == "claim" and row["acquired_at"] > at]
    return min(claims, default=None)


async def completed(harness: asyncpg.Pool, count: int) -> bool:
    return (await counts(harness)).get("completed", 0) >= count


async def all_terminal(harness: asyncpg.Pool) -> bool:
    return all(status in TERMINAL for status in await counts(harness))
