"""Races of zeroth.complete_and_claim: many sessions completing their runs and claiming the next
in one call, under a concurrency limit, never deadlock, never start a run twice and never hold
more live leases than the limit; a stale holder's call racing the new holder's claim of the same
run never lands its completion."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from test_batch_lease_races import CLAIM_AND_START, enqueue_many

CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(
    deployment_ref => $1, worker_id => $2, grace_seconds => 0)"""

COMPLETE_AND_CLAIM = """SELECT x.completed, (x.claimed).run_id, (x.claimed).lease_generation
    FROM zeroth.complete_and_claim(deployment_ref => $1, worker_id => $2, run_ids => $3::uuid[],
    generations => $4::bigint[], tenant_id => $5, max_concurrency => $6, batch_size => $7,
    lease_seconds => 60) AS x"""


class TestManySessions:
    async def test_every_run_starts_once_within_the_limit(self, connect: Any) -> None:
        deployment, total, limit, sessions_n = "cac-many", 600, 4, 6
        setup = await connect()
        await enqueue_many(setup, deployment, total, tenant="t1")
        sessions = [await connect() for _ in range(sessions_n)]
        monitor = await connect()
        started: list[Any] = []
        completed = 0
        done = asyncio.Event()
        peak = 0

        async def worker(index: int, session: asyncpg.Connection) -> None:
            nonlocal completed
            name = f"w{index}"
            held: list[tuple[Any, int]] = []
            while not done.is_set():
                if not held:
                    rows = await session.fetch(CLAIM_AND_START, deployment, name, limit, 1,
                                               60.0, "t1")
                else:
                    rows = await session.fetch(
                        COMPLETE_AND_CLAIM, deployment, name, [r for r, _ in held],
                        [g for _, g in held], "t1", limit, 1)
                    assert rows[0]["completed"] == [True] * len(held)
                    completed += len(held)
                    if completed == total:
                        done.set()
                held = [(r["run_id"], r["lease_generation"]) for r in rows
                        if r["run_id"] is not None]
                started.extend(r for r, _ in held)
                if not held:
                    await asyncio.sleep(0.001)

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, await monitor.fetchval(
                    """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1
                           AND lease_expires_at >= clock_timestamp()""", deployment))

        await asyncio.wait_for(asyncio.gather(
            watch(), *(worker(i, s) for i, s in enumerate(sessions))), timeout=120)

        assert len(started) == total
        assert len(set(started)) == total
        assert 1 <= peak <= limit
        assert await setup.fetchval(
            """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1
                   AND status = 'completed' AND attempts = 1""", deployment) == total


class TestStaleHolder:
    async def test_a_taken_over_run_is_never_completed_by_its_old_holder(
            self, connect: Any) -> None:
        old, new, setup = await connect(), await connect(), await connect()
        for round_no in range(30):
            deployment = f"cac-stale-{round_no}"
            await enqueue_many(setup, deployment, 2)
            (first,) = [r for r in await old.fetch(CLAIM_AND_START, deployment, "old", None, 1,
                                                   60.0, None) if r["run_id"] is not None]
            # The operator expires the old lease in place (clear_lease on a running run); the
            # new holder takes the orphan over and claims the other run, while the old holder
            # sends its completion with its claim of the next run.
            assert await setup.fetchval("SELECT zeroth.clear_lease(run_id => $1)",
                                        first["run_id"])
            stale, orphan, pending = await asyncio.gather(
                old.fetch(COMPLETE_AND_CLAIM, deployment, "old", [first["run_id"]],
                          [first["lease_generation"]], None, None, 1),
                new.fetch(CLAIM_ORPHANED, deployment, "new"),
                setup.fetch(CLAIM_AND_START, deployment, "third", None, 1, 60.0, None))

            assert stale[0]["completed"] == [False]
            claimed = [r["run_id"] for r in stale + pending if r["run_id"] is not None]
            assert len(claimed) == len(set(claimed))  # the other run started once at most
            row = await setup.fetchrow(
                "SELECT status::text AS status, lease_worker_id FROM zeroth.runs WHERE run_id = $1",
                first["run_id"])
            assert row["status"] == "running"  # expired in place, or the new holder's
            if any(r["run_id"] == first["run_id"] for r in orphan):
                assert row["lease_worker_id"] == "new"
