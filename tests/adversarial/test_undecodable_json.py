"""A run whose JSON PostgreSQL stores but Python cannot decode, written by another client (psql,
a Go service), fails on its own: its claim batch is not lost with it.

Who: any caller with enqueue_run (zeroth_worker), or a DBA's manual UPDATE. jsonb takes nesting
far deeper than Python's JSON decoder (about 1,000 levels, its recursion limit) and integers of
any length (Python refuses to convert more than 4,300 digits). Before the fix the client's
decoding raised after the claim had committed, so every run of that batch stayed leased to a
worker that never got it, was recovered when its lease expired (an attempt counted) and met the
same poisoned neighbour again, until all of them were dead letters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from helpers import wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker

DEEP = '{"a": ' + "[" * 3000 + "]" * 3000 + "}"
LONG_INTEGER = '{"n": 1' + "0" * 5000 + "}"


async def enqueue_text(pool: asyncpg.Pool, deployment: str, payload: str) -> Any:
    return await pool.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, payload => $2::jsonb, "
        "max_attempts => 5)", deployment, payload)


@pytest.fixture
async def worker(pool: asyncpg.Pool, database_dsn: str) -> AsyncIterator[RunWorker]:
    async def handle(run: RunContext) -> dict[str, Any]:
        return {"saw": sorted(run.payload)}

    started = RunWorker(pool, "mixed", handle, dsn=database_dsn, max_concurrency=8,
                        poll_interval=0.05, orphan_sweep_interval=0.2, lease_duration=2.0)
    yield started
    await asyncio.wait_for(started.graceful_shutdown(), timeout=30)


@pytest.mark.parametrize("poison", [DEEP, LONG_INTEGER], ids=["nested-3000-deep", "5001-digits"])
async def test_a_run_python_cannot_decode_fails_alone_and_its_batch_completes(
        pool, worker, poison):
    bad = await enqueue_text(pool, "mixed", poison)
    good = [await enqueue_text(pool, "mixed", json.dumps({"i": i})) for i in range(3)]
    await worker.start()  # one claim takes all four
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 4 FROM zeroth.runs WHERE status IN ('completed', 'failed')"),
        "every run to finish", within=30)
    rows = {r["run_id"]: r for r in await pool.fetch(
        "SELECT run_id, status::text AS status, attempts, error FROM zeroth.runs")}
    assert (rows[bad]["status"], rows[bad]["attempts"]) == ("failed", 1)
    error = json.loads(rows[bad]["error"])
    assert error["type"] == "InvalidPayloadError"
    assert "cannot decode the run's JSON: payload" in error["message"]
    assert {(rows[g]["status"], rows[g]["attempts"]) for g in good} == {("completed", 1)}


async def test_the_lease_manager_hands_such_a_run_over_marked(pool):
    """A LeaseManager caller (another Python service) gets the run with ``undecodable`` set and
    empty payload, and the rest of its batch as usual."""
    bad = await enqueue_text(pool, "marked", DEEP)
    good = await enqueue_text(pool, "marked", '{"ok": true}')
    claim = await LeaseManager(pool).claim_and_start("marked", "w1", batch_size=10)
    runs = {run.run_id: run for run in claim.runs}
    assert set(runs) == {bad, good}
    assert runs[bad].payload == {}
    assert runs[bad].undecodable is not None
    assert runs[bad].undecodable.startswith("payload: RecursionError")
    assert (runs[good].payload, runs[good].undecodable) == ({"ok": True}, None)
