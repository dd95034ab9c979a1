"""Handlers of test_steps_workers.py, run by real ``python -m zeroth_pg.worker`` subprocesses
(``--app step_apps:<handler>``). Like worker_apps.py they talk to the test only through the
database: every side effect of a step is a ``public.events`` row (kind ``side_effect``), so the
test counts how often each step's function really ran.

``five_steps``: five steps; after step 3 it records ``after_step_3`` and waits for a release
(the test SIGKILLs its worker there). ``approval``: one step, then ``run.wait_for_event`` on
``approval:<run_id>`` with the payload's ``timeout``; returns the event's payload, or
``{"timed_out": true}``. ``fan_out``: starts ``payload["n"]`` children of
``payload["child"]``, records ``children_started``, waits for a release (the test SIGKILLs its
worker there), then ``run.wait_for_children`` and records ``collected`` with what it got.
``gated_child``: records ``child_ran``, waits for a release, returns its ``i`` times 10.
"""

from __future__ import annotations

import asyncio
from typing import Any

from worker_apps import record, released

from zeroth_pg.errors import EventTimeoutError
from zeroth_pg.worker import RunContext

__all__ = ["approval", "fan_out", "five_steps", "gated_child"]

_POLL = 0.05


def _effect(ctx: RunContext, number: int) -> Any:
    async def side_effect() -> int:
        await record(ctx, "side_effect", {"step": number, "key": ctx.step_idempotency_key})
        return number * 10
    return side_effect


async def five_steps(ctx: RunContext) -> dict[str, Any]:
    results = []
    for number in range(1, 6):
        results.append(await ctx.step(f"step-{number}", _effect(ctx, number)))
        if number == 3:
            await record(ctx, "after_step_3")
            while True:  # polls the database: the release comes from the test
                if await released(ctx):
                    break
                await asyncio.sleep(_POLL)
    return {"results": results, "generation": ctx.lease_generation}


async def approval(ctx: RunContext) -> dict[str, Any]:
    prepared = await ctx.step("prepare", _effect(ctx, 1))
    try:
        payload = await ctx.wait_for_event(f"approval:{ctx.run_id}",
                                           timeout=ctx.payload.get("timeout"))
    except EventTimeoutError:
        return {"prepared": prepared, "timed_out": True}
    return {"prepared": prepared, "payload": payload}


async def _gate(ctx: RunContext) -> None:
    while True:  # polls the database: the release comes from the test
        if await released(ctx):
            return
        await asyncio.sleep(_POLL)


async def fan_out(ctx: RunContext) -> dict[str, Any]:
    children = [await ctx.start_child(ctx.payload["child"], {"i": i})
                for i in range(ctx.payload["n"])]
    await record(ctx, "children_started", {"ids": [str(child) for child in children]})
    await _gate(ctx)
    outcomes = await ctx.wait_for_children(children)
    collected = [o.output for o in outcomes]
    await record(ctx, "collected", {"outputs": collected})
    return {"outputs": collected}


async def gated_child(ctx: RunContext) -> int:
    await record(ctx, "child_ran", {"i": ctx.payload["i"]})
    await _gate(ctx)
    return int(ctx.payload["i"]) * 10
