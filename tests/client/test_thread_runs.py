"""ThreadRuns (zeroth_pg.threads): every method against a real database, in real time.

Where a test needs an owner to die, its lease is not made short (on a loaded machine a lease of
a fraction of a second lapsed between admit and start now and then): the lease is long, and the
calls that must find it run out are made on a connection whose clock stands past it (the
database's test clock, zeroth._now(): ``clock_at``). Tests that wait for a state poll for it and
never assert durations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from zeroth_pg import CancelOutcome, InvalidArgumentError, RunStatus
from zeroth_pg.testing import TEST_CLOCK_SETTING
from zeroth_pg.threads import (
    HTTP_STATUS,
    Admission,
    AdmitOutcome,
    Strategy,
    TakeoverOutcome,
    ThreadRuns,
    TokenUsage,
    http_response,
)

DEPLOYMENT = "threads"
OWNER = "owner-a"
OTHER = "owner-b"


async def poll(probe: Callable[[], Awaitable[Any]], what: str, within: float = 10.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@pytest.fixture
def database_dsn(clock_database_dsn: str) -> str:
    """The module's database has the test clock (unset: the real clock)."""
    return clock_database_dsn


async def lease_expiry(pool: asyncpg.Pool, admission: Admission) -> datetime:
    expires: datetime = await pool.fetchval(
        "SELECT lease_expires_at FROM zeroth.runs WHERE run_id = $1::uuid",
        str(admission.run_id))
    return expires


async def clock_at(connect: Callable[[], Awaitable[asyncpg.Connection]],
                   moment: datetime) -> asyncpg.Connection:
    """A connection on which the database's clock reads ``moment``."""
    conn = await connect()
    await conn.execute("SELECT set_config($1, $2, false)", TEST_CLOCK_SETTING,
                       moment.isoformat())
    return conn


async def owned_running(threads: ThreadRuns, thread: str = "t-1",
                        worker_id: str = OWNER) -> Admission:
    admitted = await threads.admit(DEPLOYMENT, thread, {"q": 1}, worker_id=worker_id)
    assert admitted.owned
    assert await threads.start_run(admitted.run_id, worker_id,
                                   generation=admitted.lease_generation)
    return admitted


class TestAdmit:
    async def test_queue_mode_admission(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)

        admitted = await threads.admit(DEPLOYMENT, "t-1", {"q": 1}, metadata={"m": 1})

        assert (admitted.outcome, admitted.status, admitted.owned) == (
            AdmitOutcome.ADMITTED, RunStatus.PENDING, False)
        assert admitted.displaced == ()
        claimed = await threads.claim_pending(DEPLOYMENT, "worker")
        assert claimed == admitted.run_id

    async def test_admit_and_own_held_back_by_the_scopes_rate_key_is_not_owned(
            self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        await pool.execute("SELECT zeroth.set_rate_limit(name => 'client-admit', "
                           "max_starts => 1, period_seconds => 3600)")
        await pool.execute("INSERT INTO zeroth.scope_limits (tenant_id, deployment_ref, "
                           "rate_limit) VALUES ('rated', $1, 'client-admit')", DEPLOYMENT)

        first = await threads.admit(DEPLOYMENT, "t-1", worker_id=OWNER, tenant_id="rated")
        second = await threads.admit(DEPLOYMENT, "t-2", worker_id=OWNER, tenant_id="rated")

        assert first.owned
        assert not second.owned
        assert (second.outcome, second.status, second.lease_generation) == (
            AdmitOutcome.ADMITTED, RunStatus.PENDING, None)
        assert second.retry_after_s is not None
        assert second.retry_after_s > 0
        assert http_response(second) == (202, {"Retry-After": str(second.retry_after_s)})

    async def test_admit_and_own_then_busy_with_retry_after(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool, lease_duration_seconds=30, grace_seconds=10)
        first = await owned_running(threads)

        busy = await threads.admit(DEPLOYMENT, "t-1", worker_id=OTHER)

        assert busy.outcome is AdmitOutcome.BUSY
        assert busy.run_id is None
        assert busy.active_run_id == first.run_id
        assert busy.retry_after_s is not None
        assert 30 <= busy.retry_after_s <= 40
        assert http_response(busy) == (409, {"Retry-After": str(busy.retry_after_s)})

    async def test_interrupt_of_a_live_other_owner_queues_and_lists_the_displaced_run(
            self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        first = await owned_running(threads, worker_id=OTHER)

        queued = await threads.admit(DEPLOYMENT, "t-1", strategy=Strategy.ROLLBACK,
                                     worker_id=OWNER)

        assert (queued.outcome, queued.status, queued.owned) == (
            AdmitOutcome.QUEUED, RunStatus.WAITING, False)
        assert queued.active_run_id == first.run_id
        [displaced] = queued.displaced
        assert (displaced.run_id, displaced.outcome, displaced.worker_id,
                displaced.lease_generation) == (
            first.run_id, CancelOutcome.CANCEL_REQUESTED, OTHER, 1)
        assert http_response(queued)[0] == 202

    async def test_idempotent_reuse(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        first = await threads.admit(DEPLOYMENT, "t-1", idempotency_key="k", worker_id=OWNER)

        again = await threads.admit(DEPLOYMENT, "t-1", idempotency_key="k",
                                    strategy="interrupt", worker_id=OWNER)

        assert (again.outcome, again.run_id, again.lease_generation) == (
            AdmitOutcome.REUSED, first.run_id, 1)
        assert http_response(again) == (200, {})

    async def test_bad_strategy_is_invalid_argument(self, pool: asyncpg.Pool) -> None:
        with pytest.raises(InvalidArgumentError):
            await ThreadRuns(pool).admit(DEPLOYMENT, "t-1", strategy="steal")


class TestCancel:
    async def test_outcomes_and_their_http_status(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        pending = await threads.admit(DEPLOYMENT, "t-1")
        running = await owned_running(threads, "t-2", worker_id=OTHER)

        cancelled = await threads.cancel(pending.run_id, action="interrupt")
        requested = await threads.cancel(running.run_id)
        again = await threads.cancel(pending.run_id)
        unknown = await threads.cancel("00000000-0000-0000-0000-000000000000")

        assert (cancelled.outcome, cancelled.status, cancelled.cancel_action) == (
            CancelOutcome.CANCELLED, RunStatus.CANCELLED, "interrupt")
        assert (requested.outcome, requested.lease_worker_id, requested.lease_generation) == (
            CancelOutcome.CANCEL_REQUESTED, OTHER, 1)
        assert requested.retry_after_s is not None
        assert again.outcome is CancelOutcome.NOT_CANCELLABLE
        assert unknown.outcome is CancelOutcome.UNKNOWN
        assert [http_response(r)[0] for r in (cancelled, requested, again, unknown)] == [
            202, 202, 409, 404]
        assert http_response(requested)[1] == {"Retry-After": str(requested.retry_after_s)}

    async def test_cancel_after_lease_and_grace_takes_over(self, pool: asyncpg.Pool,
                                                          connect: Any) -> None:
        threads = ThreadRuns(pool, lease_duration_seconds=30, grace_seconds=10)
        running = await owned_running(threads, worker_id=OTHER)
        expires = await lease_expiry(pool, running)
        in_grace = await clock_at(connect, expires + timedelta(seconds=5))
        past = await clock_at(connect, expires + timedelta(seconds=11))

        requested = await threads.cancel(running.run_id, conn=in_grace)
        result = await threads.cancel(running.run_id, conn=past)

        assert requested.outcome is CancelOutcome.CANCEL_REQUESTED  # the owner may still stop
        assert result.outcome is CancelOutcome.TAKEN_OVER
        assert result.status is RunStatus.CANCELLED
        assert http_response(result)[0] == 202
        assert await threads.complete_run(running.run_id, OTHER, generation=1) is False


class TestTakeover:
    async def test_claim_for_takeover_and_reconcile(self, pool: asyncpg.Pool,
                                                   connect: Any) -> None:
        threads = ThreadRuns(pool, lease_duration_seconds=30, grace_seconds=10)
        one = await owned_running(threads, "t-1", worker_id=OTHER)
        two = await owned_running(threads, "t-2", worker_id=OTHER)
        expires = max([await lease_expiry(pool, one), await lease_expiry(pool, two)])
        in_grace = await clock_at(connect, expires + timedelta(seconds=5))
        past = await clock_at(connect, expires + timedelta(seconds=11))
        assert await threads.claim_for_takeover(one.run_id) is None  # still live
        assert await threads.claim_for_takeover(one.run_id, conn=in_grace) is None
        assert await threads.reconcile(DEPLOYMENT, conn=in_grace) == []

        taken = await threads.claim_for_takeover(one.run_id, message="gone", conn=past)
        rest = await threads.reconcile(DEPLOYMENT, conn=past)

        assert taken is not None

        assert (taken.run_id, taken.thread_id, taken.outcome, taken.status) == (
            one.run_id, "t-1", TakeoverOutcome.FAILED, RunStatus.FAILED)
        assert (taken.previous_worker_id, taken.previous_generation) == (OTHER, 1)
        assert [(t.run_id, t.outcome) for t in rest] == [(two.run_id, TakeoverOutcome.FAILED)]
        run = await threads.get(one.run_id)
        assert run is not None
        assert run.error["message"] == "gone"


class TestProgressAndReads:
    async def test_typed_accounting_round_trip(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        running = await owned_running(threads)
        usage = TokenUsage(message_count=2, input_tokens=10, output_tokens=5, total_tokens=15,
                           llm_call_count=1, last_message="x" * 5000)

        assert await threads.update_run_progress(
            running.run_id, OWNER, generation=1, progress={"step": 1}, accounting=usage)

        run = await threads.get(running.run_id)
        assert run is not None
        assert run.progress == {"step": 1}
        assert run.accounting_as(TokenUsage) == usage
        assert len(usage.last_message or "") == TokenUsage.LAST_MESSAGE_LIMIT
        assert await threads.update_run_progress(running.run_id, OTHER, generation=1,
                                                 progress={"step": 2}) is False

    async def test_list_by_thread_newest_first(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        made = [await threads.admit(DEPLOYMENT, "t-1", strategy="enqueue") for _ in range(3)]

        listed = await threads.list_by_thread("t-1", limit=2)

        assert [run.run_id for run in listed] == [made[2].run_id, made[1].run_id]
        assert [run.queued for run in listed] == [True, True]
        assert listed[0].status is RunStatus.WAITING
        assert await threads.get("00000000-0000-0000-0000-000000000000") is None


class TestJoin:
    async def test_join_is_woken_by_the_runs_end(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        running = await owned_running(threads)
        # A 60 s poll interval: only the NOTIFY can end this join in time.
        joiner = asyncio.ensure_future(threads.join(running.run_id, timeout=60,
                                                    poll_interval=60))
        try:
            # The joiner reads the run only after LISTEN: once its read is done, it listens.
            await poll(lambda: pool.fetchval(
                """SELECT count(*) > 0 FROM pg_stat_activity a
                    WHERE a.query LIKE '%zeroth.get_thread_run%' AND a.state = 'idle'"""),
                "the joiner to listen")

            assert await threads.complete_run(running.run_id, OWNER, generation=1,
                                              output={"a": 1})
            run = await asyncio.wait_for(joiner, timeout=10)
        finally:
            joiner.cancel()

        assert run is not None
        assert (run.finished, run.status, run.output) == (True, RunStatus.COMPLETED, {"a": 1})

    async def test_join_times_out_with_the_last_state(self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        running = await owned_running(threads)

        run = await threads.join(running.run_id, timeout=0.05)

        assert run is not None
        assert (run.finished, run.status) == (False, RunStatus.RUNNING)

    async def test_join_of_a_finished_or_unknown_run_returns_at_once(
            self, pool: asyncpg.Pool) -> None:
        threads = ThreadRuns(pool)
        admitted = await threads.admit(DEPLOYMENT, "t-1")
        await threads.cancel(admitted.run_id)

        done = await threads.join(admitted.run_id, timeout=60)
        unknown = await threads.join("00000000-0000-0000-0000-000000000000", timeout=60)

        assert done is not None
        assert done.status is RunStatus.CANCELLED
        assert unknown is None

    async def test_join_on_a_plain_connection(self, connect: Any) -> None:
        conn, actor = await connect(), await connect()
        threads = ThreadRuns(conn)
        running = await owned_running(ThreadRuns(actor))

        joiner = asyncio.ensure_future(threads.join(running.run_id, timeout=60,
                                                    poll_interval=0.05))
        assert await ThreadRuns(actor).cancel_run(running.run_id, OWNER, generation=1)

        run = await asyncio.wait_for(joiner, timeout=10)
        assert run is not None
        assert run.status is RunStatus.CANCELLED


def test_every_outcome_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(AdmitOutcome) | set(CancelOutcome)
