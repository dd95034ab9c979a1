"""Attacks on the application API (zeroth_pg.App), per-deployment worker limits and
the OpenTelemetry hooks, on real sessions.

Each test pins down an attack and the promise it tries to break. No mocks; waits have deadlines
(helpers.wait_until). Where a bug would freeze the event loop a test runs the worker in a
subprocess of its own, so the freeze cannot hang the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from helpers import wait_until

from zeroth_pg import App, InvalidPayloadError, RetryPolicy
from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import InvalidArgumentError

WITHIN = 30.0


async def status_of(pool: asyncpg.Pool, run_id: Any) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status::text AS status, attempts, error::text AS error, output::text AS output "
        "FROM zeroth.runs WHERE run_id = $1", run_id)


async def finished(pool: asyncpg.Pool, run_id: Any) -> asyncpg.Record:
    async def done() -> asyncpg.Record | None:
        row = await status_of(pool, run_id)
        return row if row["status"] in ("completed", "failed", "cancelled") else None
    return await wait_until(done, f"run {run_id} to finish", within=WITHIN)


async def enqueue_raw(pool: asyncpg.Pool, deployment: str, payload_json: str,
                      metadata_json: str = "{}", max_attempts: int = 3) -> Any:
    """What another client (psql) writes: zeroth.enqueue_run with any JSON."""
    return await pool.fetchval(
        "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => $1, payload => $2::text::jsonb,"
        " metadata => $3::text::jsonb, max_attempts => $4)",
        deployment, payload_json, metadata_json, max_attempts)


# -- 1. every served deployment limited below max_concurrency: the claim loop spins ------------

FROZEN_WORKER = r"""
import asyncio, sys
from zeroth_pg import App

app = App(sys.argv[1])

@app.deployment("limited-only", concurrency=1)
async def limited(run, n: int) -> int:
    await asyncio.sleep(0)
    return n

async def main():
    worker = await app.worker(poll_interval=0.05, orphan_sweep_interval=0.2)
    await worker.start()
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_worker_whose_every_deployment_is_limited_keeps_serving(pool, database_dsn):
    """FIXED (critical, promise 5). One deployment with ``concurrency=1`` under the default
    max_concurrency (8): the first pass claims 1 run (a "full" claim, so ``_backlog`` is True);
    the next pass finds every deployment at its limit, ``_claim_groups`` returns [] and
    ``_claim_pass`` returns None without awaiting anything; ``_gate.busy()`` holds nothing and
    does not await; ``_sleep_until_work`` returns at once (a free slot and ``_backlog``).
    ``poll_loop`` never yields again: the event loop is frozen, the claimed handler never runs,
    no lease is renewed, SIGTERM is never handled. Runs in a subprocess so the freeze cannot
    hang this session."""
    client = App(database_dsn, pool=pool)

    @client.deployment("limited-only", concurrency=1)
    async def limited(run, n: int) -> int: ...

    runs = [await limited.enqueue(n=i) for i in range(3)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FROZEN_WORKER, database_dsn,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        try:
            await wait_until(lambda: pool.fetchval(
                "SELECT count(*) = 3 FROM zeroth.runs WHERE status = 'completed' "
                "AND run_id = ANY($1)", [r.run_id for r in runs]),
                "the 3 runs of the limited deployment to complete", within=WITHIN)
        except AssertionError as exc:
            statuses = await pool.fetch(
                "SELECT status::text, count(*) FROM zeroth.runs GROUP BY 1 ORDER BY 1")
            stat = await asyncio.to_thread(Path(f"/proc/{proc.pid}/stat").read_text)
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            raise AssertionError(
                f"{exc}; runs by status {[tuple(r) for r in statuses]}; the worker process "
                f"used {cpu:.1f} s of CPU in {WITHIN:g} s (a spinning, frozen event loop)"
            ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def test_a_limited_deployment_alone_with_its_limit_equal_to_the_worker_cap_works(
        app, pool, serve):
    """HOLDS: with concurrency == max_concurrency the shared claim is used (room == free), and
    the loop sleeps normally."""
    @app.deployment("equal-cap", concurrency=2)
    async def equal(run, n: int) -> int:
        return n

    runs = [await equal.enqueue(n=i) for i in range(5)]
    await serve(max_concurrency=2)
    for run in runs:
        assert (await finished(pool, run.run_id))["status"] == "completed"


# -- 2. a limited deployment left in _deployments_full: claims in a hot loop --------------------

async def test_an_idle_worker_does_not_claim_in_a_hot_loop(app, pool, serve):
    """FIXED (medium, promise 5 "nothing looping for ever"). A (concurrency=2) filled its own
    claim, so it is in ``_deployments_full``; B's 2 runs keep 2 of 4 slots. When A's runs end,
    free == 2 == A's room, so A is claimed through the shared claim, which never updates
    ``_deployments_full``; the queue is empty, yet ``_sleep_until_work`` returns at once
    because ``_deployment_has_room()`` stays True: a claim round trip after another, as fast as
    the database answers, for as long as B's runs last (hours, for a long handler).
    poll_interval is 30 s here: a worker that sleeps makes a handful of passes in the window."""
    release = asyncio.Event()

    @app.deployment("a-limited", concurrency=2)
    async def quick(run) -> int:
        return 1

    @app.deployment("b-open")
    async def slow(run) -> int:
        await release.wait()
        return 2

    a_runs = await quick.enqueue_many([{}, {}])
    await slow.enqueue_many([{}, {}])
    worker = await serve(max_concurrency=4, poll_interval=30.0, orphan_sweep_interval=60.0)
    try:
        for run in a_runs:
            assert (await finished(pool, run.run_id))["status"] == "completed"
        await wait_until(lambda: pool.fetchval(
            "SELECT count(*) = 2 FROM zeroth.runs WHERE deployment_ref = 'b-open' "
            "AND status = 'running'"), "B's runs to hold their slots", within=WITHIN)
        await asyncio.sleep(0.2)  # let the completions settle
        before = worker._claim_round  # one increment per claim pass (and per sweep)
        await asyncio.sleep(1.0)  # an observation window, not a deadline
        passes = worker._claim_round - before
        assert passes < 50, f"{passes} claim passes in 1 s with nothing to claim"
    finally:
        release.set()


# -- 3. a payload key named like the run parameter passes every check, then breaks the call ----

async def test_enqueue_refuses_a_payload_key_named_like_the_run_parameter(app, pool):
    """FIXED (medium, promise "bad input gets a clear error and changes nothing"). A handler
    ``(run, **extra)``: ``enqueue(run=1)`` passes ``_check`` (``run`` goes to ``**extra``) and a
    run is created that can never execute (``fn(run, **{"run": 1})`` is a TypeError)."""
    @app.deployment("kw-handler")
    async def kw(run, **extra: Any) -> int:
        return len(extra)

    with pytest.raises(InvalidPayloadError):
        await kw.enqueue(run=1)
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.runs WHERE deployment_ref = 'kw-handler'") == 0


@pytest.mark.parametrize("sync", [False, True])
async def test_a_stored_payload_colliding_with_the_run_parameter_fails_without_retry(
        app, pool, serve, sync):
    """FIXED (medium). Another client writes ``{"ctx": 1}`` for a handler ``(ctx, **extra)``:
    ``handle`` checks it (fits ``**extra``), the call raises TypeError ("got multiple values
    for argument 'ctx'"), a retryable failure: every attempt is burnt and the run dead-letters
    with a TypeError instead of failing once with InvalidPayloadError as the module promises
    for a payload that does not fit its handler."""
    if sync:
        def handler(ctx, **extra: Any) -> int:
            return len(extra)
    else:
        async def handler(ctx, **extra: Any) -> int:  # type: ignore[misc]
            return len(extra)
    name = f"collide-{'sync' if sync else 'async'}"
    app.deployment(name, retry=RetryPolicy(0, 0))(handler)
    run_id = await enqueue_raw(pool, name, '{"ctx": 1}', max_attempts=3)
    await serve()
    row = await finished(pool, run_id)
    error = json.loads(row["error"])
    assert (row["status"], row["attempts"], error["type"]) == ("failed", 1, "InvalidPayloadError")


async def test_a_positional_only_run_parameter_takes_a_payload_key_of_its_name(app, pool, serve):
    """HOLDS: with ``(run, /, **extra)`` a payload key ``run`` is just an extra argument."""
    @app.deployment("posonly")
    async def posonly(run, /, **extra: Any) -> dict[str, Any]:
        return extra

    queued = await posonly.enqueue(run=7)
    await serve()
    row = await finished(pool, queued.run_id)
    assert (row["status"], json.loads(row["output"])) == ("completed", {"run": 7})


# -- 4. a sync handler stopped by a cancel keeps running in its thread --------------------------

async def test_a_deployment_limit_counts_sync_handlers_still_running_after_a_cancel(
        app, pool, serve):
    """FIXED (medium, the ``concurrency`` promise: "handlers of this deployment running at once
    in one worker"). A sync handler that does not poll ``stop_requested`` (one long blocking
    call) is cancelled: ``_in_thread`` returns at once on CancelledError, the entry leaves the
    worker, and the next run of the ``concurrency=1`` deployment starts while the first thread
    is still running: two handlers at once, which is what the limit exists to prevent (a
    licence, a GPU, a rate-limited API)."""
    lock = threading.Lock()
    gate = threading.Event()
    state = {"live": 0, "peak": 0}
    started: list[Any] = []

    @app.deployment("solo", concurrency=1)
    def solo(run, n: int) -> int:
        with lock:
            state["live"] += 1
            state["peak"] = max(state["peak"], state["live"])
            started.append(run.run_id)
        try:
            gate.wait(WITHIN)  # one long blocking step, stop_requested not polled
        finally:
            with lock:
                state["live"] -= 1
        return n

    @app.deployment("open-lane")  # an unlimited deployment (avoids the freeze of test 1)
    async def lane(run) -> None: ...

    await solo.enqueue(n=1, priority=10)
    second = await solo.enqueue(n=2)
    lm = LeaseManager(pool)
    await serve(max_concurrency=4, lease_duration=3.0)
    try:
        await wait_until(lambda: len(started) == 1, "the first handler to start", within=WITHIN)
        first = started[0]
        await lm.request_cancel(first)
        assert (await finished(pool, first))["status"] == "cancelled"
        # A correct worker does not start the second run while the first thread runs: give a
        # buggy one the chance to show it, then let everything finish.
        with contextlib.suppress(AssertionError):
            await wait_until(lambda: len(started) == 2, "the second handler", within=5.0)
    finally:
        gate.set()
    assert (await finished(pool, second.run_id))["status"] == "completed"
    assert state["peak"] == 1, "two handlers of a concurrency=1 deployment ran at once"


# -- 5. tracing hooks ----------------------------------------------------------------------------

def _foreign_span() -> Any:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    return NonRecordingSpan(SpanContext(trace_id=0x0AF7651916CD43DD8448EB211C80319C,
                                        span_id=0xB7AD6B7169203331, is_remote=True,
                                        trace_flags=TraceFlags(1)))


@pytest.mark.parametrize("metadata", [["not", "an", "object"], 5, "plain string"])
async def test_bad_metadata_is_a_typed_argument_error_inside_a_trace_too(pool, metadata):
    """FIXED (low, "bad input gets a clear error"). Outside a trace, metadata that is not a
    mapping raises InvalidArgumentError (ZP008's class). Inside an active span,
    ``tracing.inject`` runs first and raises a bare TypeError (``{**metadata}`` /
    ``"otel" in 5``): the error a caller gets depends on whether it is being traced."""
    from opentelemetry import trace

    lm = LeaseManager(pool)
    with pytest.raises(InvalidArgumentError):
        await lm.enqueue_run("meta-check", {}, metadata=metadata)
    with trace.use_span(_foreign_span()), pytest.raises(InvalidArgumentError):
        await lm.enqueue_run("meta-check", {}, metadata=metadata)
    assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 0


async def test_hostile_trace_metadata_from_another_client_cannot_break_claims_or_runs(
        app, pool, serve):
    """HOLDS: metadata.otel written by another client (a string, an array, oversize or
    malformed traceparent/tracestate/baggage, numbers, nested objects, someone else's valid
    trace) never breaks ``tracing.received`` (in the claim pass) nor the ``process`` span:
    every run of the batch completes."""
    @app.deployment("traced")
    async def traced(run) -> int:
        return 1

    valid = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    hostile = [
        {"otel": "traceparent"},
        {"otel": ["a", "b"]},
        {"otel": 5},
        {"otel": None},
        {"otel": {}},
        {"otel": {"traceparent": "x" * 100_000}},
        {"otel": {"traceparent": valid + "-" + " " * 400 + "\nx"}},
        {"otel": {"traceparent": 12345, "tracestate": {"a": [1, 2]}}},
        {"otel": {"traceparent": valid, "tracestate": "k=" + "v" * 100_000}},
        {"otel": {"traceparent": valid, "baggage": ("k=v," * 50_000)}},
        {"otel": {"traceparent": [valid, valid]}},
        {"otel": {"traceparent": "ff-" + valid[3:]}},
        {"otel": {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}},
        {"otel": {"traceparent": valid, "": ""}},
        {"otel": {"traceparent": valid}},  # someone else's trace: a link, nothing more
    ]
    ids = [await enqueue_raw(pool, "traced", "{}", json.dumps(m)) for m in hostile]
    await serve()
    for run_id in ids:
        assert (await finished(pool, run_id))["status"] == "completed"


# -- 6. App.close forgets the caller's pool ------------------------------------------------------

async def test_an_app_given_a_pool_does_not_open_and_leak_another_after_close(
        pool, database_dsn):
    """FIXED (low). ``close()`` of an App given a pool leaves that pool open (right) but forgets
    it; the next enqueue silently opens a new pool (from ``dsn``; with no dsn, from
    ZEROTH_PG_DSN or the embedded server: possibly another database) which ``close()`` never
    closes, because ``_own_pool`` is still False."""
    app = App(database_dsn, pool=pool)
    await app.close()
    assert not pool._closed
    second = await app.open()
    try:
        await app.close()
        assert second is pool or second._closed, "a pool the App created was left open"
    finally:
        if second is not pool and not second._closed:
            await second.close()


async def test_concurrent_first_uses_of_an_app_open_one_pool(database_dsn):
    """HOLDS: two concurrent first enqueues share the one pool the App creates."""
    app = App(database_dsn, pool_size=2)

    @app.deployment("race-open")
    async def race(run, n: int) -> int:
        return n

    try:
        pools = await asyncio.gather(app.open(), app.open(), app.open())
        assert pools[0] is pools[1] is pools[2]
        done = await asyncio.gather(race.enqueue(n=1), race.enqueue(n=2))
        assert all(d.created for d in done)
    finally:
        await app.close()
    assert pools[0]._closed


# -- 7. a worker process given a Deployment instead of the App ----------------------------------

_MODULE_APP = App("postgresql://unused.invalid/none")


@_MODULE_APP.deployment("module-level")
def module_level(run, to: str) -> str:
    return to


def test_load_app_of_a_deployment_does_not_call_the_bare_function():
    """FIXED (low). ``zeroth-pg worker --app mod:send_email --deployment send-email`` (the
    Deployment, not the App): ``load_app`` sees a callable and returns the Deployment itself,
    whose ``__call__`` is the raw function: every run calls ``fn(ctx)`` without its payload
    (TypeError, retried until dead letter), and a plain ``def`` runs on the event loop and
    then its result is awaited. It should serve ``Deployment.handle`` or refuse at start."""
    from zeroth_pg.worker._process import load_app

    with pytest.raises(ValueError, match="one deployment of an App: give the App"):
        load_app(f"{__name__}:module_level")


# -- 8. crashing and garbage-returning handlers stay contained ----------------------------------

async def test_sync_handlers_that_raise_base_exceptions_or_return_garbage_are_contained(
        app, pool, serve):
    """HOLDS: SystemExit / KeyboardInterrupt / StopIteration in a sync handler fail that attempt
    (retryable RuntimeError); a coroutine or a set returned by a plain ``def`` fails the run
    for good (the coroutine closed unrun, its error saying what happened; the set not JSON);
    the worker serves the next run."""
    import warnings

    async def never_awaited() -> int:
        return 1

    @app.deployment("raiser", retry=RetryPolicy(0, 0))
    def raiser(run, kind: str) -> None:
        raise {"exit": SystemExit(3), "interrupt": KeyboardInterrupt(),
               "stop": StopIteration()}[kind]

    @app.deployment("garbage")
    def garbage(run, kind: str) -> Any:
        return never_awaited() if kind == "coroutine" else {1, 2}

    @app.deployment("fine")
    def fine(run) -> int:
        return 42

    raised = [await raiser.enqueue(kind=k, max_attempts=1) for k in ("exit", "interrupt", "stop")]
    coroutine, a_set = [await garbage.enqueue(kind=k, max_attempts=3)
                        for k in ("coroutine", "set")]
    ok = await fine.enqueue()
    # The returned coroutine is closed by the worker, so no "was never awaited" is issued
    # wherever the garbage collector meets it. Recorded, not made errors: a warning issued by a
    # finalizer cannot raise (it went to sys.unraisablehook, and the test passed without the
    # close).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        await serve()
        for run in raised:
            row = await finished(pool, run.run_id)
            assert (row["status"], json.loads(row["error"])["type"]) == ("failed", "RuntimeError")
        for run in (coroutine, a_set):
            row = await finished(pool, run.run_id)
            assert (row["status"], row["attempts"]) == ("failed", 1)
        error = json.loads((await finished(pool, coroutine.run_id))["error"])
        assert error["type"] == "TypeError", error
        assert "without await" in error["message"], error
        assert (await finished(pool, ok.run_id))["output"] == "42"
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], caught


async def test_a_handler_returning_a_coroutine_it_started_fails_for_good_and_its_task_runs_on(
        app, pool, serve):
    """HOLDS: a handler that started a coroutine in a task and returned the coroutine, not the
    task's result, fails for good with the TypeError; the coroutine is left to its task, which
    ends as it would have (a clean-up that awaits). Closed, its clean-up raised in the worker's
    decision (a worker error, retried to the dead letter as WorkerError) and its task broke."""
    ended: list[str] = []
    tasks: list[asyncio.Task[Any]] = []

    async def work() -> int:
        try:
            await asyncio.sleep(0.05)
            return 1
        finally:
            await asyncio.sleep(0)  # a clean-up that awaits
            ended.append("clean-up done")

    @app.deployment("started")
    async def started(run) -> Any:
        coroutine = work()
        tasks.append(asyncio.ensure_future(coroutine))
        await asyncio.sleep(0)  # the task is in its first await
        return coroutine  # meant: return await tasks[-1]

    run = await started.enqueue(max_attempts=3)
    await serve()
    row = await finished(pool, run.run_id)
    error = json.loads(row["error"])
    assert (row["status"], row["attempts"], error["type"]) == ("failed", 1, "TypeError"), row
    assert "without await" in error["message"], error
    assert await tasks[0] == 1
    assert ended == ["clean-up done"]


# -- 9. orphans and pending runs of a limited deployment in one pass ----------------------------

async def test_orphans_and_pending_runs_in_one_pass_stay_under_the_deployment_limit(
        app, pool, serve):
    """HOLDS: 2 expired leases (orphans) and 3 pending runs of a ``concurrency=2`` deployment:
    the sweep re-leases into the deployment's room and the claim that follows recomputes it, so
    at most 2 of its handlers ever run at once, and every run completes."""
    release = asyncio.Event()
    state = {"live": 0, "peak": 0}

    @app.deployment("capped", concurrency=2)
    async def capped(run, n: int) -> int:
        state["live"] += 1
        state["peak"] = max(state["peak"], state["live"])
        try:
            await release.wait()
        finally:
            state["live"] -= 1
        return n

    @app.deployment("uncapped")  # an unlimited deployment (avoids the freeze of test 1)
    async def uncapped(run) -> None: ...

    orphans = [await capped.enqueue(n=i, priority=10) for i in range(2)]
    ghost = LeaseManager(pool, lease_duration_seconds=1.0)
    claimed = await ghost.claim_and_start("capped", "ghost-worker", batch_size=2)
    assert {r.run_id for r in claimed.runs} == {o.run_id for o in orphans}
    pending = [await capped.enqueue(n=i) for i in range(2, 5)]
    await wait_until(lambda: pool.fetchval(
        "SELECT count(*) = 2 FROM zeroth.runs WHERE status = 'running' "
        "AND lease_expires_at < clock_timestamp()"), "the ghost's leases to expire", within=WITHIN)
    await serve(max_concurrency=8)
    await wait_until(lambda: state["live"] == 2, "2 capped handlers to run", within=WITHIN)
    release.set()
    for run in [*orphans, *pending]:
        assert (await finished(pool, run.run_id))["status"] == "completed"
    assert state["peak"] == 2
