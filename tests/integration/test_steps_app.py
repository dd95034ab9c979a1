"""run.step and run.wait_for_event through App deployments and in-process RunWorkers.

Repeated step names are numbered (name, name#2, ...) the same way in every attempt; a result
that is not JSON fails the run without a retry and records nothing; the step's idempotency key
is exposed while its function runs; a sync handler (SyncRunContext) has the same steps and
waits; a handler that catches Exception around wait_for_event still leaves its worker
(RunSlept is a BaseException).
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
from helpers import wait_until

from zeroth_pg import App
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import EventTimeoutError

WITHIN = 30.0


async def status(pool: asyncpg.Pool, run_id: UUID, wanted: str) -> asyncpg.Record:
    async def check() -> asyncpg.Record | None:
        row = await pool.fetchrow(
            """SELECT r.status::text AS status, r.output::text AS output, r.error::text AS error,
                      r.attempts, r.wait_reason FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
        return row if row is not None and row["status"] == wanted else None

    return await wait_until(check, f"run {run_id} {wanted}", within=WITHIN)  # type: ignore[no-any-return]


async def steps(pool: asyncpg.Pool, run_id: UUID) -> dict[str, Any]:
    rows = await pool.fetch(
        "SELECT step_key, result::text AS result FROM zeroth.run_steps WHERE run_id = $1", run_id)
    return {r["step_key"]: json.loads(r["result"]) for r in rows}


async def test_agent_run_three_steps_and_an_approval(app: App, pool, serve):
    calls: list[str] = []

    @app.deployment("agent")
    async def agent(run, order: str) -> dict[str, Any]:
        async def llm(prompt: str) -> str:
            calls.append(prompt)
            return f"answer to {prompt} ({run.step_idempotency_key})"

        plan = await run.step("llm", llm, "plan")
        draft = await run.step("llm", llm, "draft")  # second use of the name: llm#2
        approval = await run.wait_for_event(f"approval:{order}", timeout=3600)
        final = await run.step("send", lambda: {"sent": True, "approved": approval})
        return {"plan": plan, "draft": draft, "final": final}

    queued = await agent.enqueue(order="42")
    await serve()
    row = await status(pool, queued.run_id, "waiting")
    assert (row["wait_reason"], row["attempts"]) == ("event:approval:42", 0)
    assert calls == ["plan", "draft"]
    assert (await LeaseManager(pool).emit_event("approval:42", {"by": "ann"})).woken == 1
    row = await status(pool, queued.run_id, "completed")
    output = json.loads(row["output"])
    assert output["final"] == {"sent": True, "approved": {"by": "ann"}}
    assert output["plan"] == f"answer to plan ({queued.run_id}:llm)"
    assert output["draft"] == f"answer to draft ({queued.run_id}:llm#2)"
    assert calls == ["plan", "draft"]  # the replay ran no step twice
    assert set(await steps(pool, queued.run_id)) == {"llm", "llm#2", "#event:approval:42", "send"}


async def test_a_result_that_is_not_json_fails_the_run_and_records_nothing(app: App, pool, serve):
    @app.deployment("bad-step", max_attempts=3)
    async def bad_step(run) -> None:
        await run.step("set", lambda: {1, 2})

    queued = await bad_step.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "failed")
    assert "StepResultError" in row["error"]
    assert row["attempts"] == 1  # no retry: the same code returns the same value
    assert await steps(pool, queued.run_id) == {}


async def test_a_sync_handler_steps_and_waits(app: App, pool, serve):
    effects: list[str] = []

    @app.deployment("sync-agent")
    def sync_agent(run) -> dict[str, Any]:
        def effect() -> str:
            effects.append(run.step_key)
            return run.step_idempotency_key

        key = run.step("effect", effect)
        try:
            payload = run.wait_for_event("go", timeout=None)
        except Exception:  # RunSlept is no Exception: this never catches the wait
            effects.append("caught")
            raise
        return {"key": key, "payload": payload}

    queued = await sync_agent.enqueue()
    await serve()
    await status(pool, queued.run_id, "waiting")
    await LeaseManager(pool).emit_event("go", [1])
    row = await status(pool, queued.run_id, "completed")
    assert json.loads(row["output"]) == {"key": f"{queued.run_id}:effect", "payload": [1]}
    assert effects == ["effect"]


async def test_a_timeout_is_an_event_timeout_error_in_every_replay(app: App, pool, serve):
    seen: list[str] = []

    @app.deployment("waits-briefly")
    async def waits_briefly(run) -> str:
        try:
            await run.wait_for_event("never", timeout=0.5)
        except EventTimeoutError as exc:
            seen.append(exc.name)
            return "timed out"
        return "received"

    queued = await waits_briefly.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "completed")
    assert json.loads(row["output"]) == "timed out"
    assert seen == ["never"]
    assert (await steps(pool, queued.run_id))["#event:never"]["outcome"] == "timed_out"


async def test_a_step_name_with_hash_fails_the_run_at_once_without_a_retry(
        app: App, pool, serve):
    @app.deployment("hash-name", max_attempts=3)
    async def hash_name(run) -> None:
        await run.step("a#2", lambda: 1)

    queued = await hash_name.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "failed")
    assert "InvalidNameError" in row["error"]
    assert row["attempts"] == 1  # the same code makes the same mistake: no retry


async def test_an_event_named_with_hash_or_percent_reaches_its_python_wait(
        app: App, pool, serve):
    @app.deployment("hash-event")
    async def hash_event(run) -> Any:
        return [await run.wait_for_event("order#7"), await run.wait_for_event("50%#off")]

    lm = LeaseManager(pool)
    await lm.emit_event("order#7", "seven")
    await lm.emit_event("50%#off", "half")
    queued = await hash_event.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "completed")
    assert json.loads(row["output"]) == ["seven", "half"]


async def test_a_handler_that_swallows_the_wait_writes_nothing_more(app: App, pool, serve):
    seen: list[str] = []

    @app.deployment("swallows")
    async def swallows(run) -> str:
        try:
            await run.wait_for_event("later")
        except BaseException as exc:
            seen.append(type(exc).__name__)
        try:
            await run.step("after", lambda: "stolen")
        except BaseException as exc:
            seen.append(type(exc).__name__)
        return "returned anyway"

    queued = await swallows.enqueue()
    await serve()
    row = await status(pool, queued.run_id, "waiting")
    assert row["wait_reason"] == "event:later"
    await wait_until(lambda: len(seen) == 2, "the handler to return", within=WITHIN)
    # The wait stands (no completion), and the step after it was never recorded.
    assert seen == ["RunSlept", "RunSlept"]
    assert (await status(pool, queued.run_id, "waiting"))["output"] is None
    assert await steps(pool, queued.run_id) == {}
