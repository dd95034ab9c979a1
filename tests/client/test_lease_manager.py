"""zeroth_pg.LeaseManager over a real pool: every method, its typed result, conn=, error mapping.

The client sends one SQL call per method and maps the answer; these tests check the mapping
(types, seed names and keywords, lease duration, the caller's transaction, SQLSTATE → exception,
JSON round-trips whatever jsonb codec the pool has), not the transitions themselves, which the
SQL tests cover. The client never passes now_override, so leases run on the database clock and
every lease here is long enough (60 s) not to lapse during a test.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest

from zeroth_pg import (
    CancelOutcome,
    CheckpointConflictError,
    ClaimedRun,
    ConnectionLostError,
    EnqueuedRun,
    FailOutcome,
    FenceColumnWriteError,
    InvalidArgumentError,
    InvalidScopeError,
    InvalidTransitionError,
    LeaseClaimResult,
    LeaseManager,
    LeaseRenewal,
    OrphanClaimResult,
    ReservedKeyError,
    RetryableError,
    RunCompletion,
    RunNotFoundError,
    RunStatus,
    SleepOutcome,
    SleepResult,
    UnknownColumnError,
    ZerothError,
)
from zeroth_pg.errors import translate

DEPLOY = "deploy-client"
W1 = "worker-1"
W2 = "worker-2"


async def _row(pool: Any, run_id: UUID) -> dict[str, Any]:
    row = await pool.fetchrow("SELECT * FROM zeroth.runs r WHERE r.run_id = $1", run_id)
    assert row is not None
    return dict(row)


async def _remaining_lease_seconds(pool: Any, run_id: UUID) -> float:
    """Seconds from the database clock to the run's lease expiry."""
    value = await pool.fetchval(
        """SELECT extract(epoch FROM r.lease_expires_at - clock_timestamp())::float8
             FROM zeroth.runs r WHERE r.run_id = $1""", run_id)
    assert value is not None
    return float(value)


async def _claimed(lm: LeaseManager, **enqueue_kwargs: Any) -> tuple[UUID, int]:
    """A fresh run claimed by W1 (status pending, live lease); returns (run_id, generation)."""
    enqueued = await lm.enqueue_run(DEPLOY, **enqueue_kwargs)
    result = await lm.claim_pending_result(DEPLOY, W1)
    assert result.run_id == enqueued.run_id
    return enqueued.run_id, result.runs[0].lease_generation


async def _running(lm: LeaseManager, **enqueue_kwargs: Any) -> tuple[UUID, int]:
    """A fresh run claimed and started by W1; returns (run_id, generation)."""
    run_id, generation = await _claimed(lm, **enqueue_kwargs)
    assert await lm.start_run(run_id, W1, generation=generation) is True
    return run_id, generation


def _assert_cause(exc: BaseException, sqlstate: str) -> None:
    """The driver's error is chained, so callers can still reach it."""
    assert isinstance(exc.__cause__, asyncpg.PostgresError)
    assert exc.__cause__.sqlstate == sqlstate


class TestEnqueue:
    async def test_enqueue_run_returns_created_pending_run(self, pool):
        lm = LeaseManager(pool)
        result = await lm.enqueue_run(
            DEPLOY, {"task": "summarise", "n": 3}, metadata={"origin": "test"}, priority=5,
            max_attempts=4, thread_id="thread-1")
        assert isinstance(result, EnqueuedRun)
        assert isinstance(result.run_id, UUID)
        assert result.created is True
        assert result.status is RunStatus.PENDING
        row = await _row(pool, result.run_id)
        assert json.loads(row["payload"]) == {"task": "summarise", "n": 3}
        assert json.loads(row["metadata"]) == {"origin": "test"}
        assert (row["priority"], row["max_attempts"], row["thread_id"]) == (5, 4, "thread-1")
        assert (row["tenant_id"], row["workspace_id"]) == ("default", None)

    async def test_repeated_idempotency_key_returns_existing_run_not_created(self, pool):
        lm = LeaseManager(pool)
        first = await lm.enqueue_run(DEPLOY, {"v": 1}, idempotency_key="key-1")
        again = await lm.enqueue_run(DEPLOY, {"v": 2}, idempotency_key="key-1")
        assert again == EnqueuedRun(run_id=first.run_id, created=False, status=RunStatus.PENDING)
        assert json.loads((await _row(pool, first.run_id))["payload"]) == {"v": 1}
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 1

    async def test_caller_chosen_run_id_accepted_as_str(self, pool):
        lm = LeaseManager(pool)
        chosen = uuid4()
        result = await lm.enqueue_run(DEPLOY, run_id=str(chosen))
        assert result.run_id == chosen
        assert isinstance(result.run_id, UUID)

    async def test_enqueue_runs_returns_results_in_input_order(self, pool):
        lm = LeaseManager(pool)
        chosen = uuid4()
        results = await lm.enqueue_runs(DEPLOY, [
            {"payload": {"i": 0}},
            {"payload": {"i": 1}, "run_id": chosen, "priority": 9},
            {"payload": {"i": 2}, "run_after": datetime(2031, 1, 1).astimezone()},
        ])
        assert all(isinstance(r, EnqueuedRun) and r.created for r in results)
        assert results[1].run_id == chosen
        payloads = [json.loads((await _row(pool, r.run_id))["payload"]) for r in results]
        assert payloads == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert (await _row(pool, chosen))["priority"] == 9


class TestClaimPending:
    async def test_claim_pending_returns_run_id_then_none_when_empty(self, pool):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY)
        claimed = await lm.claim_pending(DEPLOY, W1)
        assert isinstance(claimed, UUID)
        assert claimed == enqueued.run_id
        assert await lm.claim_pending(DEPLOY, W2) is None
        row = await _row(pool, claimed)
        assert (row["lease_worker_id"], row["lease_generation"], row["status"]) == (
            W1, 1, "pending")

    async def test_claim_pending_result_batch_returns_every_claimed_run(self, pool):
        lm = LeaseManager(pool)
        low = await lm.enqueue_run(DEPLOY, {"n": "low"}, priority=1)
        high = await lm.enqueue_run(DEPLOY, {"n": "high"}, priority=7, metadata={"m": 1},
                                    idempotency_key="idem-high", thread_id="t-high")
        mid = await lm.enqueue_run(DEPLOY, {"n": "mid"}, priority=4)
        result = await lm.claim_pending_result(DEPLOY, W1, batch_size=5)
        assert isinstance(result, LeaseClaimResult)
        assert all(isinstance(run, ClaimedRun) for run in result.runs)
        assert [run.run_id for run in result.runs] == [high.run_id, mid.run_id, low.run_id]
        assert result.run_id == high.run_id
        assert result.concurrency_saturated is False
        assert result.max_concurrency is None
        assert result.utilization == 0.0
        first = result.runs[0]
        assert first.lease_generation == 1
        assert first.status is RunStatus.PENDING
        assert (first.attempts, first.max_attempts, first.priority) == (0, 3, 7)
        assert (first.thread_id, first.idempotency_key) == ("t-high", "idem-high")
        assert first.payload == {"n": "high"}
        assert first.metadata == {"m": 1}
        assert first.recovery_checkpoint_id is None
        assert first.checkpoint_data is None
        assert first.cancel_requested is False
        assert isinstance(first.lease_expires_at, datetime)
        assert first.lease_expires_at == (await _row(pool, high.run_id))["lease_expires_at"]

    async def test_claim_pending_result_reports_utilization_under_max_concurrency(self, pool):
        lm = LeaseManager(pool)
        for _ in range(3):
            await lm.enqueue_run(DEPLOY)
        first = await lm.claim_pending_result(DEPLOY, W1, max_concurrency=2)
        second = await lm.claim_pending_result(DEPLOY, W1, max_concurrency=2)
        third = await lm.claim_pending_result(DEPLOY, W1, max_concurrency=2)
        assert first.run_id is not None
        assert second.run_id is not None
        assert (first.active_count, first.max_concurrency, first.utilization) == (0, 2, 0.0)
        assert (second.active_count, second.utilization) == (1, 0.5)
        assert second.concurrency_saturated is False
        assert third.run_id is None
        assert third.runs == ()
        assert third.concurrency_saturated is True
        assert (third.active_count, third.max_concurrency, third.utilization) == (2, 2, 1.0)
        assert await pool.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.lease_worker_id IS NULL") == 1

    async def test_claim_pending_lease_lasts_lease_duration_seconds(self, pool):
        lm = LeaseManager(pool, lease_duration_seconds=5)
        await lm.enqueue_run(DEPLOY)
        run_id = await lm.claim_pending(DEPLOY, W1)
        assert run_id is not None
        assert 0 < await _remaining_lease_seconds(pool, run_id) <= 5

    async def test_default_lease_duration_is_sixty_seconds(self, pool):
        lm = LeaseManager(pool)
        assert lm.lease_duration_seconds == 60.0
        await lm.enqueue_run(DEPLOY)
        run_id = await lm.claim_pending(DEPLOY, W1)
        assert run_id is not None
        assert 0 < await _remaining_lease_seconds(pool, run_id) <= 60


class TestFastPath:
    async def test_claim_and_start_returns_running_runs_with_their_attempt(self, pool):
        lm = LeaseManager(pool, lease_duration_seconds=30)
        enqueued = [await lm.enqueue_run(DEPLOY, payload={"n": n}) for n in range(3)]

        result = await lm.claim_and_start(DEPLOY, W1, batch_size=5)

        assert isinstance(result, LeaseClaimResult)
        assert [run.run_id for run in result.runs] == [e.run_id for e in enqueued]
        assert {(run.status, run.attempts, run.lease_generation) for run in result.runs} == {
            (RunStatus.RUNNING, 1, 1)}
        assert 25 < await _remaining_lease_seconds(pool, enqueued[0].run_id) <= 30
        empty = await lm.claim_and_start(DEPLOY, W1)
        assert (empty.run_id, empty.runs) == (None, ())

    async def test_complete_runs_reports_each_run_and_stores_outputs(self, pool):
        lm = LeaseManager(pool)
        for _ in range(3):
            await lm.enqueue_run(DEPLOY)
        runs = (await lm.claim_and_start(DEPLOY, W1, batch_size=3)).runs

        result = await lm.complete_runs(W1, [
            (runs[0].run_id, runs[0].lease_generation, {"answer": 1}),
            (str(runs[1].run_id), runs[1].lease_generation),
            (runs[2].run_id, runs[2].lease_generation + 1)])

        assert result == [RunCompletion(runs[0].run_id, True), RunCompletion(runs[1].run_id, True),
                          RunCompletion(runs[2].run_id, False)]
        assert json.loads((await _row(pool, runs[0].run_id))["output"]) == {"answer": 1}
        assert (await _row(pool, runs[1].run_id))["output"] is None
        assert (await _row(pool, runs[2].run_id))["status"] == "running"

    @pytest.mark.parametrize("completions", [
        pytest.param([("not-a-uuid", 1)], id="bad-uuid"),
        pytest.param([(uuid4(),)], id="no-generation"),
        pytest.param([(uuid4(), 1, {1, 2})], id="output-not-json"),
    ])
    async def test_complete_runs_rejects_bad_input_before_sending(self, pool, completions):
        with pytest.raises(InvalidArgumentError):
            await LeaseManager(pool).complete_runs(W1, completions)

    async def test_complete_runs_repeated_run_raises_invalid_argument(self, pool):
        lm = LeaseManager(pool)
        run_id = uuid4()
        with pytest.raises(InvalidArgumentError) as caught:
            await lm.complete_runs(W1, [(run_id, 1), (run_id, 1)])
        _assert_cause(caught.value, "ZP008")


class TestClaimOrphaned:
    async def test_claim_orphaned_takes_over_expired_lease_as_list(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.expire_recovery_lease(run_id, W1, generation=generation) is True
        taken = await lm.claim_orphaned(DEPLOY, W2)
        assert taken == [run_id]
        assert isinstance(taken, list)
        assert await lm.current_holder(run_id) == W2
        assert await lm.current_generation(run_id) == generation + 1
        assert await lm.claim_orphaned(DEPLOY, W1) == []

    async def test_claim_orphaned_result_gives_generations_and_checkpoints(self, pool):
        lm = LeaseManager(pool, lease_duration_seconds=20)
        first, gen_first = await _running(lm, payload={"n": 1})
        second, gen_second = await _running(lm, payload={"n": 2})
        checkpoint = await lm.save_checkpoint(first, W1, {"step": 3}, generation=gen_first)
        await lm.clear_lease(first)
        await lm.clear_lease(second)
        result = await lm.claim_orphaned_result(DEPLOY, W2)
        assert isinstance(result, OrphanClaimResult)
        assert set(result.run_ids) == {first, second}
        assert isinstance(result.run_ids, tuple)
        assert result.generations == {first: gen_first + 1, second: gen_second + 1}
        assert result.concurrency_saturated is False
        by_id = {run.run_id: run for run in result.runs}
        assert by_id[first].recovery_checkpoint_id == checkpoint
        assert by_id[first].checkpoint_data == {"step": 3}
        assert by_id[first].payload == {"n": 1}
        assert by_id[first].status is RunStatus.RUNNING
        assert by_id[second].recovery_checkpoint_id is None
        assert by_id[second].checkpoint_data is None
        assert await lm.get_recovery_checkpoint_id(first) == checkpoint
        assert 0 < await _remaining_lease_seconds(pool, first) <= 20

    async def test_claim_orphaned_result_empty_scan_is_definitive(self, pool):
        lm = LeaseManager(pool)
        await _running(lm)
        result = await lm.claim_orphaned_result(DEPLOY, W2)
        assert result == OrphanClaimResult(run_ids=(), concurrency_saturated=False,
                                           generations={}, active_count=0,
                                           max_concurrency=None, runs=())

    async def test_claim_orphaned_result_reports_orphan_waiting_for_a_slot(self, pool):
        lm = LeaseManager(pool)
        orphan, generation = await _running(lm)
        await lm.expire_recovery_lease(orphan, W1, generation=generation)
        await lm.enqueue_run(DEPLOY)
        assert await lm.claim_pending(DEPLOY, W1, max_concurrency=1) is not None
        before = await _row(pool, orphan)
        result = await lm.claim_orphaned_result(DEPLOY, W2, max_concurrency=1, claim_limit=1)
        assert result.run_ids == ()
        assert result.concurrency_saturated is True
        assert (result.active_count, result.max_concurrency) == (1, 1)
        assert await _row(pool, orphan) == before


class TestLeaseUpkeep:
    async def test_renew_lease_takes_generation_keyword(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _claimed(lm)
        assert await lm.renew_lease(run_id, W1, generation=generation) is True
        assert await lm.renew_lease(run_id, W1) is True
        assert await lm.renew_lease(run_id, W1, generation=generation + 1) is False
        assert await lm.renew_lease(run_id, W2, generation=generation) is False

    async def test_renew_lease_extends_by_lease_duration_seconds(self, pool):
        run_id, generation = await _claimed(LeaseManager(pool, lease_duration_seconds=5))
        before = (await _row(pool, run_id))["lease_expires_at"]
        assert await LeaseManager(pool, lease_duration_seconds=30).renew_lease(
            run_id, W1, generation=generation) is True
        remaining = await _remaining_lease_seconds(pool, run_id)
        assert 0 < remaining <= 30
        assert (await _row(pool, run_id))["lease_expires_at"] > before

    async def test_renew_leases_reports_each_lease_and_pending_cancel(self, pool):
        lm = LeaseManager(pool, lease_duration_seconds=30)
        live, gen_live = await _running(lm)
        cancelled, gen_cancelled = await _running(lm)
        assert await lm.request_cancel(cancelled) is CancelOutcome.CANCEL_REQUESTED
        renewals = await lm.renew_leases(W1, {live: gen_live, cancelled: gen_cancelled})
        assert all(isinstance(r, LeaseRenewal) for r in renewals)
        assert [(r.run_id, r.renewed, r.cancel_requested) for r in renewals] == [
            (live, True, False), (cancelled, True, True)]
        assert renewals[0].lease_expires_at == (await _row(pool, live))["lease_expires_at"]
        assert 0 < await _remaining_lease_seconds(pool, live) <= 30

    async def test_renew_leases_accepts_pairs_and_refuses_stale_generation(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _claimed(lm)
        before = await _row(pool, run_id)
        renewals = await lm.renew_leases(W1, [(str(run_id), generation + 1)])
        assert renewals == [LeaseRenewal(run_id=run_id, renewed=False, lease_expires_at=None,
                                         cancel_requested=False)]
        assert await _row(pool, run_id) == before

    async def test_reads_return_int_str_uuid_or_none(self, pool):
        lm = LeaseManager(pool)
        unknown = uuid4()
        assert await lm.current_generation(unknown) is None
        assert await lm.current_holder(unknown) is None
        assert await lm.get_recovery_checkpoint_id(unknown) is None
        enqueued = await lm.enqueue_run(DEPLOY)
        assert await lm.current_generation(enqueued.run_id) == 0
        assert await lm.current_holder(enqueued.run_id) is None
        await lm.claim_pending(DEPLOY, W1)
        generation = await lm.current_generation(str(enqueued.run_id))
        assert generation == 1
        assert isinstance(generation, int)
        assert await lm.current_holder(str(enqueued.run_id)) == W1
        assert await lm.get_recovery_checkpoint_id(enqueued.run_id) is None


class TestFencedWrites:
    async def test_full_lifecycle_through_client(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _claimed(lm, payload={"doc": 1})
        assert await lm.start_run(run_id, W1, generation=generation) is True
        first = await lm.save_checkpoint(run_id, W1, {"step": 1}, generation=generation)
        second = await lm.save_checkpoint(str(run_id), W1, {"step": 2}, generation=generation)
        assert isinstance(first, UUID)
        assert isinstance(second, UUID)
        assert first != second
        assert await lm.commit_fenced(run_id, W1, generation=generation,
                                      progress={"pct": 50}, metadata={"stage": "half"}) is True
        assert await lm.complete_run(str(run_id), W1, generation=generation,
                                     output={"summary": "done"}) is True
        row = await _row(pool, run_id)
        assert row["status"] == "completed"
        assert json.loads(row["output"]) == {"summary": "done"}
        assert json.loads(row["progress"]) == {"pct": 50}
        assert json.loads(row["metadata"]) == {"stage": "half"}
        assert row["lease_worker_id"] is None
        assert await pool.fetchval(
            """SELECT array_agg(k.checkpoint_id ORDER BY k.checkpoint_order)
                 FROM zeroth.checkpoints k WHERE k.run_id = $1""", run_id) == [first, second]

    async def test_stale_generation_writes_are_refused_and_change_nothing(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        stale = generation + 1
        before = await _row(pool, run_id)
        assert await lm.start_run(run_id, W1, generation=stale) is False
        assert await lm.save_checkpoint(run_id, W1, {"x": 1}, generation=stale) is None
        assert await lm.commit_fenced(run_id, W1, generation=stale, output={"x": 1}) is False
        assert await lm.complete_run(run_id, W1, generation=stale, output={"x": 1}) is False
        assert await lm.fail_run(run_id, W1, generation=stale, error={"x": 1}) is None
        assert await lm.cancel_run(run_id, W1, generation=stale) is False
        assert await lm.pause_run(run_id, W1, generation=stale, reason="approval") is False
        assert await lm.release_lease(run_id, W1, generation=stale) is False
        assert await lm.hand_back_to_pending(run_id, W1, generation=stale) is False
        assert await lm.expire_recovery_lease(run_id, W1, generation=stale) is False
        assert await _row(pool, run_id) == before
        assert await pool.fetchval("SELECT count(*) FROM zeroth.checkpoints") == 0

    async def test_fail_run_returns_each_fail_outcome(self, pool):
        lm = LeaseManager(pool)
        retried, generation = await _running(lm, max_attempts=2)
        outcome = await lm.fail_run(retried, W1, generation=generation, error={"e": 1},
                                    retry_base_seconds=0, retry_max_seconds=0)
        assert outcome is FailOutcome.RETRY_SCHEDULED
        assert (await _row(pool, retried))["status"] == "pending"
        claimed = await lm.claim_pending_result(DEPLOY, W1)
        assert claimed.run_id == retried
        generation = claimed.runs[0].lease_generation
        assert await lm.start_run(retried, W1, generation=generation) is True
        assert await lm.fail_run(retried, W1, generation=generation,
                                 error={"e": 2}) is FailOutcome.DEAD_LETTERED
        failed, gen_failed = await _running(lm)
        assert await lm.fail_run(failed, W1, generation=gen_failed, error={"e": 3},
                                 retryable=False) is FailOutcome.FAILED
        row = await _row(pool, failed)
        assert (row["status"], json.loads(row["error"])) == ("failed", {"e": 3})
        assert (await _row(pool, retried))["dead_lettered_at"] is not None

    async def test_cancel_run_then_redrive_run(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.cancel_run(run_id, W1, generation=generation) is True
        row = await _row(pool, run_id)
        assert (row["status"], row["lease_worker_id"]) == ("cancelled", None)
        assert await lm.redrive_run(str(run_id)) is True
        row = await _row(pool, run_id)
        assert (row["status"], row["attempts"], row["lease_generation"]) == (
            "pending", 0, generation)

    async def test_prune_runs_deletes_a_batch_of_finished_runs_and_returns_the_count(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.complete_run(run_id, W1, generation=generation, output={}) is True
        pending = (await lm.enqueue_run(DEPLOY)).run_id
        assert await lm.prune_runs(timedelta(days=1)) == 0
        assert await lm.prune_runs(timedelta(0), batch_size=10, tenant_id="default") == 1
        assert await lm.prune_runs(timedelta(0)) == 0
        assert await pool.fetchval("SELECT array_agg(run_id) FROM zeroth.runs") == [pending]
        with pytest.raises(InvalidScopeError):
            await lm.prune_runs(timedelta(0), workspace_id="ws")

    async def test_pause_run_then_resume_run_with_input(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.pause_run(run_id, W1, generation=generation, reason="approval") is True
        row = await _row(pool, run_id)
        assert (row["status"], row["wait_reason"]) == ("waiting", "approval")
        assert await lm.resume_run(str(run_id), input={"approved": True}) is True
        row = await _row(pool, run_id)
        assert row["status"] == "pending"
        assert json.loads(row["metadata"])["resume_input"] == {"approved": True}

    async def test_sleep_run_returns_its_typed_result_and_none_when_fenced_out(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.sleep_run(run_id, W2, generation=generation, delay_seconds=5) is None
        before = await pool.fetchval("SELECT clock_timestamp()")
        result = await lm.sleep_run(str(run_id), W1, generation=generation, delay_seconds=5,
                                    checkpoint={"step": 2})
        assert isinstance(result, SleepResult)
        assert result.outcome is SleepOutcome.SLEEPING
        assert result.run_after is not None
        assert result.run_after >= before + timedelta(seconds=5)
        row = await _row(pool, run_id)
        assert (row["status"], row["run_after"], row["attempts"]) == (
            "pending", result.run_after, 0)
        assert await pool.fetchval("SELECT checkpoint_id FROM zeroth.checkpoints "
                                   "WHERE run_id = $1", run_id) == result.checkpoint_id

    async def test_sleep_run_until_an_instant_and_with_a_pending_cancel(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        when = await pool.fetchval("SELECT date_trunc('second', now()) + interval '1 day'")
        result = await lm.sleep_run(run_id, W1, generation=generation, resume_at=when)
        assert result == SleepResult(SleepOutcome.SLEEPING, when, None)
        live, generation = await _running(lm)
        assert await lm.request_cancel(live) is CancelOutcome.CANCEL_REQUESTED
        result = await lm.sleep_run(live, W1, generation=generation, delay_seconds=1)
        assert result == SleepResult(SleepOutcome.CANCELLED, None, None)

    async def test_sleep_run_refuses_bad_times_with_invalid_argument(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        with pytest.raises(InvalidArgumentError, match="timezone-aware"):
            await lm.sleep_run(run_id, W1, generation=generation,
                               resume_at=datetime(2100, 1, 1))  # naive
        with pytest.raises(InvalidArgumentError, match="exactly one"):
            await lm.sleep_run(run_id, W1, generation=generation)
        with pytest.raises(InvalidArgumentError, match="delay_seconds"):
            await lm.sleep_run(run_id, W1, generation=generation, delay_seconds=-1)
        assert (await _row(pool, run_id))["status"] == "running"

    async def test_release_lease_makes_claimed_run_claimable(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _claimed(lm)
        assert await lm.release_lease(run_id, W1, generation=generation) is True
        assert await lm.current_holder(run_id) is None
        assert await lm.claim_pending(DEPLOY, W2) == run_id

    async def test_hand_back_to_pending_gives_attempt_back(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.hand_back_to_pending(str(run_id), W1, generation=generation) is True
        row = await _row(pool, run_id)
        assert (row["status"], row["attempts"], row["lease_worker_id"]) == ("pending", 0, None)

    async def test_expire_recovery_lease_keeps_holder_with_dead_lease(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        assert await lm.expire_recovery_lease(str(run_id), W1, generation=generation) is True
        assert await lm.renew_lease(run_id, W1, generation=generation) is False
        assert await lm.current_holder(run_id) == W1
        assert (await _row(pool, run_id))["status"] == "running"

    async def test_clear_lease_and_request_cancel_outcomes(self, pool):
        lm = LeaseManager(pool)
        running, _ = await _running(lm)
        assert await lm.clear_lease(str(running)) is True
        row = await _row(pool, running)
        assert (row["status"], row["lease_worker_id"]) == ("running", W1)
        assert await lm.claim_orphaned(DEPLOY, W2) == [running]
        pending = await lm.enqueue_run(DEPLOY, run_after=datetime(2100, 1, 1).astimezone())
        assert await lm.clear_lease(pending.run_id) is False  # no lease to clear
        assert await lm.request_cancel(pending.run_id) is CancelOutcome.CANCELLED
        assert await lm.request_cancel(pending.run_id) is CancelOutcome.NOT_CANCELLABLE
        assert await lm.request_cancel(uuid4()) is CancelOutcome.UNKNOWN
        live, _ = await _running(lm)
        assert await lm.request_cancel(live, action="interrupt") is CancelOutcome.CANCEL_REQUESTED
        assert (await _row(pool, live))["cancel_action"] == "interrupt"


class TestCallerTransaction:
    async def test_enqueue_in_rolled_back_transaction_leaves_no_run(self, pool, connect):
        lm = LeaseManager(pool)
        own = await connect()

        class Rollback(Exception):
            pass

        # Leaving the block by an exception rolls the caller's transaction back.
        with contextlib.suppress(Rollback):
            async with own.transaction():
                enqueued = await lm.enqueue_run(DEPLOY, {"a": 1}, conn=own)
                assert await lm.current_generation(enqueued.run_id, conn=own) == 0
                assert await lm.current_generation(enqueued.run_id) is None
                raise Rollback
        assert await lm.current_generation(enqueued.run_id) is None
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_claim_in_caller_transaction_is_visible_only_after_commit(self, pool, connect):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY)
        own = await connect()
        transaction = own.transaction()
        await transaction.start()
        try:
            assert await lm.claim_pending(DEPLOY, W1, conn=own) == enqueued.run_id
            assert await lm.current_holder(enqueued.run_id, conn=own) == W1
            assert await lm.current_holder(enqueued.run_id) is None
            assert await lm.current_generation(enqueued.run_id) == 0
            # The row is locked by the open transaction: another claimer skips it.
            assert await lm.claim_pending(DEPLOY, W2) is None
        finally:
            await transaction.commit()
        assert await lm.current_holder(enqueued.run_id) == W1
        assert await lm.current_generation(enqueued.run_id) == 1

    async def test_claim_in_rolled_back_transaction_leaves_run_claimable(self, pool, connect):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY)
        own = await connect()
        transaction = own.transaction()
        await transaction.start()
        assert await lm.claim_pending(DEPLOY, W1, conn=own) == enqueued.run_id
        await transaction.rollback()
        assert await lm.current_generation(enqueued.run_id) == 0
        assert await lm.claim_pending(DEPLOY, W2) == enqueued.run_id
        assert await lm.current_holder(enqueued.run_id) == W2


class TestErrorMapping:
    def test_asyncpg_protocol_confusion_after_a_dropped_connection_is_retryable(self):
        # Seen in the chaos soak right after pg_terminate_backend / a server restart: asyncpg
        # raises InternalClientError instead of a connection error; the call may be repeated.
        from zeroth_pg.errors import ConnectionLostError, translate

        mapped = translate(asyncpg.InternalClientError(
            "cannot switch to state 12; another operation (2) is in progress"))

        assert isinstance(mapped, ConnectionLostError)
        assert mapped.retryable is True

    async def test_unknown_run_raises_run_not_found_lookup_error(self, pool):
        lm = LeaseManager(pool)
        for call in (lm.clear_lease, lm.resume_run, lm.redrive_run):
            with pytest.raises(RunNotFoundError) as caught:
                await call(uuid4())
            assert isinstance(caught.value, LookupError)
            assert caught.value.sqlstate == "ZP001"
            assert caught.value.retryable is False
            _assert_cause(caught.value, "ZP001")

    async def test_run_in_other_tenant_is_not_found(self, pool):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY, tenant_id="tenant-b")
        with pytest.raises(RunNotFoundError):
            await lm.clear_lease(enqueued.run_id)
        assert await lm.current_generation(enqueued.run_id, tenant_id="tenant-b") == 0

    async def test_wrong_status_raises_invalid_transition(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _claimed(lm)  # pending: never started
        before = await _row(pool, run_id)
        with pytest.raises(InvalidTransitionError) as caught:
            await lm.complete_run(run_id, W1, generation=generation, output={"x": 1})
        _assert_cause(caught.value, "ZP003")
        with pytest.raises(InvalidTransitionError):
            await lm.resume_run(run_id)
        assert await _row(pool, run_id) == before

    async def test_commit_fenced_protected_column_raises_fence_column_write(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        before = await _row(pool, run_id)
        # However spelled; run_id itself cannot be passed: it is the method's own parameter.
        for column in ("status", "lease_generation", "LEASE_WORKER_ID", ' "lease_expires_at" ',
                       "Workspace_Key"):
            with pytest.raises(FenceColumnWriteError) as caught:
                await lm.commit_fenced(run_id, W1, generation=generation,
                                       **{column: "x", "output": {"ok": True}})
            assert isinstance(caught.value, ValueError)
            _assert_cause(caught.value, "ZP004")
        assert await _row(pool, run_id) == before

    async def test_commit_fenced_unknown_column_raises_unknown_column(self, pool):
        lm = LeaseManager(pool)
        run_id, generation = await _running(lm)
        before = await _row(pool, run_id)
        with pytest.raises(UnknownColumnError) as caught:
            await lm.commit_fenced(run_id, W1, generation=generation, final_output={"x": 1})
        assert isinstance(caught.value, ValueError)
        _assert_cause(caught.value, "ZP005")
        assert await _row(pool, run_id) == before

    async def test_workspace_without_tenant_raises_invalid_scope(self, pool):
        lm = LeaseManager(pool)
        with pytest.raises(InvalidScopeError) as caught:
            await lm.enqueue_run(DEPLOY, workspace_id="ws-1")
        assert isinstance(caught.value, ValueError)
        _assert_cause(caught.value, "ZP006")
        with pytest.raises(InvalidScopeError):
            await lm.claim_pending(DEPLOY, W1, workspace_id="ws-1", max_concurrency=1)
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 0
        assert await pool.fetchval("SELECT count(*) FROM zeroth.admission_slots") == 0

    async def test_checkpoint_id_of_other_run_raises_checkpoint_conflict(self, pool):
        lm = LeaseManager(pool)
        owner, gen_owner = await _running(lm)
        other, gen_other = await _running(lm)
        checkpoint = await lm.save_checkpoint(owner, W1, {"mine": True}, generation=gen_owner)
        before = await _row(pool, other)
        with pytest.raises(CheckpointConflictError) as caught:
            await lm.save_checkpoint(other, W1, {"theirs": True}, generation=gen_other,
                                     checkpoint_id=str(checkpoint))
        _assert_cause(caught.value, "ZP007")
        assert await _row(pool, other) == before
        data = await pool.fetchval(
            "SELECT k.data::text FROM zeroth.checkpoints k WHERE k.checkpoint_id = $1", checkpoint)
        assert json.loads(data) == {"mine": True}

    async def test_bad_argument_raises_invalid_argument_and_changes_nothing(self, pool):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY)
        before = await _row(pool, enqueued.run_id)
        with pytest.raises(InvalidArgumentError) as caught:
            await lm.claim_pending(DEPLOY, W1, max_concurrency=0)
        assert isinstance(caught.value, ValueError)
        _assert_cause(caught.value, "ZP008")
        with pytest.raises(InvalidArgumentError):
            await LeaseManager(pool, lease_duration_seconds=0).claim_pending(DEPLOY, W1)
        with pytest.raises(InvalidArgumentError):
            await lm.enqueue_run(DEPLOY, max_attempts=0)
        assert await _row(pool, enqueued.run_id) == before
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 1

    async def test_a_schedules_key_raises_reserved_key_and_changes_nothing(self, pool):
        lm = LeaseManager(pool)
        key = "zeroth-schedule:00000000-0000-0000-0000-000000000000:2030-01-01T00:00:00.000000Z"
        with pytest.raises(ReservedKeyError) as caught:
            await lm.enqueue_run(DEPLOY, idempotency_key=key)
        assert isinstance(caught.value, InvalidArgumentError)
        _assert_cause(caught.value, "ZP011")
        with pytest.raises(ReservedKeyError):
            await lm.enqueue_runs(DEPLOY, [{"idempotency_key": key}])
        assert await pool.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    @pytest.mark.parametrize("sqlstate", ["53100", "53200", "53300", "40P01"])
    async def test_a_server_state_error_is_retryable_not_a_bad_value(self, pool, sqlstate):
        # An exhausted server resource (class 53) says nothing about the call's values: a
        # worker must retry, never fail the run.
        with pytest.raises(asyncpg.PostgresError) as raised:
            await pool.execute(
                f"DO $$BEGIN RAISE EXCEPTION 'server state' USING ERRCODE = '{sqlstate}'; END$$")
        translated = translate(raised.value)
        assert isinstance(translated, RetryableError)
        assert translated.retryable is True

    async def test_a_value_too_large_is_not_retried(self, pool):
        # 54000 program_limit_exceeded (a string too long for jsonb): refused every time, so
        # retrying it only loops.
        with pytest.raises(asyncpg.PostgresError) as raised:
            await pool.execute(
                "DO $$BEGIN RAISE EXCEPTION 'too long' USING ERRCODE = '54000'; END$$")
        assert not isinstance(translate(raised.value), RetryableError)

    async def test_terminated_connection_raises_retryable_connection_lost(self, pool, connect):
        lm = LeaseManager(pool)
        enqueued = await lm.enqueue_run(DEPLOY)
        doomed = await connect()
        # The two-argument form waits until the backend has exited.
        assert await pool.fetchval("SELECT pg_terminate_backend($1, 5000)",
                                   doomed.get_server_pid()) is True
        with pytest.raises(ConnectionLostError) as caught:
            await lm.claim_pending(DEPLOY, W1, conn=doomed)
        assert isinstance(caught.value, RetryableError)
        assert isinstance(caught.value, ZerothError)
        assert caught.value.retryable is True
        assert isinstance(caught.value.__cause__, asyncpg.InterfaceError | asyncpg.PostgresError
                          | OSError)
        assert await lm.current_generation(enqueued.run_id) == 0


class TestCustomJsonbCodec:
    async def test_json_round_trips_as_dicts_whatever_the_pool_codec(self, database_dsn):
        async def init(connection: asyncpg.Connection) -> None:
            await connection.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads,
                                            schema="pg_catalog")

        codec_pool = await asyncpg.create_pool(database_dsn, min_size=1, max_size=2, init=init)
        try:
            lm = LeaseManager(codec_pool)
            payload = {"doc": "a", "tags": ["x", "y"], "n": 1.5}
            enqueued = await lm.enqueue_run(DEPLOY, payload, metadata={"m": {"deep": True}})
            [batch] = await lm.enqueue_runs(DEPLOY, [{"payload": {"batch": 1}}])
            claim = await lm.claim_pending_result(DEPLOY, W1, batch_size=2)
            by_id = {run.run_id: run for run in claim.runs}
            assert by_id[enqueued.run_id].payload == payload
            assert by_id[enqueued.run_id].metadata == {"m": {"deep": True}}
            assert by_id[batch.run_id].payload == {"batch": 1}

            run_id = enqueued.run_id
            generation = by_id[run_id].lease_generation
            assert await lm.start_run(run_id, W1, generation=generation)
            checkpoint = await lm.save_checkpoint(run_id, W1, {"step": [1, 2]},
                                                  generation=generation)
            assert await lm.commit_fenced(run_id, W1, generation=generation,
                                          progress={"pct": 10}, metadata={"k": "v"})
            assert await lm.expire_recovery_lease(run_id, W1, generation=generation)
            orphans = await lm.claim_orphaned_result(DEPLOY, W2)
            assert orphans.runs[0].recovery_checkpoint_id == checkpoint
            assert orphans.runs[0].checkpoint_data == {"step": [1, 2]}
            assert orphans.runs[0].metadata == {"k": "v"}
            assert await lm.complete_run(run_id, W2, generation=orphans.generations[run_id],
                                         output={"answer": 42})

            # Read back through the codec: stored as JSON objects, never as JSON strings.
            row = await codec_pool.fetchrow(
                """SELECT r.payload, r.output, r.progress, r.metadata,
                          jsonb_typeof(r.output) AS output_type FROM zeroth.runs r
                    WHERE r.run_id = $1""", run_id)
            assert row["payload"] == payload
            assert row["output"] == {"answer": 42}
            assert row["progress"] == {"pct": 10}
            assert row["metadata"] == {"k": "v"}
            assert row["output_type"] == "object"
        finally:
            await codec_pool.close()
