"""8 concurrent claim_orphaned sweepers over N running runs whose leases expired.

Each orphan must be taken over exactly once: one sweeper, one generation bump, and the new lease
is the sweeper's. Leases are expired in place through the API (expire_recovery_lease for half,
the admin clear_lease for the other half), so the real clock needs no waiting.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import asyncpg
import pytest

ORPHANS = 600
SWEEPERS = 8
DEPLOYMENT = "sweep"
CRASHED = "crashed-worker"


async def make_orphans(connection: asyncpg.Connection) -> dict[Any, int]:
    """ORPHANS running runs held by CRASHED whose leases are expired; returns run → generation."""
    await connection.fetch(
        "SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        DEPLOYMENT, json.dumps([{"payload": {"n": n}} for n in range(ORPHANS)]))
    rows = await connection.fetch(
        """SELECT c.run_id, c.lease_generation FROM zeroth.claim_pending(deployment_ref => $1,
               worker_id => $2, batch_size => 1000, lease_seconds => 300) c""",
        DEPLOYMENT, CRASHED)
    generations = {row["run_id"]: row["lease_generation"] for row in rows}
    assert len(generations) == ORPHANS
    for i, (run_id, generation) in enumerate(generations.items()):
        assert await connection.fetchval(
            "SELECT zeroth.start_run(run_id => $1, worker_id => $2, generation => $3)",
            run_id, CRASHED, generation)
        # Half the holders give up their lease in place, half are cleared by an operator: either
        # way the run stays running with its holder and an expired lease.
        if i % 2:
            assert await connection.fetchval(
                """SELECT zeroth.expire_recovery_lease(run_id => $1, worker_id => $2,
                       generation => $3)""", run_id, CRASHED, generation)
        else:
            assert await connection.fetchval("SELECT zeroth.clear_lease(run_id => $1)", run_id)
    expired = await connection.fetchval(
        """SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1 AND r.status = 'running'
              AND r.lease_worker_id = $2 AND r.lease_expires_at < clock_timestamp()""",
        DEPLOYMENT, CRASHED)
    assert expired == ORPHANS
    return generations


@pytest.mark.parametrize("claim_limit", [1, 7, None])
async def test_each_orphan_is_taken_over_exactly_once_by_8_concurrent_sweepers(
        connect: Any, claim_limit: int | None) -> None:
    setup = await connect()
    before = await make_orphans(setup)
    sessions = list(await asyncio.gather(*(connect() for _ in range(SWEEPERS))))
    claimed: list[tuple[Any, int, str]] = []

    async def sweeper(index: int, session: asyncpg.Connection) -> None:
        worker = f"sweeper-{index}"
        while True:
            rows = [row for row in await session.fetch(
                """SELECT c.run_id, c.lease_generation, c.status FROM zeroth.claim_orphaned(
                       deployment_ref => $1, worker_id => $2, claim_limit => $3,
                       lease_seconds => 300) c""", DEPLOYMENT, worker, claim_limit)
                    if row["run_id"] is not None]
            if not rows:
                return
            assert claim_limit is None or len(rows) <= claim_limit
            for row in rows:
                assert row["status"] == "running"
                claimed.append((row["run_id"], row["lease_generation"], worker))

    await asyncio.wait_for(
        asyncio.gather(*(sweeper(i, s) for i, s in enumerate(sessions))), timeout=120)

    counts = Counter(run_id for run_id, _, _ in claimed)
    assert [run_id for run_id, n in counts.items() if n > 1] == []
    assert set(counts) == set(before)
    assert all(generation == before[run_id] + 1 for run_id, generation, _ in claimed)
    if claim_limit == 1:
        # 600 one-at-a-time sweeps by 8 sessions: the work really was shared.
        assert len({worker for _, _, worker in claimed}) > 1

    rows = await setup.fetch(
        """SELECT r.run_id, r.status, r.lease_generation, r.lease_worker_id, r.attempts,
                  r.lease_expires_at > clock_timestamp() AS live
             FROM zeroth.runs r WHERE r.deployment_ref = $1""", DEPLOYMENT)
    holder = {run_id: (generation, worker) for run_id, generation, worker in claimed}
    assert len(rows) == ORPHANS
    for row in rows:
        # Bumped exactly once, held by the sweeper that reported it, lease live, and the
        # attempt that died with the crashed worker counted once.
        assert (row["lease_generation"], row["lease_worker_id"]) == holder[row["run_id"]]
        assert row["lease_generation"] == before[row["run_id"]] + 1
        assert row["status"] == "running"
        assert row["live"]
        assert row["attempts"] == 2
    # The new holders' fences work and the crashed holder's fence does not.
    run_id, (generation, worker) = next(iter(holder.items()))
    assert not await setup.fetchval(
        "SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3)",
        run_id, CRASHED, before[run_id])
    assert await setup.fetchval(
        "SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3)",
        run_id, worker, generation)
