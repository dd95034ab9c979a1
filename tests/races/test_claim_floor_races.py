"""Races of the claim floor (issue 30): many sessions, each with its own floor, draining one scope
while a transaction pins the xmin horizon, handing runs back below their floors, with runs of a
higher priority and runs due in the past enqueued meanwhile, start every run exactly once and
leave none behind: what a floor hides is claimed once its bound has passed (each session's test
clock moves a second per claim)."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg

DEPLOYMENT = "floor-race"
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
    worker_id => $2, batch_size => $3, lease_seconds => 3600)"""
COMPLETE = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1,
    run_ids => $2::uuid[], generations => $3::bigint[])"""
HAND_BACK = """SELECT zeroth.hand_back_to_pending(run_id => $1, worker_id => $2,
    generation => $3)"""
T0 = datetime(2031, 3, 1, 12, 0, 0, tzinfo=UTC)


async def at(conn: asyncpg.Connection, when: datetime) -> None:
    await conn.execute("SELECT set_config('zeroth_test.now', $1, false)", when.isoformat())


async def enqueue(conn: asyncpg.Connection, items: list[dict[str, Any]]) -> list[UUID]:
    rows = await conn.fetch(
        """SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::text::jsonb)
            ORDER BY ordinality""", DEPLOYMENT, json.dumps(items))
    return [row["run_id"] for row in rows]


async def test_sessions_with_floors_start_every_run_once_and_leave_none(connect: Any) -> None:
    total_batches, per_batch, sessions_n = 6, 50, 6
    setup = await connect()
    pin = await connect()
    await pin.execute("BEGIN")
    await pin.fetchval("SELECT txid_current()")  # dead entries stay at the head
    # A dirty head from the start (more than the 100 wasted entries that make a session keep a
    # floor); the drain adds the entries of every run it claims.
    await at(setup, T0 - timedelta(hours=1))
    await enqueue(setup, [{} for _ in range(300)])
    await setup.execute("DELETE FROM zeroth.runs")
    expected: set[UUID] = set()
    for n in range(total_batches):
        await at(setup, T0 + timedelta(seconds=n))
        expected |= set(await enqueue(setup, [{} for _ in range(per_batch)]))
    completed: list[UUID] = []
    handed_back: set[UUID] = set()
    live: dict[UUID, str] = {}  # run → the session holding its lease now
    rng = random.Random(30)
    done = asyncio.Event()
    extra_left = 2  # the enqueues made while the sessions drain

    async def worker(index: int, session: asyncpg.Connection) -> None:
        nonlocal extra_left
        name = f"w{index}"
        clock = T0 + timedelta(seconds=60)
        for step in range(3_000):
            if done.is_set():
                return
            clock += timedelta(seconds=1)
            await at(session, clock)
            if index == 0 and step in (5, 15):
                # Below every floor (a run_after in the past) and above it (a higher priority).
                more = await enqueue(session, [{"run_after": T0.isoformat()},
                                               {"priority": 3}])
                expected.update(more)
                extra_left -= 1
            rows = await session.fetch(CLAIM, DEPLOYMENT, name, 3)
            held = {r["run_id"]: r["lease_generation"] for r in rows if r["run_id"] is not None}
            for run_id in held:
                assert run_id not in live, f"{run_id} leased by {live[run_id]} and {name}"
                live[run_id] = name
            back = [r for r in held if r not in handed_back and rng.random() < 0.15]
            for run_id in back:
                handed_back.add(run_id)
                del live[run_id]
                assert await session.fetchval(HAND_BACK, run_id, name, held.pop(run_id))
            if held:
                for run_id in held:
                    del live[run_id]
                done_rows = await session.fetch(COMPLETE, name, list(held), list(held.values()))
                assert all(r["completed"] for r in done_rows)
                completed.extend(held)
                if len(completed) == len(expected) and not live and not extra_left:
                    done.set()
            else:
                await asyncio.sleep(0)
        raise AssertionError(f"{name} gave up after 3,000 claims")

    sessions = [await connect() for _ in range(sessions_n)]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(worker(i, s) for i, s in enumerate(sessions))), timeout=600)
    finally:
        await pin.execute("ROLLBACK")
    assert len(completed) == len(set(completed)), "a run was completed twice"
    assert set(completed) == expected
    assert handed_back, "no run was handed back below a floor"
    assert await setup.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = $1 AND status <> 'completed'",
        DEPLOYMENT) == 0
