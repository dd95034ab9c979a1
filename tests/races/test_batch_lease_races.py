"""Races of the fast path (0007): claim_and_start from many sessions, complete_runs against a
renewal of the same runs on another connection, and complete_runs against a takeover.

complete_runs and renew_leases lock slot rows, then run rows, each in run_id order, so a worker
that renews and completes overlapping sets on two connections never deadlocks; a stale holder's
batch completion and a new holder's claim never both win a run.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import asyncpg
from helpers import at, make_run
from interleave import finishes_without_waiting

CLAIM_AND_START = """SELECT run_id, lease_generation, status FROM zeroth.claim_and_start(
    deployment_ref => $1, worker_id => $2, max_concurrency => $3, batch_size => $4,
    lease_seconds => $5, tenant_id => $6)"""
COMPLETE_RUNS = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1,
    run_ids => $2::uuid[], generations => $3::bigint[], tenant_id => $4)"""
RENEW_LEASES = """SELECT run_id, renewed FROM zeroth.renew_leases(worker_id => $1,
    run_ids => $2::uuid[], generations => $3::bigint[], tenant_id => $4, lease_seconds => 30)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(
    deployment_ref => $1, worker_id => $2)"""


async def enqueue_many(connection: asyncpg.Connection, deployment: str, count: int,
                       tenant: str | None = None) -> list[Any]:
    rows = await connection.fetch(
        """SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb,
               tenant_id => $3)""",
        deployment, json.dumps([{"payload": {"n": i}} for i in range(count)]), tenant)
    return [row["run_id"] for row in rows]


class TestClaimAndStartFromManySessions:
    async def test_every_run_is_started_exactly_once(self, connect: Any) -> None:
        deployment, runs, claimers = "fast-many", 1500, 8
        setup = await connect()
        run_ids = set(await enqueue_many(setup, deployment, runs))
        sessions = [await connect() for _ in range(claimers)]
        claimed: list[Any] = []

        async def claimer(index: int, session: asyncpg.Connection) -> None:
            while rows := [r for r in await session.fetch(
                    CLAIM_AND_START, deployment, f"c{index}", None, 7, 60.0, None)
                    if r["run_id"] is not None]:
                assert {r["status"] for r in rows} == {"running"}
                claimed.extend(r["run_id"] for r in rows)

        await asyncio.gather(*(claimer(i, s) for i, s in enumerate(sessions)))

        assert len(claimed) == runs
        assert set(claimed) == run_ids
        assert await setup.fetchval(
            """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'running'
                   AND attempts = 1 AND lease_generation = 1""", deployment) == runs

    async def test_live_leases_never_exceed_max_concurrency(self, connect: Any) -> None:
        deployment, k, claimers = "fast-bound", 4, 8
        setup = await connect()
        await enqueue_many(setup, deployment, 400, tenant="t1")
        sessions = [await connect() for _ in range(claimers)]
        monitor = await connect()
        done = asyncio.Event()
        finished = 0
        peak = 0

        async def claimer(index: int, session: asyncpg.Connection) -> None:
            nonlocal finished
            worker = f"b{index}"
            while not done.is_set():
                rows = [r for r in await session.fetch(
                    CLAIM_AND_START, deployment, worker, k, 3, 60.0, "t1")
                    if r["run_id"] is not None]
                if not rows:
                    await asyncio.sleep(0.001)
                    continue
                result = await session.fetch(
                    COMPLETE_RUNS, worker, [r["run_id"] for r in rows],
                    [r["lease_generation"] for r in rows], "t1")
                assert all(r["completed"] for r in result)
                finished += len(result)
                if finished == 400:
                    done.set()

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, await monitor.fetchval(
                    """SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1
                           AND lease_expires_at >= clock_timestamp()""", deployment))

        await asyncio.wait_for(asyncio.gather(
            watch(), *(claimer(i, s) for i, s in enumerate(sessions))), timeout=120)

        assert 1 <= peak <= k
        assert await setup.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status = 'completed'",
            deployment) == 400


class TestCompleteRacingRenewal:
    async def test_overlapping_batches_on_two_connections_never_deadlock(
            self, connect: Any) -> None:
        """One worker renews all its runs on one connection while it completes a shuffled subset
        on another (the RunWorker's renewal task and its completion flusher)."""
        rng = random.Random(7)
        renewer, completer, setup = await connect(), await connect(), await connect()
        for round_no in range(40):
            tenant = "t1" if round_no % 2 else None  # with and without admission slots
            deployment = f"overlap-{round_no}"
            await enqueue_many(setup, deployment, 30, tenant=tenant)
            rows = [r for r in await setup.fetch(
                CLAIM_AND_START, deployment, "w", 30 if tenant else None, 30, 60.0, tenant)
                if r["run_id"] is not None]
            leases = [(r["run_id"], r["lease_generation"]) for r in rows]
            to_renew = leases[:]
            rng.shuffle(to_renew)
            to_complete = rng.sample(leases, 20)

            renewed, completed = await asyncio.gather(
                renewer.fetch(RENEW_LEASES, "w", [r for r, _ in to_renew],
                              [g for _, g in to_renew], tenant),
                completer.fetch(COMPLETE_RUNS, "w", [r for r, _ in to_complete],
                                [g for _, g in to_complete], tenant))

            assert all(r["completed"] for r in completed)
            done = {r for r, _ in to_complete}
            # A run renewed before its completion is renewed; one renewed after it is refused.
            for row in renewed:
                assert row["renewed"] or row["run_id"] in done
            statuses = dict(await setup.fetch(
                "SELECT run_id, status::text FROM zeroth.runs WHERE deployment_ref = $1",
                deployment))
            assert {statuses[r] for r in done} == {"completed"}
            assert {statuses[r] for r, _ in leases if r not in done} == {"running"}


class TestCompleteRacingTakeover:
    async def test_a_stale_batch_and_a_new_holder_never_both_win(self, connect: Any) -> None:
        """The stale holder completes its batch at the moment its lease expires, while a new
        holder claims the orphans. The moment moves with the machine's load (a round trip of
        50 ms on a loaded CI runner lands every completion after the expiry), so the delay
        follows the outcome: earlier after a round the thief won, later after one the stale
        holder won. It settles where both win, and the race is run at its edge."""
        stale, thief, setup = await connect(), await connect(), await connect()
        lease, step = 0.2, 0.02
        delay = lease
        outcomes = {"completed": 0, "taken": 0}
        for round_no in range(60):
            deployment = f"takeover-{round_no}"
            await enqueue_many(setup, deployment, 10)
            rows = [r for r in await stale.fetch(
                CLAIM_AND_START, deployment, "old", None, 10, lease, None)
                if r["run_id"] is not None]
            await asyncio.sleep(delay * random.uniform(0.9, 1.1))  # around the expiry

            completed, taken = await asyncio.gather(
                stale.fetch(COMPLETE_RUNS, "old", [r["run_id"] for r in rows],
                            [r["lease_generation"] for r in rows], None),
                thief.fetch(CLAIM_ORPHANED, deployment, "new"))

            won_by_stale = {r["run_id"] for r in completed if r["completed"]}
            won_by_thief = {r["run_id"] for r in taken if r["run_id"] is not None}
            assert not won_by_stale & won_by_thief
            outcomes["completed"] += len(won_by_stale)
            outcomes["taken"] += len(won_by_thief)
            statuses = dict(await setup.fetch(
                """SELECT run_id, status::text FROM zeroth.runs WHERE deployment_ref = $1""",
                deployment))
            for run_id in won_by_stale:
                assert statuses[run_id] == "completed"
            for run_id in won_by_thief:
                assert statuses[run_id] == "running"
            if not won_by_stale:
                delay = max(0.0, delay - step)
            if not won_by_thief:
                delay += step
            if round_no >= 29 and min(outcomes.values()) > 0:
                break
        # Both sides must have won some runs, or the race was never run.
        assert outcomes["completed"] > 0, outcomes
        assert outcomes["taken"] > 0, outcomes


class TestRenewLeasesSkipsABusyRow:
    async def test_a_row_another_session_holds_is_reported_not_waited_for(self, sessions):
        """One run's row held by another session (an application's cancel in an open
        transaction) must not make the whole renewal time out and every lease of the worker
        lapse: renew_leases skips the busy row (renewed NULL: not renewed this time, not lost)
        and renews the rest."""
        holder, renewer, db = sessions
        a = await make_run(db, "running")
        b = await make_run(db, "running")
        await holder.begin()
        await holder.call("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", a.run_id)
        renewal = await finishes_without_waiting(db, renewer, renewer.spawn(
            """SELECT run_id, renewed FROM zeroth_test.renew_leases(worker_id => $1,
                   run_ids => $2, generations => $3, now_override => $4)""",
            a.worker_id, [a.run_id, b.run_id], [a.generation, b.generation], at(30), rows=True))
        await holder.commit()
        assert [(r["run_id"], r["renewed"]) for r in renewal.value] == [
            (a.run_id, None), (b.run_id, True)]
