"""The chaos soak's handler, run by ``python -m zeroth_pg.worker --app chaos_apps:work``.

A worker process finds this module through ``PYTHONPATH=<repo>/tests/chaos`` and the audit
database through ``CHAOS_AUDIT_DSN`` (chaos_history.py has the tables). The payload is the plan:
``steps_ms`` (the work of each step) and ``fail_first_attempt`` (raise once, to exercise
fail_run's retry). The handler resumes at the step of its recovery checkpoint, sleeps each step,
checkpoints it, commits its progress, and returns its lease in the output.

The handler logs its start, and brackets every fenced write in ``public.chaos_events`` on its
own connection (outside the fence): ``attempt`` before it, then ``accepted``, ``refused`` or
``in_doubt`` (a transient error came first, so an earlier try may have landed). The value written
carries the writer's generation, worker id and write id (``eid``) for the history triggers.

A step — its work and its checkpoint — is seen through even when the worker cancels the handler
meanwhile, like handler code busy somewhere that does not notice cancellation: the stop takes
effect after the step. So a worker frozen past its lease wakes up to finish its steps against
the fence, and the log always says what the database answered. Transient errors (a terminated
backend, a restarting server) are retried with the same ids: a checkpoint is written under
``checkpoint_id = eid``, so a retry of a write that landed replaces it instead of adding one.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg

import zeroth_pg
from zeroth_pg.errors import LeaseLostError, RetryableError, translate
from zeroth_pg.worker import RunContext

__all__ = ["FlakyStepError", "work"]

AUDIT_RETRY_SECONDS = 60.0  # the audit must outlive any fault the soak injects
WRITE_RETRY_SECONDS = 10.0  # then the handler gives up and the worker fails the attempt
RETRY_PAUSE = 0.1

T = TypeVar("T")

_pool: asyncpg.Pool | None = None
_pool_lock = asyncio.Lock()


class FlakyStepError(RuntimeError):
    """Raised once by runs planned to fail their first attempt."""


async def _audit_pool(worker_id: str) -> asyncpg.Pool:
    global _pool
    async with _pool_lock:
        if _pool is None:
            # zeroth_pg's pool, as a handler's own pool should be: behind PgBouncers that
            # report a stale role after a failover, asyncpg's own stayed on a standby and every
            # audit insert was refused read-only (docs/dba-guide.md "PgBouncer in front").
            _pool = await zeroth_pg.create_pool(
                os.environ["CHAOS_AUDIT_DSN"], min_size=1, max_size=3,
                server_settings={"application_name": f"chaos-audit:{worker_id}"})
    return _pool


async def _append(ctx: RunContext, kind: str, *, write_id: uuid.UUID | None = None,
                  data: dict[str, Any] | None = None) -> None:
    event_id = uuid.uuid4()  # retried inserts of one event land once
    deadline = time.monotonic() + AUDIT_RETRY_SECONDS
    while True:
        try:
            pool = await _audit_pool(ctx.worker_id)
            await pool.execute(
                """INSERT INTO public.chaos_events
                       (event_id, source, kind, run_id, worker_id, generation, write_id, data)
                   VALUES ($1, 'handler', $2, $3, $4, $5, $6, $7::text::jsonb)
                   ON CONFLICT (event_id) DO NOTHING""",
                event_id, kind, ctx.run_id, ctx.worker_id, ctx.lease_generation, write_id,
                json.dumps(data or {}))
            return
        except Exception as exc:
            if not isinstance(translate(exc), RetryableError) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(RETRY_PAUSE)


async def _see_through(work: Awaitable[T]) -> T:
    """Await ``work`` to the end even if this task is cancelled meanwhile; then re-raise the
    cancellation, so a stop takes effect right after the step that was under way."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def _write(ctx: RunContext, kind: str, write_id: uuid.UUID, value: dict[str, Any]
                 ) -> tuple[str, Exception | None]:
    """One fenced write, retried through transient errors. Returns the outcome to record and
    the error to raise after recording it (None when accepted)."""
    deadline = time.monotonic() + WRITE_RETRY_SECONDS
    transient: Exception | None = None
    while True:
        try:
            if kind == "checkpoint":
                await ctx.checkpoint(value, checkpoint_id=write_id)
            else:
                await ctx.commit(progress=value)
            return "accepted", None
        except LeaseLostError as exc:
            return ("refused" if transient is None else "in_doubt"), exc
        except RetryableError as exc:
            transient = exc
            if time.monotonic() > deadline:
                return "in_doubt", exc
            await asyncio.sleep(RETRY_PAUSE)


async def _audited_write(ctx: RunContext, kind: str, data: dict[str, Any]) -> None:
    write_id = uuid.uuid4()
    value = {**data, "eid": str(write_id), "generation": ctx.lease_generation,
             "worker_id": ctx.worker_id}
    await _append(ctx, "attempt", write_id=write_id, data={"write": kind})
    outcome, error = await _write(ctx, kind, write_id, value)
    await _append(ctx, outcome, write_id=write_id, data={"write": kind})
    if error is not None:
        raise error


async def _step(ctx: RunContext, milliseconds: int, step: int) -> None:
    await asyncio.sleep(milliseconds / 1000)
    await _audited_write(ctx, "checkpoint", {"step": step})


async def work(ctx: RunContext) -> dict[str, Any]:
    steps: list[int] = ctx.payload["steps_ms"]
    done = int((ctx.checkpoint_data or {}).get("step", 0))
    await _see_through(_append(ctx, "handler_start", data={
        "resumed_step": done, "recovered": ctx.recovered, "attempt": ctx.attempt}))
    for step in range(done, len(steps)):
        await _see_through(_step(ctx, steps[step], step + 1))
    if ctx.payload.get("fail_first_attempt") and ctx.attempt == 1:
        raise FlakyStepError("planned failure of the first attempt")
    await _see_through(_audited_write(ctx, "commit", {"step": len(steps)}))
    return {"generation": ctx.lease_generation, "worker_id": ctx.worker_id, "steps": len(steps)}
