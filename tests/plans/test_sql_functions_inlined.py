"""The per-run paths call no SQL-language function that the planner does not inline (issue 30).

Before PostgreSQL 18 a SQL function that is called rather than inlined is parsed and planned again
at every call (PostgreSQL 18 keeps its plan). On PostgreSQL 15 the SQL helpers every claim called
that way (the scope's limits, the code versions a worker serves, the claim floor's setting name,
the wakeup keys, claim_and_start itself) cost 5-215 µs a call, most of them 15-100, about 230 µs
of server CPU a run at W = 8 (docs/performance.md, "SQL functions planned at every call before
PostgreSQL 18"). What the hot path needs of SQL functions is now inlined — one expression,
declared as volatile as its body (a function declared IMMUTABLE over a STABLE body is called, not
inlined) — and every scalar helper with a query is PL/pgSQL, which keeps its plans for the session
on every version.

The test works these paths in one transaction with track_functions = 'all' (an inlined function is
never counted; a called one is): enqueue_run (with and without a key, and to a thread, which queues
behind the thread's active run), enqueue_runs, announce_idle and announce_busy (the wakeup gate's
stripes), an enqueue that notifies because another session waits behind the gate (the transaction's
count of gate locks reset every round, so each enqueue tries the gate), claim_and_start,
claim_pending and start_run, a claim under max_concurrency (admission slots), by a versioned worker
and under a rate limit with no room left, renew_leases and renew_lease, save_checkpoint,
update_run_progress, commit_fenced, append_run_event, record_step and get_step, a child run
started, claimed and completed and the parent's wait_for_children, settle_runs (the worker's
completions), complete_and_claim, complete_runs, fail_run with a retry, an orphan sweep
(claim_orphaned) and the thread's next run promoted. Six rounds first make the session's PL/pgSQL
plans (custom for five executions, then generic; an IMMUTABLE SQL function with constant arguments
runs once while a plan is made, which counts a call), then one more round is measured: it calls no
function of schema zeroth in LANGUAGE sql. It holds on PostgreSQL 18 as on 15: the planner inlines
the same functions on both.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable

import asyncpg

from zeroth_pg import LeaseManager, SettleKind, Settlement

DEPLOYMENT = "inlined"
RATED = "inlined-rated"
RATE_LIMIT = "inlined-rate"
WORKER = "w-inlined"
# PL/pgSQL makes a custom plan for the first five executions of a statement (plan_cache_mode
# auto), then keeps a generic one: rounds before the measured one.
WARM_ROUNDS = 6

SQL_CALLS = """
    SELECT f.funcname, f.calls
      FROM pg_stat_xact_user_functions f
      JOIN pg_proc p ON p.oid = f.funcid
      JOIN pg_language l ON l.oid = p.prolang
     WHERE f.schemaname = 'zeroth' AND l.lanname = 'sql'"""

_keys = itertools.count()


async def _sql_calls(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["funcname"]: r["calls"] for r in await conn.fetch(SQL_CALLS)}


async def _round(conn: asyncpg.Connection, lm: LeaseManager, idle: LeaseManager) -> None:
    """One pass over the per-run paths (module docstring), every claimed run ended."""
    n = next(_keys)
    thread = f"thread-{n}"
    # Past 64 gate locks a transaction notifies without trying the gate: every round tries it.
    await conn.execute("SELECT set_config('zeroth.wakeup_gate_locks', '0', true)")
    await lm.announce_idle(DEPLOYMENT)
    await lm.announce_busy(DEPLOYMENT)
    await lm.enqueue_run(DEPLOYMENT, {"n": n})
    await lm.enqueue_run(DEPLOYMENT, {"n": n}, idempotency_key=f"key-{n}")
    await lm.enqueue_runs(DEPLOYMENT, [{"payload": {"n": n, "i": i}} for i in range(3)])
    # An idle worker holds the scope's wakeup gate: the next enqueue notifies it.
    await idle.announce_idle(DEPLOYMENT)
    await lm.enqueue_run(DEPLOYMENT, {"n": n, "notified": True})
    await idle.announce_busy(DEPLOYMENT)

    claim = await lm.claim_and_start(DEPLOYMENT, WORKER, batch_size=4)
    held = [(run.run_id, run.lease_generation) for run in claim.runs]
    assert len(held) == 4
    await lm.renew_leases(WORKER, held)
    run_id, generation = held[0]
    assert await lm.renew_lease(run_id, WORKER, generation=generation)
    await lm.save_checkpoint(run_id, WORKER, {"at": n}, generation=generation)
    assert await conn.fetchval(
        "SELECT zeroth.update_run_progress(run_id => $1, worker_id => $2, generation => $3, "
        "progress => $4::text::jsonb)", run_id, WORKER, generation, json.dumps({"done": n}))
    assert await lm.commit_fenced(run_id, WORKER, generation=generation, metadata={"n": n})
    await lm.append_run_event(run_id, WORKER, "progress", {"n": n}, generation=generation)
    await lm.record_step(run_id, WORKER, f"step-{n}", {"ok": True}, generation=generation)
    await lm.get_step(run_id, WORKER, f"step-{n}", generation=generation)
    child = await lm.start_child_run(run_id, WORKER, f"child-{n}", DEPLOYMENT, {"child": n},
                                     generation=generation)
    assert child is not None

    # The rest of the queue (the child and the notified run included), through every claim path.
    pending = await lm.claim_pending_result(DEPLOYMENT, WORKER, batch_size=1)
    for run in pending.runs:
        assert await lm.start_run(run.run_id, WORKER, generation=run.lease_generation)
        held.append((run.run_id, run.lease_generation))
    limited = await lm.claim_and_start(DEPLOYMENT, WORKER, batch_size=1, max_concurrency=100)
    held += [(run.run_id, run.lease_generation) for run in limited.runs]
    versioned = LeaseManager(conn, code_version="v-inlined")
    claimed = await versioned.claim_and_start(DEPLOYMENT, WORKER, batch_size=1)
    held += [(run.run_id, run.lease_generation) for run in claimed.runs]
    # Room for one start an hour: the first round's claim takes one run, every later one none.
    await lm.enqueue_run(RATED, {"n": n})
    rated = await lm.claim_and_start(RATED, WORKER, batch_size=2)
    assert rated.retry_at is not None
    held += [(run.run_id, run.lease_generation) for run in rated.runs]
    assert await lm.claim_orphaned(DEPLOYMENT, WORKER, grace_seconds=0.0) == []

    # Everything but the parent (held[0]) ends; its child among them.
    parent, *rest = held
    settled = await lm.settle_runs(WORKER, [
        Settlement(run_id, generation, SettleKind.COMPLETE, output={"n": n})
        for run_id, generation in rest[:2]])
    assert all(s.outcome is not None for s in settled)
    done = await lm.complete_and_claim(DEPLOYMENT, WORKER, rest[2:4], batch_size=8)
    assert all(c.completed for c in done.completions)
    rest = rest[4:] + [(run.run_id, run.lease_generation) for run in done.claim.runs]
    while rest:
        assert all(c.completed for c in await lm.complete_runs(WORKER, rest))
        more = await lm.claim_and_start(DEPLOYMENT, WORKER, batch_size=8)
        rest = [(run.run_id, run.lease_generation) for run in more.runs]
    wait = await lm.wait_for_children(parent[0], WORKER, f"wait-{n}", [child.child_run_id],
                                      generation=parent[1])
    assert wait is not None
    assert wait.outcome == "ready"
    assert await lm.fail_run(parent[0], WORKER, generation=parent[1], error={"why": "retried"},
                             retryable=True, retry_base_seconds=3600,
                             retry_max_seconds=3600) is not None

    # A thread: the second run queues behind the first, and is promoted when the first ends.
    await lm.enqueue_run(DEPLOYMENT, {"n": n}, thread_id=thread)
    await lm.enqueue_run(DEPLOYMENT, {"n": n, "second": True}, thread_id=thread)
    for _ in range(2):
        run = (await lm.claim_and_start(DEPLOYMENT, WORKER, batch_size=1)).runs[0]
        assert run.thread_id == thread
        assert all(c.completed for c in await lm.complete_runs(
            WORKER, [(run.run_id, run.lease_generation, {"ok": True})]))


async def test_the_per_run_paths_call_no_sql_function_that_is_not_inlined(
        connect: Callable[..., Awaitable[asyncpg.Connection]]) -> None:
    conn = await connect()
    lm = LeaseManager(conn, lease_duration_seconds=60.0)
    # The idle worker's session: the wakeup gate is held by another session than the writer's.
    idle = LeaseManager(await connect())
    await conn.execute("SET track_functions = 'all'")
    # One transaction: pg_stat_xact_user_functions counts its calls as they happen.
    async with conn.transaction():
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
        await lm.set_rate_limit(RATE_LIMIT, 1, 3600)
        await lm.set_scope_limits(RATED, rate_limit=RATE_LIMIT)
        for _ in range(WARM_ROUNDS):
            await _round(conn, lm, idle)
        before = await _sql_calls(conn)

        await _round(conn, lm, idle)

        after = await _sql_calls(conn)
    called = {name: calls - before.get(name, 0) for name, calls in after.items()
              if calls > before.get(name, 0)}
    assert called == {}, (
        "SQL-language functions called (not inlined) on the per-run paths, each parsed and "
        f"planned at every call before PostgreSQL 18: {json.dumps(called, sort_keys=True)}")
