"""A worker that claims ahead (``RunWorker(claim_ahead=N)``): it holds up to N runs more than its
handlers, claimed and started, each waiting for a handler to return, so with short handlers the
next run starts without waiting for a round trip. What must hold with it: no more than
max_concurrency handlers ever run; every run completes once, one attempt each; it claims ahead
only once its last max_concurrency handlers were short, and never while they are long; a run that
waits longer than AHEAD_WAIT is handed back with its attempt given back, and the worker claims
nothing more ahead until its handlers are short again (so a handler that ignores its cancellation
cannot make it bounce a run to its dead letter); a cancel request or a lost lease stops a waiting
run without its handler ever running (and, for the lost lease, without a write); a deadline that
comes while a run waits hands it back, not a timeout of a run that never ran; a graceful drain
runs the waiting runs instead of handing them back, however long they wait short of their
deadline; bad values are refused."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from uuid import UUID

import asyncpg
import pytest
import test_worker_lifecycle
from helpers import unique_deployment, wait_until
from prometheus_client import REGISTRY
from test_worker_claim_along import _drained, _statuses

from zeroth_pg.client import LeaseManager
from zeroth_pg.worker import RunContext, RunWorker
from zeroth_pg.worker._ahead import AHEAD_EVIDENCE
from zeroth_pg.worker._run import RunState

spawn_worker = test_worker_lifecycle.spawn_worker  # the fixture: workers drained at teardown


@pytest.fixture
def waits_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run claimed ahead waits for its slot as long as the test needs (no NO_SLOT)."""
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 60.0)


async def _row(pool: asyncpg.Pool, run_id: UUID) -> asyncpg.Record:
    return await pool.fetchrow(
        """SELECT status::text AS status, attempts, hand_backs, lease_generation,
                  lease_worker_id FROM zeroth.runs WHERE run_id = $1""", run_id)


class _FirstBlocks:
    """A handler whose run with ``{"block": true}`` blocks until ``release`` is set (ignoring
    its cancellation when ``stubborn``); the others return at once. Records every run it was
    called for."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.release = asyncio.Event()
        self.stubborn = stubborn
        self.blocking: UUID | None = None
        self.cancelled = 0
        self.called: list[UUID] = []

    async def __call__(self, ctx: RunContext) -> dict[str, Any]:
        self.called.append(ctx.run_id)
        if ctx.payload.get("block"):
            self.blocking = ctx.run_id
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    if not self.stubborn:
                        raise
        return {"ok": True}


def _before_their_handlers_return(worker: RunWorker) -> int:
    """The runs a worker holds that have not finished their handlers (runs whose handler
    returned wait for their completion without a slot: up to max_concurrency more, always)."""
    return sum(entry.state in (RunState.QUEUED, RunState.WAITING, RunState.EXECUTING)
               for entry in worker._active.values())


def _waiting(worker: RunWorker) -> list[UUID]:
    return [run_id for (run_id, _), entry in worker._active.items()
            if entry.state is RunState.WAITING]


async def _warm_then_block(pool: asyncpg.Pool, dep: str,
                           attempt_timeout_seconds: int | None = None,
                           max_attempts: int | None = None) -> UUID:
    """Runs in claim order: AHEAD_EVIDENCE short ones (the evidence a worker needs before it
    claims ahead), one that blocks in its handler, and the one that will wait for the slot
    (returned; with that attempt timeout and max_attempts)."""
    lm = LeaseManager(pool)
    await lm.enqueue_runs(dep, [{"payload": {"n": 0}, "priority": 2}] * AHEAD_EVIDENCE
                          + [{"payload": {"block": True}, "priority": 1}])
    waiting = await lm.enqueue_run(dep, {"n": 1}, priority=0, max_attempts=max_attempts,
                                   attempt_timeout_seconds=attempt_timeout_seconds)
    return waiting.run_id


async def _two_runs_one_waiting(pool: asyncpg.Pool, spawn_worker: Any, handler: _FirstBlocks,
                                attempt_timeout_seconds: int | None = None,
                                max_attempts: int | None = None,
                                **options: Any) -> tuple[RunWorker, str, UUID]:
    """A worker of one handler slot that claims one ahead, once a short run proved its handlers
    short: one run blocks in its handler, the next waits for the slot. Returns the worker, the
    deployment and the waiting run."""
    dep = unique_deployment("ahead")
    waiting = await _warm_then_block(pool, dep, attempt_timeout_seconds, max_attempts)
    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1, **options)
    await wait_until(lambda: handler.blocking is not None and _waiting(worker) == [waiting],
                     "one run in its handler and the next waiting for the slot", within=10)
    row = await _row(pool, waiting)
    # Claimed and started by the claim (claim_and_start): running, its attempt counted.
    assert (row["status"], row["attempts"], row["lease_worker_id"]) == (
        "running", 1, worker.worker_id)
    return worker, dep, waiting


async def test_claiming_ahead_never_runs_more_handlers_than_max_concurrency(pool, spawn_worker):
    dep = unique_deployment("ahead")
    seen = {"now": 0, "max": 0, "runs": 0, "held": 0}
    holder: list[RunWorker] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        seen["now"] += 1
        seen["runs"] += 1
        seen["max"] = max(seen["max"], seen["now"])
        seen["held"] = max(seen["held"], _before_their_handlers_return(holder[0]))
        try:
            await asyncio.sleep(0.002)
            return {"n": ctx.payload["n"]}
        finally:
            seen["now"] -= 1

    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(150)])
    worker = await spawn_worker(dep, handler, max_concurrency=3, claim_ahead=3, start=False)
    holder.append(worker)
    await worker.start()

    await wait_until(lambda: _drained(pool, dep, 150), "the backlog to drain", within=30)

    assert seen["max"] <= 3
    assert seen["runs"] == 150
    # It did claim ahead: more runs were held before their handlers returned than it has
    # handler slots.
    assert seen["held"] > 3
    rows = await pool.fetch(
        "SELECT attempts, hand_backs FROM zeroth.runs WHERE deployment_ref = $1", dep)
    assert {(row["attempts"], row["hand_backs"]) for row in rows} == {(1, 0)}


async def test_a_run_that_finds_no_slot_in_time_is_handed_back_with_its_attempt(
        pool, spawn_worker, monkeypatch):
    # Shorter than the default second, long enough for a loaded machine to see the run wait.
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 2.0)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler)

    async def handed_back() -> bool:
        row = await _row(pool, waiting)
        return (row["status"], row["hand_backs"]) == ("pending", 1)

    await wait_until(handed_back, "the waiting run to be handed back", within=10)
    assert REGISTRY.get_sample_value("zeroth_runs_not_started_ahead_total",
                                     {"deployment": dep}) == 1
    # Its wait is observed when it ends, past the one-second bucket (the wait was 2 s here).
    waited = {bound: REGISTRY.get_sample_value("zeroth_run_slot_wait_seconds_bucket",
                                               {"deployment": dep, "le": bound})
              for bound in ("1.0", "+Inf")}
    assert waited["+Inf"] - waited["1.0"] == 1
    row = await _row(pool, waiting)
    assert row["attempts"] == 0  # the attempt its claim counted is given back
    assert row["lease_worker_id"] is None
    assert waiting not in handler.called
    # The worker claims nothing more ahead until its handlers are short again: the run stays
    # in the queue, not bounced.
    assert worker._runs.ahead() == 0
    await asyncio.sleep(0.5)
    assert (await _row(pool, waiting))["status"] == "pending"

    handler.release.set()
    await wait_until(lambda: _drained(pool, dep, AHEAD_EVIDENCE + 2), "every run to complete",
                     within=10)
    assert handler.called.count(waiting) == 1
    assert (await _row(pool, waiting))["attempts"] == 1


async def test_a_run_on_its_last_attempt_waits_for_a_slot_rather_than_risk_its_dead_letter(
        pool, spawn_worker, monkeypatch):
    # max_attempts 1: its first claim is its last attempt. Once its hand-backs are spent (other
    # workers of a fleet may have spent them), a hand-back there would dead-letter a run whose
    # handler never ran; so it waits past AHEAD_WAIT instead.
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 0.5)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       max_attempts=1)
    await wait_until(lambda: worker._runs.ahead() == 0, "the blocking handler to turn long",
                     within=10)
    await asyncio.sleep(0.6)  # past the wait's bound
    assert _waiting(worker) == [waiting]
    row = await _row(pool, waiting)
    assert (row["status"], row["attempts"], row["hand_backs"]) == ("running", 1, 0)
    assert REGISTRY.get_sample_value("zeroth_runs_not_started_ahead_total",
                                     {"deployment": dep}) in (None, 0)

    handler.release.set()
    await wait_until(lambda: _run_completed(pool, waiting), "the waiting run to complete",
                     within=10)
    assert handler.called.count(waiting) == 1
    row = await _row(pool, waiting)
    assert (row["attempts"], row["hand_backs"]) == (1, 0)


async def test_a_waiting_run_whose_attempt_deadline_comes_is_handed_back_not_timed_out(
        pool, spawn_worker, monkeypatch, caplog):
    # The wait's own bound out of the way: the attempt's deadline (3 s) comes first, as an
    # attempt timeout of one second does with the real one-second wait. The waiting run is
    # handed back a second before it (UNSTARTED_MARGIN), not at the handler's 5% (0.15 s here:
    # less than a loaded CI machine once took to write the hand-back, which the fence then
    # refused, and the sweep timed out an attempt whose handler never ran).
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 30.0)
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       attempt_timeout_seconds=3)
    seen: dict[str, Any] = {}

    async def handed_back() -> bool:
        seen.update(await _row(pool, waiting))
        return (seen["status"], seen["hand_backs"]) == ("pending", 1)

    try:
        await wait_until(handed_back, "the waiting run to be handed back", within=10)
    except AssertionError as missed:  # say what it became instead
        attempts = await pool.fetch("SELECT attempt, outcome FROM zeroth.run_attempts"
                                    " WHERE run_id = $1", waiting)
        raise AssertionError(f"{missed}; its row: {seen}, attempts: {attempts}") from None
    assert any(f"run {waiting}: claimed ahead, its deadline is near and no handler slot came; "
               "handing it back" == record.getMessage() for record in caplog.records)
    # It never ran: its attempt is given back and no attempt of it timed out.
    row = await _row(pool, waiting)
    assert (row["attempts"], row["lease_worker_id"]) == (0, None)
    assert waiting not in handler.called
    assert await pool.fetchval(
        "SELECT count(*) FROM zeroth.run_attempts WHERE run_id = $1 AND outcome = 'timed_out'",
        waiting) == 0
    assert REGISTRY.get_sample_value("zeroth_runs_not_started_ahead_total",
                                     {"deployment": dep}) == 1
    assert worker._runs.ahead() == 0

    handler.release.set()
    await wait_until(lambda: _drained(pool, dep, AHEAD_EVIDENCE + 2), "every run to complete",
                     within=10)
    assert handler.called.count(waiting) == 1
    assert (await _row(pool, waiting))["attempts"] == 1


async def test_a_cancel_request_stops_a_waiting_run_before_its_handler_runs(
        pool, spawn_worker, waits_for_ever):
    handler = _FirstBlocks()
    _, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                  lease_duration=1.5)

    await LeaseManager(pool).request_cancel(waiting)

    async def cancelled() -> bool:
        return (await _row(pool, waiting))["status"] == "cancelled"

    await wait_until(cancelled, "the waiting run to be cancelled", within=10)
    assert waiting not in handler.called
    handler.release.set()
    await wait_until(
        lambda: _statuses_are(pool, dep, {"completed": AHEAD_EVIDENCE + 1, "cancelled": 1}),
        "the first run to complete", within=10)
    assert waiting not in handler.called


async def _statuses_are(pool: asyncpg.Pool, dep: str, expected: dict[str, int]) -> bool:
    return await _statuses(pool, dep) == expected


async def test_a_waiting_run_whose_lease_was_taken_writes_nothing_and_never_runs(
        pool, spawn_worker, waits_for_ever):
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       lease_duration=1.5)
    # A DBA's manual UPDATE takes the lease from the worker: a newer generation, someone else's.
    await pool.execute(
        """UPDATE zeroth.runs SET lease_generation = lease_generation + 1,
                  lease_worker_id = 'dba', lease_expires_at = now() + interval '1 hour'
            WHERE run_id = $1""", waiting)
    taken = await _row(pool, waiting)

    await wait_until(lambda: waiting not in worker.active_run_ids,
                     "the worker to let the waiting run go", within=10)
    assert waiting not in handler.called
    assert await _row(pool, waiting) == taken  # nothing written by the worker
    handler.release.set()
    await wait_until(lambda: _statuses_are(pool, dep, {"completed": AHEAD_EVIDENCE + 1,
                                                       "running": 1}),
                     "the first run to complete", within=10)
    assert waiting not in handler.called


async def test_a_waiting_run_whose_slot_comes_after_its_lease_ran_out_is_not_started(
        pool, spawn_worker, caplog, waits_for_ever):
    # A handler that blocks the event loop past the lease while a run waits for its slot: when
    # it returns, the slot's wakeup runs before the renewals and timers that came due, and the
    # waiting run's handler started on a lease the worker could no longer vouch for (another
    # worker may hold the run by then). It is not started (fail-stop, as a claim answered too
    # late is not); the lease runs out and the sweep recovers the run, which then runs once.
    caplog.set_level(logging.WARNING, logger="zeroth_pg.worker")
    dep = unique_deployment("ahead")
    waiting = await _warm_then_block(pool, dep)
    started: list[tuple[UUID, int]] = []
    holder: list[RunWorker] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        started.append((ctx.run_id, ctx.lease_generation))
        if ctx.payload.get("block"):
            await wait_until(lambda: _waiting(holder[0]) == [waiting],
                             "the next run to wait for the slot", within=10)
            time.sleep(2.5)  # noqa: ASYNC251 (the stall is the point: past the 1.5 s lease)
        return {"ok": True}

    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1,
                                lease_duration=1.5, orphan_sweep_interval=1.0, start=False)
    holder.append(worker)
    await worker.start()
    await wait_until(lambda: _waiting(worker) == [waiting], "the run to wait", within=10)
    [generation] = [g for (run_id, g) in worker._active if run_id == waiting]
    await wait_until(lambda: _run_completed(pool, waiting), "the run to complete", within=30)
    assert (waiting, generation) not in started
    assert [g for run_id, g in started if run_id == waiting] == [generation + 1]
    assert any(f"run {waiting}: its handler would start after the lease it knows of ran out"
               in record.getMessage() for record in caplog.records)


async def test_a_waiting_run_whose_hand_backs_are_spent_is_said_and_counted_dead_lettered(
        pool, spawn_worker, monkeypatch, caplog):
    # Another worker of the fleet handed the run back once: on max_attempts 1 its hand-backs
    # are spent, and the hand-back of a waiting run whose deadline is near dead-letters it. The
    # worker said "handed back to pending: True" and counted no dead letter.
    caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 30.0)
    dep = unique_deployment("ahead")
    lm = LeaseManager(pool)
    spent = (await lm.enqueue_run(dep, {"n": 1}, priority=0, max_attempts=1,
                                  attempt_timeout_seconds=3)).run_id
    [other] = (await lm.claim_and_start(dep, "another-worker")).runs
    assert await lm.hand_back_to_pending(spent, "another-worker",
                                         generation=other.lease_generation)
    await lm.enqueue_runs(dep, [{"payload": {"n": 0}, "priority": 2}] * AHEAD_EVIDENCE
                          + [{"payload": {"block": True}, "priority": 1}])
    handler = _FirstBlocks()
    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1)
    await wait_until(lambda: _waiting(worker) == [spent], "the spent run to wait", within=10)

    async def dead_lettered() -> bool:
        return bool(await pool.fetchval(
            "SELECT dead_lettered_at IS NOT NULL FROM zeroth.runs WHERE run_id = $1", spent))

    await wait_until(dead_lettered, "the hand-back to dead-letter it", within=10)
    await wait_until(lambda: spent not in worker.active_run_ids, "the worker to let it go",
                     within=10)
    assert spent not in handler.called
    assert REGISTRY.get_sample_value("zeroth_runs_dead_lettered_total",
                                     {"deployment": dep}) == 1
    assert REGISTRY.get_sample_value("zeroth_runs_failed_total",
                                     {"deployment": dep, "outcome": "dead_lettered"}) == 1
    lines = [record.getMessage() for record in caplog.records]
    assert f"run {spent} dead-lettered by its hand-back: its hand-backs are spent" in lines
    assert f"run {spent} handed back to pending: True" not in lines
    handler.release.set()


async def test_a_graceful_shutdown_runs_the_waiting_runs_instead_of_handing_them_back(
        pool, spawn_worker):
    handler = _FirstBlocks()
    worker, dep, waiting = await _two_runs_one_waiting(pool, spawn_worker, handler,
                                                       shutdown_timeout=10.0)

    shutdown = asyncio.create_task(worker.graceful_shutdown())
    # Longer than AHEAD_WAIT: during a drain the waiting run waits for the handler.
    await asyncio.sleep(1.5)
    assert waiting in worker.active_run_ids
    handler.release.set()
    await asyncio.wait_for(shutdown, timeout=20)

    assert await _statuses(pool, dep) == {"completed": AHEAD_EVIDENCE + 2}
    assert handler.called.count(waiting) == 1
    assert (await _row(pool, waiting))["hand_backs"] == 0


async def test_a_worker_whose_handlers_are_long_never_claims_ahead(pool, spawn_worker):
    dep = unique_deployment("ahead")
    held = {"max": 0}
    holder: list[RunWorker] = []

    async def long_handler(ctx: RunContext) -> None:
        held["max"] = max(held["max"], _before_their_handlers_return(holder[0]))
        await asyncio.sleep(0.3)  # longer than AHEAD_HANDLER_LIMIT

    await LeaseManager(pool).enqueue_runs(dep, [{"payload": {"n": n}} for n in range(8)])
    worker = await spawn_worker(dep, long_handler, max_concurrency=2, claim_ahead=2,
                                start=False)
    holder.append(worker)
    await worker.start()
    await wait_until(lambda: _drained(pool, dep, 8), "the runs to complete", within=30)

    assert held["max"] <= 2
    assert worker._runs.ahead() == 0
    hand_backs = {row["hand_backs"] for row in await pool.fetch(
        "SELECT hand_backs FROM zeroth.runs WHERE deployment_ref = $1", dep)}
    assert hand_backs == {0}


async def test_completions_carry_no_claims_into_slots_that_waiting_runs_took(
        pool, spawn_worker, monkeypatch):
    # Runs held beyond the handlers when the handlers turned long must not be replaced as they
    # start: a completion's claim along would keep the worker claiming ahead without evidence.
    monkeypatch.setattr("zeroth_pg.worker._execute.AHEAD_WAIT", 30.0)
    dep = unique_deployment("ahead")
    lm = LeaseManager(pool)
    await lm.enqueue_runs(dep, [{"payload": {"n": 0}, "priority": 3}] * AHEAD_EVIDENCE
                          + [{"payload": {"hold": "a"}, "priority": 2},
                             {"payload": {"hold": "w"}, "priority": 1}])
    after = [(await lm.enqueue_run(dep, {"n": 1}, priority=0)).run_id for _ in range(2)]
    release = {"a": asyncio.Event(), "w": asyncio.Event()}
    running: list[str] = []

    async def handler(ctx: RunContext) -> dict[str, Any]:
        hold = ctx.payload.get("hold")
        if hold is not None:
            running.append(hold)
            await release[hold].wait()
        return {"ok": True}

    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1)
    await wait_until(lambda: running == ["a"] and len(_waiting(worker)) == 1,
                     "run a in its handler and run w waiting for the slot", within=10)
    await asyncio.sleep(0.4)  # a has run longer than AHEAD_HANDLER_LIMIT: no more claiming ahead
    assert worker._runs.ahead() == 0
    release["a"].set()
    await wait_until(lambda: running == ["a", "w"], "run w to take the slot a freed", within=10)
    await asyncio.sleep(0.3)
    # a's completion claimed nothing along: the slot it freed went to w, and nothing waits.
    assert _waiting(worker) == []
    assert {(await _row(pool, run_id))["status"] for run_id in after} == {"pending"}
    release["w"].set()
    await wait_until(lambda: _drained(pool, dep, AHEAD_EVIDENCE + 4), "every run to complete",
                     within=10)
    rows = await pool.fetch(
        "SELECT attempts, hand_backs FROM zeroth.runs WHERE deployment_ref = $1", dep)
    assert {(row["attempts"], row["hand_backs"]) for row in rows} == {(1, 0)}


async def test_a_handler_that_ignores_its_cancellation_cannot_bounce_runs_to_their_dead_letter(
        pool, spawn_worker):
    handler = _FirstBlocks(stubborn=True)
    dep = unique_deployment("ahead")
    waiting = await _warm_then_block(pool, dep)
    lm = LeaseManager(pool)
    worker = await spawn_worker(dep, handler, max_concurrency=1, claim_ahead=1,
                                lease_duration=1.5)
    await wait_until(lambda: handler.blocking is not None, "the blocking handler", within=10)
    # The blocking run is cancelled; its handler swallows the cancellation and keeps the slot.
    blocking = handler.blocking
    await lm.request_cancel(blocking)
    await wait_until(lambda: handler.cancelled >= 1, "the handler's cancellation", within=10)
    # Its lease is gone for the worker once its last deadline passes; the slot is still taken.
    await wait_until(lambda: not worker._runs.held() or blocking not in
                     [e.run.run_id for e in worker._runs.held()],
                     "the stuck run to stop counting as held", within=10)
    await asyncio.sleep(3.0)  # AHEAD_WAIT three times over

    row = await _row(pool, waiting)
    assert row["hand_backs"] <= 1  # handed back at most once, never bounced on
    assert row["status"] in ("pending", "running")
    assert waiting not in handler.called

    handler.release.set()
    await wait_until(lambda: _run_completed(pool, waiting), "the waiting run to complete",
                     within=10)
    assert handler.called.count(waiting) == 1


async def _run_completed(pool: asyncpg.Pool, run_id: UUID) -> bool:
    return (await _row(pool, run_id))["status"] == "completed"


@pytest.mark.parametrize("options", [
    {"claim_ahead": -1}, {"claim_ahead": 9}, {"claim_ahead": True}, {"claim_ahead": 1.5},
    {"claim_ahead": 2, "fleet_max_concurrency": 4},
    {"claim_ahead": 600, "max_concurrency": 600},  # one claim may ask for 1,000 runs at most
])
async def test_claim_ahead_refuses_what_it_cannot_honour(pool, options):
    with pytest.raises(ValueError, match="claim_ahead"):
        RunWorker(pool, unique_deployment("ahead"), lambda ctx: None,
                  **{"max_concurrency": 8, **options})
