"""Concurrent sessions meeting on the runs whose history the trigger writes.

* 8 claim_orphaned sweepers over 200 expired running runs: each run's history is exactly the
  crashed attempt ended recovered and one open attempt of the sweeper that won it;
* 4 workers claiming and completing 300 runs with claim_and_start / complete_runs batches: each
  run has exactly one attempt, completed by its claimer (the trigger writes under the run's row
  lock, so two sessions never write one run's history at once).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

HISTORY = """SELECT a.run_id, a.lease_generation, a.worker_id, a.outcome
               FROM zeroth.attempt_history a
              WHERE a.run_id IN (SELECT r.run_id FROM zeroth.runs r WHERE r.deployment_ref = $1)
              ORDER BY a.run_id, a.lease_generation, a.ended_at NULLS LAST"""


async def enqueue(connection: asyncpg.Connection, deployment: str, n: int) -> None:
    await connection.fetch(
        "SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)",
        deployment, json.dumps([{"payload": {"n": i}} for i in range(n)]))


async def histories(connection: asyncpg.Connection, deployment: str) -> dict[Any, list[tuple]]:
    out: dict[Any, list[tuple]] = {}
    for row in await connection.fetch(HISTORY, deployment):
        out.setdefault(row["run_id"], []).append(
            (row["lease_generation"], row["worker_id"], row["outcome"]))
    return out


async def test_sweepers_each_recover_a_run_once_in_its_history(connect: Any) -> None:
    setup = await connect()
    await enqueue(setup, "hist-sweep", 200)
    rows = await setup.fetch(
        """SELECT c.run_id, c.lease_generation FROM zeroth.claim_and_start(deployment_ref =>
               'hist-sweep', worker_id => 'crashed', batch_size => 1000, lease_seconds => 300) c""")
    for row in rows:
        assert await setup.fetchval(
            """SELECT zeroth.expire_recovery_lease(run_id => $1, worker_id => 'crashed',
                   generation => $2)""", row["run_id"], row["lease_generation"])
    sessions = list(await asyncio.gather(*(connect() for _ in range(8))))
    won: dict[Any, str] = {}

    async def sweeper(index: int, session: asyncpg.Connection) -> None:
        while True:
            claimed = [r for r in await session.fetch(
                """SELECT c.run_id FROM zeroth.claim_orphaned(deployment_ref => 'hist-sweep',
                       worker_id => $1, claim_limit => 5, lease_seconds => 300) c""",
                f"sweeper-{index}") if r["run_id"] is not None]
            if not claimed:
                return
            for r in claimed:
                assert r["run_id"] not in won
                won[r["run_id"]] = f"sweeper-{index}"

    await asyncio.wait_for(asyncio.gather(*(sweeper(i, s) for i, s in enumerate(sessions))),
                           timeout=120)
    assert len(won) == 200
    assert await histories(setup, "hist-sweep") == {
        run_id: [(1, "crashed", "recovered"), (2, worker, None)] for run_id, worker in won.items()}


async def test_batch_workers_complete_each_run_once_in_its_history(connect: Any) -> None:
    setup = await connect()
    await enqueue(setup, "hist-batch", 300)
    sessions = list(await asyncio.gather(*(connect() for _ in range(4))))
    done: dict[Any, str] = {}

    async def worker(index: int, session: asyncpg.Connection) -> None:
        name = f"w{index}"
        while True:
            claimed = [r for r in await session.fetch(
                """SELECT c.run_id, c.lease_generation FROM zeroth.claim_and_start(
                       deployment_ref => 'hist-batch', worker_id => $1, batch_size => 7) c""",
                name) if r["run_id"] is not None]
            if not claimed:
                return
            results = await session.fetch(
                """SELECT x.run_id, x.completed FROM zeroth.complete_runs(worker_id => $1,
                       run_ids => $2::uuid[], generations => $3::bigint[]) x""",
                name, [r["run_id"] for r in claimed], [r["lease_generation"] for r in claimed])
            assert all(r["completed"] for r in results)
            for r in claimed:
                done[r["run_id"]] = name

    await asyncio.wait_for(asyncio.gather(*(worker(i, s) for i, s in enumerate(sessions))),
                           timeout=120)
    assert len(done) == 300
    assert await histories(setup, "hist-batch") == {
        run_id: [(1, name, "completed")] for run_id, name in done.items()}
