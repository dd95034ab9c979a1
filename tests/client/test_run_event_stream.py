"""LeaseManager's run event stream over a real pool (issue 34, item 1): append_run_event /
read_run_events / run_events_key typed and mapped, ``stream()`` following a run to its END —
across a takeover by another worker, and across a dropped connection — and ``RunContext.emit``
in a handler. The SQL transitions are tests/sql/test_run_events.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any
from uuid import UUID

import pytest

from zeroth_pg import InvalidArgumentError, LeaseManager, RunEventLimitError
from zeroth_pg.errors import ConnectionLostError
from zeroth_pg.types import RunEvent, RunEventKind

DEPLOYMENT = "stream-client"
W1, W2 = "worker-1", "worker-2"


async def running(lm: LeaseManager, worker: str = W1, **enqueue: object) -> tuple[UUID, int]:
    await lm.enqueue_run(DEPLOYMENT, {}, **enqueue)  # type: ignore[arg-type]
    (run,) = (await lm.claim_and_start(DEPLOYMENT, worker)).runs
    return run.run_id, run.lease_generation


@contextlib.asynccontextmanager
async def background(coroutine: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task[Any]]:
    """A task cancelled when the block ends (a failed test must not leave a stream holding a
    pooled connection, which would keep the pool from closing)."""
    task = asyncio.create_task(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def collect(lm: LeaseManager, run_id: UUID, after: int = 0, **kwargs: object
                  ) -> list[RunEvent]:
    return [e async for e in lm.stream(run_id, after=after, **kwargs)]  # type: ignore[arg-type]


async def test_append_and_read_are_typed(pool):
    lm = LeaseManager(pool)
    run_id, generation = await running(lm)

    assert await lm.append_run_event(run_id, W1, "token", {"t": "a"}, generation=generation) == 1
    assert await lm.append_run_event(run_id, W1, "token", None, generation=generation) == 2
    assert await lm.append_run_event(run_id, W2, "token", 1, generation=generation) is None

    events = await lm.read_run_events(run_id)
    assert [(e.event_id, e.kind, e.name, e.data, e.lease_generation) for e in events] == [
        (1, RunEventKind.EVENT, "token", {"t": "a"}, generation),
        (2, RunEventKind.EVENT, "token", None, generation)]
    key = await lm.run_events_key(run_id)
    assert len(key) == 32


async def test_bad_data_is_refused_before_it_is_encoded_whole(pool):
    lm = LeaseManager(pool)
    run_id, generation = await running(lm)

    for data in ({"big": "x" * 70_000}, {1, 2}, float("nan"), "\x00"):
        with pytest.raises(InvalidArgumentError):
            await lm.append_run_event(run_id, W1, "token", data, generation=generation)
    with pytest.raises(InvalidArgumentError):
        await lm.append_run_event(run_id, W1, "bad\nname", 1, generation=generation)

    assert await lm.read_run_events(run_id) == []


async def test_an_append_past_the_runs_bound_raises_run_event_limit_error(pool):
    lm = LeaseManager(pool)
    await pool.execute("SELECT zeroth.register_deployment(deployment_ref => $1)", DEPLOYMENT)
    await pool.execute("UPDATE zeroth.deployments SET max_run_events = 100 "
                       "WHERE deployment_ref = $1", DEPLOYMENT)
    run_id, generation = await running(lm)
    for n in range(1, 101):
        assert await lm.append_run_event(run_id, W1, "token", n, generation=generation) == n

    with pytest.raises(RunEventLimitError) as info:
        await lm.append_run_event(run_id, W1, "token", 101, generation=generation)

    assert info.value.sqlstate == "ZP014"
    assert len(await lm.read_run_events(run_id, after=99)) == 1


async def test_a_stream_yields_every_event_then_end_once(pool):
    lm = LeaseManager(pool)
    run_id, generation = await running(lm)
    await lm.append_run_event(run_id, W1, "token", 0, generation=generation)
    got: list[RunEvent] = []
    first = asyncio.Event()

    async def follow() -> None:
        async for event in lm.stream(run_id, poll_interval=30):
            got.append(event)
            first.set()

    async with background(follow()) as task:
        await first.wait()  # subscribed and caught up: what follows arrives by NOTIFY
        for i in range(1, 4):
            await lm.append_run_event(run_id, W1, "token", i, generation=generation)
        assert await lm.complete_run(run_id, W1, generation=generation)
        await asyncio.wait_for(task, 60)

    assert [(e.event_id, e.kind, e.data) for e in got[:-1]] == [
        (i + 1, RunEventKind.EVENT, i) for i in range(4)]
    assert got[-1].is_end
    assert got[-1].event_id == 5
    assert got[-1].data == {"status": "completed", "outcome": "completed"}


async def test_a_stream_resumes_after_the_id_it_is_given(pool):
    lm = LeaseManager(pool)
    run_id, generation = await running(lm)
    for i in range(5):
        await lm.append_run_event(run_id, W1, "token", i, generation=generation)
    assert await lm.fail_run(run_id, W1, generation=generation, error={"e": 1}, retryable=False)

    events = await collect(lm, run_id, after=3, batch=2)

    assert [(e.event_id, e.kind) for e in events] == [
        (4, RunEventKind.EVENT), (5, RunEventKind.EVENT), (6, RunEventKind.END)]
    # Past the END: the END again, so a reconnecting subscriber learns the run ended.
    assert [(e.event_id, e.kind) for e in await collect(lm, run_id, after=6)] == [
        (6, RunEventKind.END)]


async def test_a_stream_of_a_run_it_cannot_see_ends_not_found(pool):
    lm = LeaseManager(pool)
    run_id = (await lm.enqueue_run(DEPLOYMENT, {}, tenant_id="acme")).run_id

    (event,) = await collect(lm, run_id)

    assert event.is_end
    assert event.data == {"status": None, "outcome": "not_found"}


async def test_a_subscriber_during_a_takeover_sees_each_accepted_event_in_order_and_end_once(
        pool, connect):
    """The old holder goes on appending while another worker takes the run over: every one of
    its appends after the takeover is refused; the subscriber sees exactly the accepted events,
    in order, then END once."""
    lm = LeaseManager(pool, lease_duration_seconds=1)
    run_id, old = await running(lm)
    accepted: list[tuple[int, tuple[str, int]]] = []
    got: list[RunEvent] = []
    taken = asyncio.Event()

    async def follow() -> None:
        async for event in lm.stream(run_id, poll_interval=0.2):
            got.append(event)

    async def old_holder() -> int:
        """Appends until the takeover, then three more times: how many of those landed."""
        i, after_takeover, landed = 0, 0, 0
        while after_takeover < 3:
            if taken.is_set():
                after_takeover += 1
            i += 1
            event_id = await lm.append_run_event(run_id, W1, "old", i, generation=old)
            if event_id is not None:
                accepted.append((event_id, ("old", i)))
                landed += taken.is_set()
            await asyncio.sleep(0.02)
        return landed

    async with background(follow()) as subscriber, background(old_holder()) as holder:
        # The old lease lapses (1 s, never renewed); another worker recovers the orphan.
        new = None
        while new is None:
            await asyncio.sleep(0.1)
            if run_id in await lm.claim_orphaned(DEPLOYMENT, W2, grace_seconds=0):
                new = await lm.current_generation(run_id)
        taken.set()
        for j in range(3):
            event_id = await lm.append_run_event(run_id, W2, "new", j, generation=new)
            assert event_id is not None
            accepted.append((event_id, ("new", j)))
        assert await asyncio.wait_for(holder, 60) == 0
        assert await lm.complete_run(run_id, W2, generation=new)
        await asyncio.wait_for(subscriber, 60)

    accepted.sort()
    assert [(e.event_id, (e.name, e.data)) for e in got[:-1]] == accepted
    assert [e.event_id for e in got] == list(range(1, len(accepted) + 2))
    assert [e for e in got if e.is_end] == got[-1:]
    assert got[-1].data == {"status": "completed", "outcome": "completed"}
    # Every event of the new holder comes after every accepted event of the old one.
    generations = [e.lease_generation for e in got[:-1]]
    assert generations == sorted(generations)
    assert generations[-1] == new != old


async def test_a_stream_survives_a_dropped_connection_and_resumes_from_its_last_id(
        pool, connect):
    lm = LeaseManager(pool)
    run_id, generation = await running(lm)
    await lm.append_run_event(run_id, W1, "token", 1, generation=generation)
    admin = await connect()
    got: list[RunEvent] = []
    first = asyncio.Event()

    async def follow() -> None:
        async for event in lm.stream(run_id, poll_interval=0.2):
            got.append(event)
            first.set()

    async with background(follow()) as task:
        await first.wait()
        # Kill the subscriber's connection (the one listening on zeroth_run_events).
        killed = 0
        while not killed:
            killed = await admin.fetchval(
                """SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
                    WHERE a.query LIKE '%read_run_events%' AND a.pid <> pg_backend_pid()
                      AND a.datname = current_database()""")
        for i in range(2, 5):
            await lm.append_run_event(run_id, W1, "token", i, generation=generation)
        assert await lm.complete_run(run_id, W1, generation=generation)
        await asyncio.wait_for(task, 60)

    assert [(e.event_id, e.data) for e in got[:-1]] == [(i, i) for i in range(1, 5)]
    assert got[-1].is_end
    assert got[-1].event_id == 5


async def test_emit_in_a_handler_reaches_a_subscriber(app, serve):
    @app.deployment("emitter")
    async def emitter(run) -> dict[str, bool]:  # type: ignore[no-untyped-def]
        assert await run.emit("token", {"t": "hel"}) == 1
        assert await run.emit("token", {"t": "lo"}) == 2
        with pytest.raises(InvalidArgumentError):
            await run.emit("token", {"big": "x" * 70_000})
        return {"ok": True}

    lm = await app.lease_manager()
    run_id = (await lm.enqueue_run("emitter", {})).run_id
    await serve("emitter")
    events = [e async for e in lm.stream(run_id, poll_interval=0.2)]

    assert [(e.event_id, e.kind, e.data) for e in events] == [
        (1, RunEventKind.EVENT, {"t": "hel"}), (2, RunEventKind.EVENT, {"t": "lo"}),
        (3, RunEventKind.END, {"status": "completed", "outcome": "completed"})]


async def test_a_stream_over_a_single_connection_raises_when_it_is_lost(connect):
    conn = await connect()
    lm = LeaseManager(conn)
    run_id, _ = await running(lm)
    stream = lm.stream(run_id, poll_interval=0.1)
    await conn.close()
    with pytest.raises(ConnectionLostError):
        await stream.__anext__()
