"""Runs really claimed on the test database, wrapped as the worker wraps them (ActiveRun), for
the tests of the worker's units."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import asyncpg
from helpers import unique_deployment

from zeroth_pg.client import LeaseManager
from zeroth_pg.types import ClaimedRun, RunStatus, Scope
from zeroth_pg.worker._run import ActiveRun, RunContext

WORKER = "unit-worker"
#: Where the units' runs live (claim() enqueues them in the default tenant, no workspace).
UNIT_SCOPE = Scope("unit")


def active(run: ClaimedRun, *, deadline: float | None = None,
           scope: Scope = UNIT_SCOPE) -> ActiveRun:
    """``run`` as the worker holds it; its lease known live for ``deadline`` (default 60 s)."""
    ctx = RunContext(
        run_id=run.run_id, payload=run.payload, attempt=run.attempts,
        max_attempts=run.max_attempts, metadata=run.metadata, thread_id=run.thread_id,
        idempotency_key=run.idempotency_key, lease_generation=run.lease_generation,
        worker_id=WORKER, recovered=False, recovery_checkpoint_id=run.recovery_checkpoint_id,
        checkpoint_data=run.checkpoint_data, cancelled=asyncio.Event(), scope=scope,
        _worker=None)  # type: ignore[arg-type]  # the units never write through the context
    return ActiveRun(run=run, ctx=ctx,
                     deadline=time.monotonic() + 60 if deadline is None else deadline)


def unclaimed(**changes: Any) -> ClaimedRun:
    """A ClaimedRun that no database holds (for the tests that need no database)."""
    fields: dict[str, Any] = {
        "run_id": uuid4(), "lease_generation": 1, "lease_expires_at": datetime.now(UTC),
        "status": RunStatus.RUNNING, "attempts": 1, "max_attempts": 3, "priority": 0,
        "thread_id": None, "idempotency_key": None, "payload": {}, "metadata": {},
        "recovery_checkpoint_id": None, "checkpoint_data": None, "cancel_requested": False,
    }
    return ClaimedRun(**{**fields, **changes})


async def claim(lm: LeaseManager, count: int, *, prefix: str = "unit") -> list[ClaimedRun]:
    """Enqueue ``count`` runs of a fresh deployment and claim them all as :data:`WORKER`."""
    deployment = unique_deployment(prefix)
    await lm.enqueue_runs(deployment, [{"payload": {"i": i}} for i in range(count)])
    result = await lm.claim_and_start(deployment, WORKER, batch_size=count)
    assert len(result.runs) == count
    return list(result.runs)


async def lease_row(pool: asyncpg.Pool, run: ClaimedRun) -> asyncpg.Record:
    row = await pool.fetchrow(
        """SELECT r.status::text AS status, r.lease_generation, r.lease_expires_at, r.output::text
                  AS output
             FROM zeroth.runs r WHERE r.run_id = $1""", run.run_id)
    assert row is not None
    return row
