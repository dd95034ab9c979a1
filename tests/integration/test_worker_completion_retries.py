"""A completion the server cancels or holds up is retried without failing the run or holding up
the others (RunWorker in the test's event loop, against a real database): a completion cancelled
by the server (57014) is retried, a held row delays only its own run's completion, not its
batch's, and a completion retrying on a held row does not hold up the completions after it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import worker_probes
from helpers import unique_deployment, wait_until
from worker_probes import (
    wait_for_status,
    worker_errors,
)

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext

spawn_worker = worker_probes.spawn_worker  # the fixture: workers drained at teardown


async def test_a_completion_cancelled_by_the_server_is_retried_said_and_counted_not_a_failure(
        pool, spawn_worker, caplog):
    """statement_timeout or pg_cancel_backend cancelled the completion (57014): the worker took
    it for a value the database refuses and failed a successful run for good. It is retried;
    and not in silence (a settling call that keeps failing left no line until its lease ran
    out): one WARNING naming the run when the retries begin, one INFO when it is answered,
    each retry counted."""
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    run = await lm.enqueue_run(dep, max_attempts=3)
    started, finish = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        started.set()
        await finish.wait()
        return {"done": True}

    await spawn_worker(dep, handler)
    await asyncio.wait_for(started.wait(), timeout=10)
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        # Someone holds the run's row (an application's cancel in an open transaction), so the
        # completion waits for it; then the server cancels that statement.
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", run.run_id)
        finish.set()

        async def blocked_completion() -> int | None:
            return await pool.fetchval(  # type: ignore[no-any-return]
                "SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) "
                "AND query LIKE '%settle_runs%'", holder.get_server_pid())

        pid = await wait_until(blocked_completion, "the completion to wait for the row", within=10)
        assert await pool.fetchval("SELECT pg_cancel_backend($1)", pid)
    finally:
        await tx.rollback()
        await pool.release(holder)
    row = await wait_for_status(pool, run.run_id, "completed", within=20)
    assert (row["attempts"], row["output"]) == (1, {"done": True})
    began = [r for r in caplog.records if "settle_runs" in r.getMessage()
             and "failed; its leases are live, retrying in" in r.getMessage()]
    assert len(began) == 1
    assert began[0].levelno == logging.WARNING
    assert f"run {run.run_id}'s complete" in began[0].getMessage()
    assert began[0].exc_info is not None
    assert getattr(began[0].exc_info[1], "code", None) == "57014"
    answered = [r for r in caplog.records if "answers again" in r.getMessage()]
    assert len(answered) == 1
    assert answered[0].levelno == logging.INFO
    assert answered[0].getMessage().startswith(
        f"settle_runs (run {run.run_id}'s complete) answers again, after 1 failure over ")
    # One retry after the cancel (one more if, on a loaded machine, the held row's 2 s lock
    # timeout came first and split the batch).
    assert worker_errors(dep, "settle_retry") >= 1


async def test_a_held_row_delays_only_its_own_completion_not_its_batch(pool, spawn_worker):
    """settle_runs waits at most 2 s for a row; the batch was retried whole until every run
    in it gave up, so runs nobody held were re-run too. The batch is completed run by run."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    held, free = (await lm.enqueue_run(dep)), (await lm.enqueue_run(dep))
    arrived: set[Any] = set()
    finish = asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        arrived.add(ctx.run_id)
        await finish.wait()  # both return in the same turn: one settle_runs batch
        return {"ok": 1}

    await spawn_worker(dep, handler, lease_duration=30.0)
    await wait_until(lambda: len(arrived) == 2, "both handlers", within=10)
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", held.run_id)
        finish.set()
        await wait_for_status(pool, free.run_id, "completed", within=20)  # while the row is held
    finally:
        await tx.rollback()
        await pool.release(holder)
    row = await wait_for_status(pool, held.run_id, "completed", within=30)
    assert row["attempts"] == 1


async def test_a_completion_retrying_on_a_held_row_does_not_hold_up_later_ones(
        pool, spawn_worker):
    """A completion split off its batch (its row held) retries on its own: the completions
    submitted after it do not wait behind its retries (which may last up to a lease)."""
    dep = unique_deployment("harden")
    lm = LeaseManager(pool)
    held, later = (await lm.enqueue_run(dep, payload={"kind": "held"})), None
    started, finish_held, finish_later = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        if ctx.payload["kind"] == "held":
            started.set()
            await finish_held.wait()
        else:
            await finish_later.wait()
        return {"kind": ctx.payload["kind"]}

    await spawn_worker(dep, handler, lease_duration=30.0)
    await asyncio.wait_for(started.wait(), timeout=10)
    later = await lm.enqueue_run(dep, payload={"kind": "later"})
    await wait_for_status(pool, later.run_id, "running")
    holder = await pool.acquire()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", held.run_id)
        finish_held.set()  # its completion meets the held row and retries
        await asyncio.sleep(2.5)  # past settle_runs' 2 s lock_timeout: it is retrying now
        finish_later.set()
        await wait_for_status(pool, later.run_id, "completed", within=20)  # row still held
    finally:
        await tx.rollback()
        await pool.release(holder)
    assert (await wait_for_status(pool, held.run_id, "completed", within=30))["attempts"] == 1


async def test_a_run_that_ends_while_a_completion_is_out_is_completed_beside_it(
        pool, spawn_worker):
    """Two settling calls go out at once (zeroth_pg.worker._settle.MAX_IN_FLIGHT): a run that
    ends while another run's completion call is out does not wait for that call's answer
    before its own goes out. Here the first call is held inside the server for as long as the
    test likes (a DBA's trigger that waits for a gate, which no lock_timeout cuts short); the
    second run completes while it is held. With one call out at a time it could not."""
    dep = unique_deployment("inflight")
    lm = LeaseManager(pool)
    held = await lm.enqueue_run(dep, payload={"kind": "held"})
    later = await lm.enqueue_run(dep, payload={"kind": "later"})
    arrived: set[Any] = set()
    finish_held, finish_later = asyncio.Event(), asyncio.Event()

    async def handler(ctx: RunContext) -> Any:
        arrived.add(ctx.run_id)
        await (finish_held if ctx.payload["kind"] == "held" else finish_later).wait()
        return {"kind": ctx.payload["kind"]}

    await pool.execute(f"""
        CREATE TABLE public.completion_gate (open boolean NOT NULL);
        GRANT SELECT ON public.completion_gate TO PUBLIC;
        CREATE FUNCTION public.hold_completion() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF OLD.run_id = '{held.run_id}' AND NEW.status::text = 'completed' THEN
                WHILE NOT EXISTS (SELECT 1 FROM public.completion_gate WHERE open) LOOP
                    PERFORM pg_sleep(0.02);
                END LOOP;
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER hold_completion BEFORE UPDATE ON zeroth.runs
            FOR EACH ROW EXECUTE FUNCTION public.hold_completion();""")
    try:
        # No call bound: the held call stays out until the gate opens (a bound would cut it
        # after 5 s and let the later completion go out after it).
        await spawn_worker(dep, handler, max_concurrency=2, call_timeout=None)
        await wait_until(lambda: len(arrived) == 2, "both handlers", within=10)
        finish_held.set()

        async def held_in_the_trigger() -> Any:
            return await pool.fetchrow(
                """SELECT pid, query_start FROM pg_stat_activity
                    WHERE wait_event = 'PgSleep' AND query LIKE '%zeroth.%'""")

        first = await wait_until(held_in_the_trigger, "the held run's completion call",
                                 within=10)
        finish_later.set()
        await wait_for_status(pool, later.run_id, "completed", within=20)
        # The same statement is still held: the later completion went out beside it.
        assert await held_in_the_trigger() == first
        assert (await pool.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1",
                                    held.run_id)) == "running"
    finally:
        await pool.execute("INSERT INTO public.completion_gate VALUES (true)")
    row = await wait_for_status(pool, held.run_id, "completed", within=30)
    assert row["attempts"] == 1
