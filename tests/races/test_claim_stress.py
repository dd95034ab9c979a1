"""32 sessions drain 5,000 committed runs at once: every run is claimed exactly once.

Each claimer loops claim_pending → start_run → complete_run with its own fence. SKIP LOCKED must
hand every run to exactly one claimer (one generation), and every fenced write of the holder must
land. Real clock, long leases: nothing expires, so any second claim of a run is a bug.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import asyncpg
import pytest

RUNS = 5000
CLAIMERS = 32
DEPLOYMENT = "stress"

CLAIM = """
    SELECT c.run_id, c.lease_generation, c.status
      FROM zeroth.claim_pending(deployment_ref => $1, worker_id => $2, batch_size => $3,
                                lease_seconds => 300) c"""
START = "SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3)"
COMPLETE = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => $4::text::jsonb)"""


async def enqueue_all(connection: asyncpg.Connection) -> set[Any]:
    run_ids: set[Any] = set()
    for offset in range(0, RUNS, 1000):
        rows = await connection.fetch(
            """SELECT run_id, created FROM zeroth.enqueue_runs(deployment_ref => $1,
                   runs => $2::text::jsonb)""",
            DEPLOYMENT, json.dumps([{"payload": {"n": n}} for n in range(offset, offset + 1000)]))
        assert all(row["created"] for row in rows)
        run_ids.update(row["run_id"] for row in rows)
    return run_ids


async def drain(sessions: list[asyncpg.Connection], batch_size: int) -> list[tuple[Any, int, str]]:
    claimed: list[tuple[Any, int, str]] = []
    refused: list[tuple[str, Any]] = []

    async def claimer(index: int, session: asyncpg.Connection) -> None:
        worker = f"claimer-{index}"
        while True:
            rows = [row for row in await session.fetch(CLAIM, DEPLOYMENT, worker, batch_size)
                    if row["run_id"] is not None]
            if not rows:
                # Nothing claimable and unlocked: whatever is left is locked by a claimer that
                # will take it, so this claimer may stop.
                return
            for row in rows:
                assert row["status"] == "pending"
                fence = (row["run_id"], worker, row["lease_generation"])
                claimed.append((row["run_id"], row["lease_generation"], worker))
                if not await session.fetchval(START, *fence):
                    refused.append(("start_run", fence))
                    continue
                output = json.dumps({"by": worker, "generation": row["lease_generation"]})
                if not await session.fetchval(COMPLETE, *fence, output):
                    refused.append(("complete_run", fence))

    await asyncio.wait_for(
        asyncio.gather(*(claimer(i, s) for i, s in enumerate(sessions))), timeout=180)
    assert refused == []
    return claimed


@pytest.mark.parametrize("batch_size", [1, 10])
async def test_every_run_is_claimed_exactly_once_by_32_concurrent_claimers(
        connect: Any, batch_size: int) -> None:
    setup = await connect()
    run_ids = await enqueue_all(setup)
    sessions = list(await asyncio.gather(*(connect() for _ in range(CLAIMERS))))

    claimed = await drain(sessions, batch_size)

    counts = Counter(run_id for run_id, _, _ in claimed)
    assert [run_id for run_id, n in counts.items() if n > 1] == []
    assert len(claimed) == RUNS
    assert set(counts) == run_ids
    assert {generation for _, generation, _ in claimed} == {1}
    # The work was actually spread: more than one session claimed runs.
    assert len({worker for _, _, worker in claimed}) > 1

    rows = await setup.fetch(
        """SELECT r.run_id, r.status, r.lease_generation, r.attempts, r.lease_worker_id,
                  r.output FROM zeroth.runs r WHERE r.deployment_ref = $1""", DEPLOYMENT)
    assert len(rows) == RUNS
    holder = {run_id: worker for run_id, _, worker in claimed}
    for row in rows:
        assert row["status"] == "completed"
        assert row["lease_generation"] == 1
        assert row["attempts"] == 1
        assert row["lease_worker_id"] is None
        assert json.loads(row["output"]) == {"by": holder[row["run_id"]], "generation": 1}
