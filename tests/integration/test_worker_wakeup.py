"""RunWorker wakeups over real LISTEN/NOTIFY, in the test's event loop.

Every worker here polls only every 60 s (poll_interval and orphan_sweep_interval), so a run that
starts before that was started by a NOTIFY (or by the poll a reconnect triggers), never by the
fallback poll: each wait's bound (WITHIN) is well under the poll interval, and is a failure bound
only. The measured latencies are printed (pytest -s); how fast a wakeup is ("within 1 s") is a
speed goal, measured by bench (the latency scenario), not asserted here: on a loaded machine a
timed assertion fails however right the mechanism is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import unique_deployment, wait_until

from zeroth_pg.client import LeaseManager
from zeroth_pg.notify import enqueue_wakeup
from zeroth_pg.worker import RunContext, RunWorker

IDLE = 60.0  # poll and sweep interval: the fallback never fires within a test
WITHIN = 20.0  # how long a wait may take before it fails: well before the fallback poll





class ClaimSpy:
    """Counts the worker's claim_and_start calls (wraps the real LeaseManager method)."""

    def __init__(self, worker: RunWorker) -> None:
        self.calls = 0
        self.in_flight = 0
        self.real = worker.lease_manager.claim_and_start
        worker.lease_manager.claim_and_start = self._claim  # type: ignore[method-assign]

    async def _claim(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.in_flight += 1
        try:
            return await self.real(*args, **kwargs)
        finally:
            self.in_flight -= 1


class WakeupSpy:
    """Records every wakeup the worker accepts from its notifier (wraps handle_wakeup)."""

    def __init__(self, worker: RunWorker, claims: ClaimSpy | None = None) -> None:
        self.calls = 0
        self.claims_seen: list[int] = []  # claim calls made before each wakeup arrived
        self.event = asyncio.Event()
        real = worker.handle_wakeup

        def spy(run_id: object = None) -> None:
            self.calls += 1
            if claims is not None:
                self.claims_seen.append(claims.calls)
            self.event.set()
            real(run_id)

        worker.handle_wakeup = spy  # type: ignore[method-assign]


async def _wait_idle(worker: RunWorker, spy: ClaimSpy) -> None:
    """Listening, and the claim loop asleep: no claim in flight and none started for 0.3 s."""
    assert worker.notifier is not None
    await asyncio.wait_for(worker.notifier.connected.wait(), timeout=10)
    await wait_until(lambda: spy.calls >= 1 and spy.in_flight == 0, "a first claim pass",
                      within=10)
    while True:
        calls = spy.calls
        await asyncio.sleep(0.3)
        if spy.calls == calls and spy.in_flight == 0:
            return


@pytest.fixture
async def spawn_worker(pool: asyncpg.Pool,
                       database_dsn: str) -> AsyncIterator[Callable[..., Awaitable[RunWorker]]]:
    workers: list[RunWorker] = []

    async def spawn(deployment: str, handler: Callable[[RunContext], Awaitable[Any]],
                    **kwargs: Any) -> RunWorker:
        kwargs.setdefault("dsn", database_dsn)
        kwargs.setdefault("poll_interval", IDLE)
        kwargs.setdefault("orphan_sweep_interval", IDLE)
        kwargs.setdefault("lease_duration", 30.0)
        kwargs.setdefault("shutdown_timeout", 2.0)
        worker = RunWorker(pool, deployment, handler, **kwargs)
        workers.append(worker)
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            await asyncio.wait_for(worker.graceful_shutdown(), timeout=30)


class Recorder:
    """A handler that notes when each run started and completes it at once."""

    def __init__(self) -> None:
        self.started: dict[UUID, float] = {}
        self.changed = asyncio.Event()

    async def __call__(self, ctx: RunContext) -> dict[str, Any]:
        self.started[ctx.run_id] = time.monotonic()
        self.changed.set()
        return {"ok": True}

    async def wait_started(self, run_id: UUID, within: float) -> float:
        await wait_until(lambda: run_id in self.started, f"run {run_id} to start",
                          within=within, interval=0.005)
        return self.started[run_id]


async def test_idle_worker_starts_a_fresh_run_on_its_notify_not_its_poll(spawn_worker, connect):
    dep = unique_deployment("wake")
    handler = Recorder()
    worker = await spawn_worker(dep, handler)
    spy = ClaimSpy(worker)
    await worker.start()
    await _wait_idle(worker, spy)

    producer = await connect()
    enqueued_at = time.monotonic()
    run = await LeaseManager(producer).enqueue_run(dep, {"n": 1})
    started_at = await handler.wait_started(run.run_id, within=WITHIN)
    latency = started_at - enqueued_at
    print(f"\nwakeup: enqueue -> handler started in {latency * 1000:.1f} ms "
          f"(poll interval {IDLE:g} s)")

    await wait_until(lambda: producer.fetchval(
        "SELECT r.status = 'completed' FROM zeroth.runs r WHERE r.run_id = $1", run.run_id),
        "the run to complete", within=WITHIN)


async def test_a_wakeup_during_a_claim_pass_is_not_lost(spawn_worker, connect):
    """A NOTIFY that lands after the claim's snapshot but before the loop sleeps must still cut
    the sleep short (otherwise the run waits for the 60 s poll)."""
    dep = unique_deployment("wake")
    handler = Recorder()
    worker = await spawn_worker(dep, handler)
    claims = ClaimSpy(worker)
    wakeups = WakeupSpy(worker)
    await worker.start()
    await _wait_idle(worker, claims)

    producer = await connect()
    # Its own connection: under load a poll may start the pass while the producer still sends
    # the wakeup below (seen in a full-suite run: "another operation is in progress").
    late_producer = await connect()
    late: list[UUID] = []

    async def claim_then_enqueue(*args: Any, **kwargs: Any) -> Any:
        result = await claims.real(*args, **kwargs)
        if not late:  # once: the claim above has run, so it cannot have seen this run
            wakeups.event.clear()
            late.append((await LeaseManager(late_producer).enqueue_run(dep)).run_id)
            await asyncio.wait_for(wakeups.event.wait(), timeout=WITHIN)  # delivered mid-pass
        return result

    worker.lease_manager.claim_and_start = claim_then_enqueue  # type: ignore[method-assign]
    # A wakeup with nothing to claim starts the pass.
    await enqueue_wakeup(producer, deployment_ref=dep)
    await wait_until(lambda: late, "the pass to enqueue its run", within=WITHIN)
    noticed = time.monotonic()
    started_at = await handler.wait_started(late[0], within=WITHIN)  # not the 60 s poll
    print(f"\nwakeup during a claim pass: run started {(started_at - noticed) * 1000:.1f} ms "
          "after its NOTIFY was delivered")


async def test_missed_notifications_are_covered_by_the_poll_after_reconnect(
        spawn_worker, connect):
    dep = unique_deployment("wake")
    handler = Recorder()
    worker = await spawn_worker(dep, handler, max_concurrency=50)
    spy = ClaimSpy(worker)
    await worker.start()
    notifier = worker.notifier
    assert notifier is not None
    await _wait_idle(worker, spy)
    assert notifier.connects == 1

    # Hold the reconnect until the test lets it through, so the 200 NOTIFYs are surely missed.
    gate = asyncio.Event()
    real_connect = notifier._connect

    async def gated_connect(dsn: str) -> asyncpg.Connection:
        await gate.wait()
        return await real_connect(dsn)

    notifier._connect = gated_connect

    admin = await connect()
    pid = notifier.backend_pid
    assert pid is not None
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    await wait_until(lambda: not notifier.connected.is_set(), "the listener to notice",
                      within=WITHIN)

    runs = await LeaseManager(admin).enqueue_runs(dep, [{"payload": {"i": i}} for i in range(200)])
    ids = [run.run_id for run in runs]
    assert len(set(ids)) == 200
    await asyncio.sleep(0.3)  # a negative check: nobody is listening and the poll is 60 s away
    assert not handler.started
    assert await admin.fetchval(
        """SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = $1
               AND r.status = 'pending' AND r.lease_worker_id IS NULL""", dep) == 200

    reconnect_at = time.monotonic()
    gate.set()
    await wait_until(lambda: notifier.connects == 2, "the reconnect", within=WITHIN)
    # Every run started before the 60 s poll: by the poll the reconnect made.
    await wait_until(lambda: len(handler.started) == 200, "all 200 runs to start",
                      within=WITHIN, interval=0.02)
    first = min(handler.started.values()) - reconnect_at
    last = max(handler.started.values()) - reconnect_at
    print(f"\nmissed notifications: 200 runs started {first * 1000:.0f}-{last * 1000:.0f} ms "
          f"after the listener was let back in ({spy.calls} claim calls in all)")
    assert notifier.connects == 2
    assert notifier.backend_pid not in (None, pid)
    await wait_until(lambda: admin.fetchval(
        """SELECT count(*) = 200 FROM zeroth.runs r
            WHERE r.deployment_ref = $1 AND r.status = 'completed'
              AND r.started_at IS NOT NULL""", dep), "all 200 runs to complete", within=WITHIN)


async def test_wakeups_for_other_deployments_or_scopes_do_not_wake_the_worker(
        spawn_worker, connect):
    dep, other = unique_deployment("wake"), unique_deployment("wake")
    handler = Recorder()
    worker = await spawn_worker(dep, handler)
    claims = ClaimSpy(worker)
    wakeups = WakeupSpy(worker, claims)
    await worker.start()
    await _wait_idle(worker, claims)

    producer = await connect()
    lm = LeaseManager(producer)
    claims_before, wakeups_before = claims.calls, wakeups.calls
    foreign = [
        (await lm.enqueue_run(other)).run_id,  # another deployment
        (await lm.enqueue_run(dep, tenant_id="tenant-b")).run_id,  # same deployment, other tenant
        (await lm.enqueue_run(dep, tenant_id="default", workspace_id="ws-b")).run_id,  # workspace
    ]
    seen_before = len(wakeups.claims_seen)
    wakeups.event.clear()
    mine = (await lm.enqueue_run(dep)).run_id
    # NOTIFYs reach a listener in commit order: by the time mine wakes the worker, the three
    # foreign ones have been delivered (and must have been ignored).
    await asyncio.wait_for(wakeups.event.wait(), timeout=WITHIN)
    await handler.wait_started(mine, within=WITHIN)

    assert wakeups.calls - wakeups_before == 1
    # No claim pass ran between the foreign NOTIFYs and mine.
    assert wakeups.claims_seen[seen_before:] == [claims_before]
    assert set(handler.started) == {mine}
    rows = await producer.fetch(
        """SELECT r.run_id, r.status::text AS status, r.lease_worker_id, r.lease_generation
             FROM zeroth.runs r WHERE r.run_id = ANY($1::uuid[])""", foreign)
    assert len(rows) == 3
    for row in rows:
        assert (row["status"], row["lease_worker_id"], row["lease_generation"]) == (
            "pending", None, 0), dict(row)
