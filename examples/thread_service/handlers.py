"""The run handler of the thread service's worker processes.

``python -m zeroth_pg.worker --deployment thread-service --app handlers:chat`` (with this folder
on ``PYTHONPATH`` and ``ZEROTH_PG_DSN`` set). ``chat`` stands in for one assistant turn: a few
steps, each recorded as progress and typed accounting (fenced: a handler that lost its lease
stops), then a reply. A cancel reaches it as task cancellation; the worker then ends the run as
cancelled.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from zeroth_pg.errors import LeaseLostError
from zeroth_pg.threads import ThreadRuns, TokenUsage
from zeroth_pg.worker import RunContext

_threads: ThreadRuns | None = None


async def _thread_runs() -> ThreadRuns:
    global _threads
    if _threads is None:
        import asyncpg

        _threads = ThreadRuns(await asyncpg.create_pool(os.environ["ZEROTH_PG_DSN"],
                                                        min_size=1, max_size=4))
    return _threads


async def chat(ctx: RunContext) -> dict[str, Any]:
    """``payload``: message, steps (default 3), step_seconds (default 0.05)."""
    threads = await _thread_runs()
    message = str(ctx.payload.get("message", ""))
    steps = int(ctx.payload.get("steps", 3))
    for step in range(1, steps + 1):
        await asyncio.sleep(float(ctx.payload.get("step_seconds", 0.05)))
        usage = TokenUsage(message_count=step, input_tokens=10 * step, output_tokens=5 * step,
                           total_tokens=15 * step, llm_call_count=step,
                           last_message=f"step {step} of {message!r}")
        if not await threads.update_run_progress(
                ctx.run_id, ctx.worker_id, generation=ctx.lease_generation,
                progress={"step": step, "steps": steps}, accounting=usage):
            raise LeaseLostError("progress refused: lease lost", run_id=ctx.run_id)
    return {"reply": f"echo: {message}", "worker_id": ctx.worker_id, "steps": steps}
