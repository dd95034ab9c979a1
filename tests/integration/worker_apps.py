"""Handlers imported by the worker subprocesses of test_worker_processes.py.

A subprocess is started as ``python -m zeroth_pg.worker --app worker_apps:<handler>`` with
``<repo>/tests/integration`` on ``PYTHONPATH`` and ``WORKER_APPS_DSN`` naming the database. The
handlers talk to the test only through the database: they append rows to ``public.events``
(created by the test from :data:`EVENTS_DDL`) and wait for ``release`` rows the test inserts.
Nothing here sleeps to coordinate; sleeps only pace the simulated work.

``scripted`` is driven by the run's payload:

* ``ticks``: how many checkpointed steps to run (each ``step_seconds`` long) before returning.
  ``null`` ticks forever, checkpointing every step, until the run is released;
* ``gate``: after the ticks, wait for a release before returning.

A run is released by an event ``(run_id, generation, kind='release')`` with the generation of
the lease that should let go, or generation 0 for whichever generation runs it.

``exit_on_poison`` kills its own process (``os._exit(9)``, as an OOM kill or a segfault would:
no cleanup, no outcome written) for a run whose payload has ``poison``; any other run sleeps
``seconds`` and completes. ``sigterm_on_poison`` instead sends its own process SIGTERM and never
finishes (a node-pressure eviction that hits the same run every time looks like this): the worker
drains, stops the handler at its shutdown timeout and hands the run back.

``raises_on_request`` raises what its payload's ``raise`` names (``exit``: ``sys.exit(3)``,
``interrupt``: KeyboardInterrupt, ``huge``: a ValueError with a 50 MB message); without it the
run waits for its release and completes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import asyncpg

from zeroth_pg import App
from zeroth_pg.errors import LeaseLostError
from zeroth_pg.worker import RunContext

__all__ = [
    "EVENTS_DDL",
    "POISON_EXIT_CODE",
    "app",
    "exit_on_poison",
    "fleet",
    "periodic_app",
    "raises_on_request",
    "scripted",
    "sigterm_on_poison",
    "sleeper",
    "tagged",
]

EVENTS_DDL = """
    CREATE TABLE public.events (
        id         bigserial PRIMARY KEY,
        run_id     uuid NOT NULL,
        worker_id  text NOT NULL,
        generation bigint NOT NULL,
        kind       text NOT NULL,
        data       jsonb NOT NULL DEFAULT '{}',
        at         timestamptz NOT NULL DEFAULT clock_timestamp()
    )"""

POISON_EXIT_CODE = 9  # what a worker process that ran a poison run exits with
_POLL = 0.05
_pool: asyncpg.Pool | None = None
_pool_lock: asyncio.Lock | None = None


async def _events_pool() -> asyncpg.Pool:
    """A small pool of this process, apart from the worker's own (which the worker closes)."""
    global _pool, _pool_lock
    if _pool_lock is None:
        _pool_lock = asyncio.Lock()
    async with _pool_lock:
        if _pool is None:
            _pool = await asyncpg.create_pool(os.environ["WORKER_APPS_DSN"], min_size=1,
                                              max_size=4)
    return _pool


async def _insert(ctx: RunContext, kind: str, data: dict[str, Any] | None = None) -> None:
    pool = await _events_pool()
    await pool.execute(
        """INSERT INTO public.events (run_id, worker_id, generation, kind, data)
           VALUES ($1, $2, $3, $4, $5::text::jsonb)""",
        ctx.run_id, ctx.worker_id, ctx.lease_generation, kind, json.dumps(data or {}))


async def record(ctx: RunContext, kind: str, data: dict[str, Any] | None = None) -> None:
    """Append an event; a cancellation arriving meanwhile does not lose it."""
    write = asyncio.ensure_future(_insert(ctx, kind, data))
    while not write.done():
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # The handler is being stopped; it re-raises its own stop right after recording.
            continue
    write.result()


async def released(ctx: RunContext) -> bool:
    pool = await _events_pool()
    return bool(await pool.fetchval(
        """SELECT EXISTS (SELECT 1 FROM public.events e
                           WHERE e.run_id = $1 AND e.kind = 'release'
                             AND e.generation IN (0, $2))""",
        ctx.run_id, ctx.lease_generation))


async def scripted(ctx: RunContext) -> dict[str, Any]:
    """Checkpointed steps resumed from the last checkpoint, then optionally a gate."""
    payload = ctx.payload
    ticks = payload.get("ticks")
    step_seconds = float(payload.get("step_seconds", 0.2))
    start = int((ctx.checkpoint_data or {}).get("step", 0))
    resumed_from = {
        "resumed_from": start if ctx.recovery_checkpoint_id is not None else None,
        "recovery_checkpoint_id": (None if ctx.recovery_checkpoint_id is None
                                   else str(ctx.recovery_checkpoint_id)),
    }
    await record(ctx, "started", {**resumed_from, "recovered": ctx.recovered,
                                  "attempt": ctx.attempt})
    step = start
    try:
        while True:
            if ticks is not None and step >= int(ticks):
                break
            if ticks is None and await released(ctx):
                break
            await asyncio.sleep(step_seconds)
            step += 1
            await ctx.checkpoint({"step": step, "generation": ctx.lease_generation,
                                  "worker_id": ctx.worker_id})
        if payload.get("gate"):
            await record(ctx, "gated", {"step": step})
            while True:  # polls the database: the release comes from another process
                if await released(ctx):
                    break
                await asyncio.sleep(_POLL)
    except asyncio.CancelledError:
        await record(ctx, "stopped", {"why": "cancelled", "step": step,
                                      "cancel_requested": ctx.cancel_requested})
        raise
    except LeaseLostError:
        await record(ctx, "stopped", {"why": "lease_lost_error", "step": step,
                                      "cancel_requested": ctx.cancel_requested})
        raise
    await record(ctx, "completing", {"step": step})
    return {"worker_id": ctx.worker_id, "generation": ctx.lease_generation, "steps": step,
            "attempt": ctx.attempt, "recovered": ctx.recovered, **resumed_from}


async def sleeper(ctx: RunContext) -> dict[str, Any]:
    """About ``seconds`` of work bracketed by started/finished events (for overlap checks)."""
    await record(ctx, "started")
    await asyncio.sleep(float(ctx.payload.get("seconds", 0.1)))
    await record(ctx, "finished")
    return {"worker_id": ctx.worker_id, "generation": ctx.lease_generation}


async def exit_on_poison(ctx: RunContext) -> dict[str, Any]:
    """A ``poison`` run takes its worker process down (``os._exit``: no handler returns, no
    lease is given back, nothing more is written); any other run works ``seconds`` and
    completes. The ``started`` event, committed before the exit, says which attempt died where."""
    poison = bool(ctx.payload.get("poison"))
    await record(ctx, "started", {"attempt": ctx.attempt, "recovered": ctx.recovered,
                                  "poison": poison})
    if poison:
        os._exit(POISON_EXIT_CODE)
    await asyncio.sleep(float(ctx.payload.get("seconds", 0.1)))
    return {"worker_id": ctx.worker_id, "generation": ctx.lease_generation,
            "attempt": ctx.attempt}


async def sigterm_on_poison(ctx: RunContext) -> dict[str, Any]:
    """A ``poison`` run asks its own worker process to stop (SIGTERM) and then outlives the
    shutdown timeout; any other run works ``seconds`` and completes."""
    poison = bool(ctx.payload.get("poison"))
    await record(ctx, "started", {"attempt": ctx.attempt, "recovered": ctx.recovered,
                                  "poison": poison})
    if poison:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(3600)
    await asyncio.sleep(float(ctx.payload.get("seconds", 0.1)))
    return {"worker_id": ctx.worker_id, "generation": ctx.lease_generation}


async def raises_on_request(ctx: RunContext) -> dict[str, Any]:
    """Raise what ``payload["raise"]`` names, or wait for a release and complete."""
    how = ctx.payload.get("raise")
    await record(ctx, "started", {"raise": how})
    if how == "exit":
        sys.exit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "huge":
        raise ValueError("bad response: " + "x" * (50 * 2**20))
    while True:  # polls the database: the release comes from another process
        if await released(ctx):
            break
        await asyncio.sleep(_POLL)
    return {"worker_id": ctx.worker_id, "generation": ctx.lease_generation}


async def tagged(ctx: RunContext) -> dict[str, Any]:
    """Completes at once with the scope it ran in (for the fleet worker process)."""
    return {"deployment": ctx.scope.deployment_ref, "tenant": ctx.scope.tenant_id,
            "workspace": ctx.scope.workspace_id}


#: A fleet worker's handlers: ``--app worker_apps:fleet`` serves every deployment named here.
fleet = {"fleet-mail": tagged, "fleet-resize": tagged, "fleet-unserved": tagged}


#: An application of three deployments: ``--app worker_apps:app`` serves them (``--deployment``
#: picks some). ``app-shout`` is a plain function: it runs in a thread of its own.
app = App()


@app.deployment("app-greet")
async def greet(run: RunContext, name: str) -> dict[str, Any]:
    return {"hello": name, "tenant": run.scope.tenant_id}


@app.deployment("app-shout", concurrency=1)
def shout(run: Any, text: str) -> dict[str, Any]:
    import threading

    return {"shout": text.upper(), "thread": threading.current_thread().name.split("-")[1]}


@app.deployment("app-unserved")
async def unserved(run: RunContext) -> None: ...


#: An application with a schedule: ``--app worker_apps:periodic_app`` registers ``app-tick`` every
#: second when its worker starts and fires it.
periodic_app = App()


@periodic_app.periodic(interval_seconds=1, payload={"source": "schedule"})
@periodic_app.deployment("app-tick")
async def tick(run: RunContext, source: str) -> dict[str, Any]:
    return {"source": source, "fire": run.metadata.get("zeroth_schedule", {}).get("fire_at")}
