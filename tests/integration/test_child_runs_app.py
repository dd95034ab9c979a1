"""run.start_child and run.wait_for_children through App deployments and in-process RunWorkers.

A parent fans out 100 children and fans in: every child's output comes back, in the order the
parent started them, and the parent's replay (after its wait) starts none of them again. A wait
for any child returns at the first end; a failed child (dead-lettered after its retries) is an
outcome, not an exception; a sync handler does the same; cancelling a waiting parent cancels
its children, except those it started detached.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
from helpers import wait_until

from zeroth_pg import App
from zeroth_pg.client import LeaseManager

WITHIN = 60.0


async def status(pool: asyncpg.Pool, run_id: UUID, wanted: str) -> asyncpg.Record:
    async def check() -> asyncpg.Record | None:
        row = await pool.fetchrow(
            """SELECT r.status::text AS status, r.output::text AS output, r.attempts,
                      r.wait_reason FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
        return row if row is not None and row["status"] == wanted else None

    return await wait_until(check, f"run {run_id} {wanted}", within=WITHIN)  # type: ignore[no-any-return]


async def children_of(pool: asyncpg.Pool, run_id: UUID) -> list[asyncpg.Record]:
    return list(await pool.fetch(
        """SELECT r.run_id, r.status::text AS status, r.deployment_ref FROM zeroth.runs r
            WHERE r.parent_run_id = $1 ORDER BY r.created_at, r.run_id""", run_id))


async def test_fan_out_100_children_and_fan_in(app: App, pool, serve):
    calls = {"parent": 0, "child": 0}

    @app.deployment("square")
    async def square(run, n: int) -> int:
        calls["child"] += 1
        return n * n

    @app.deployment("fan-out")
    async def fan_out(run, count: int) -> dict[str, Any]:
        calls["parent"] += 1
        ids = [await run.start_child("square", {"n": i}) for i in range(count)]
        outcomes = await run.wait_for_children(ids)
        assert [o.run_id for o in outcomes] == ids
        return {"squares": [o.output for o in outcomes],
                "statuses": sorted({o.status.value for o in outcomes if o.status})}

    queued = await fan_out.enqueue(count=100)
    await serve(max_concurrency=20)
    row = await status(pool, queued.run_id, "completed")
    assert json.loads(row["output"]) == {"squares": [i * i for i in range(100)],
                                         "statuses": ["completed"]}
    children = await children_of(pool, queued.run_id)
    assert len(children) == 100
    assert {c["status"] for c in children} == {"completed"}
    assert calls["child"] == 100  # every child ran once
    # Once if every child had ended by its wait, else once more after the wait was met.
    assert calls["parent"] in (1, 2)
    assert row["attempts"] == 1  # waiting gave the attempt back
    steps = await pool.fetchval(
        """SELECT count(*) FROM zeroth.run_steps s WHERE s.run_id = $1
              AND s.step_key LIKE '#child:square%'""", queued.run_id)
    assert steps == 100


async def test_any_returns_at_the_first_end_and_a_dead_letter_is_an_outcome(app: App, pool,
                                                                             serve):
    @app.deployment("flaky", max_attempts=2)
    async def flaky(run) -> None:
        raise RuntimeError("always")

    @app.deployment("slow")
    async def slow(run) -> str:
        await run.wait_for_event(f"go:{run.run_id}")
        return "late"

    @app.deployment("chooser")
    async def chooser(run) -> dict[str, Any]:
        bad = await run.start_child("flaky", key="bad")
        late = await run.start_child("slow", key="late")
        first = await run.wait_for_children([bad, late], mode="any")
        return {"first": [(o.status.value if o.status else None, o.dead_lettered)
                          for o in first],
                "error": first[0].error is not None, "late_id": str(late)}

    queued = await chooser.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "completed")
    out = json.loads(row["output"])
    assert out["first"] == [["failed", True], [None, False]]
    assert out["error"] is True
    # The slow child is still waiting for its event: an "any" wait does not cancel the rest.
    assert (await status(pool, UUID(out["late_id"]), "waiting"))["status"] == "waiting"


async def test_a_sync_handler_starts_and_waits(app: App, pool, serve):
    @app.deployment("double")
    def double(run, n: int) -> int:
        return 2 * n

    @app.deployment("sync-parent")
    def sync_parent(run) -> list[int]:
        ids = [run.start_child("double", {"n": n}) for n in (1, 2, 3)]
        return [o.output for o in run.wait_for_children(ids)]

    queued = await sync_parent.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "completed")
    assert json.loads(row["output"]) == [2, 4, 6]


async def test_cancelling_a_waiting_parent_cancels_its_children_but_not_detached_ones(
        app: App, pool, serve):
    @app.deployment("kid")
    async def kid(run) -> None:  # never served below: the children stay pending
        return None

    @app.deployment("cancel-parent")
    async def cancel_parent(run) -> None:
        attached = await run.start_child("kid", {"role": "attached"}, key="attached")
        await run.start_child("kid", {"role": "detached"}, key="detached", detached=True)
        await run.wait_for_children([attached])

    queued = await cancel_parent.enqueue()
    await serve("cancel-parent")
    await status(pool, queued.run_id, "waiting")
    assert await LeaseManager(pool).request_cancel(queued.run_id) == "cancelled"
    await status(pool, queued.run_id, "cancelled")
    roles = {json.loads(r["payload"])["role"]: r["status"] for r in await pool.fetch(
        """SELECT r.payload::text AS payload, r.status::text AS status FROM zeroth.runs r
            WHERE r.parent_run_id = $1""", queued.run_id)}
    assert roles == {"attached": "cancelled", "detached": "pending"}
