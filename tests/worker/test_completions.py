"""Completion batching (zeroth_pg.worker._settle.CompletionBatcher) on real leases: runs
that finish together take one settle_runs call, the fence answers each run on its own, an
output PostgreSQL cannot store fails only its run, and an unreachable database answers None by a
run's lease deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from leased import WORKER, active, claim, lease_row

from zeroth_pg.client import LeaseManager
from zeroth_pg.errors import InvalidArgumentError
from zeroth_pg.types import RetryPolicy, SettleKind, SettleOutcome
from zeroth_pg.worker._settle import CompletionBatcher


class CountingCalls:
    """Counts the settle_runs calls of a LeaseManager (and the runs in each)."""

    def __init__(self, lm: LeaseManager) -> None:
        self.sizes: list[int] = []
        self.kinds: list[list[str]] = []
        self._real = lm.settle_runs
        lm.settle_runs = self._settle  # type: ignore[method-assign]

    async def _settle(self, worker_id: str, settlements: Any, **kwargs: Any) -> Any:
        self.sizes.append(len(settlements))
        self.kinds.append([str(item.kind) for item in settlements])
        return await self._real(worker_id, settlements, **kwargs)


@pytest.fixture
def lm(pool: asyncpg.Pool) -> LeaseManager:
    return LeaseManager(pool)


@contextlib.asynccontextmanager
async def running(batcher: CompletionBatcher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(batcher.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TestBatching:
    async def test_completions_queued_together_take_one_call(self, pool, lm):
        runs = await claim(lm, 5)
        calls = CountingCalls(lm)
        batcher = CompletionBatcher(lm, WORKER)
        answers = [batcher.submit(active(run), {"i": run.payload["i"]}) for run in runs]
        async with running(batcher):
            assert await asyncio.gather(*answers) == [True] * 5
        assert calls.sizes == [5]
        for run in runs:
            row = await lease_row(pool, run)
            assert (row["status"], json.loads(row["output"])) == (
                "completed", {"i": run.payload["i"]})

    async def test_a_lone_completion_goes_out_without_waiting_for_company(self, lm):
        [run] = await claim(lm, 1)
        calls = CountingCalls(lm)
        batcher = CompletionBatcher(lm, WORKER)
        async with running(batcher):
            await asyncio.sleep(0.05)  # the loop is idle, waiting
            assert await asyncio.wait_for(batcher.complete(active(run), {}), timeout=5) is True
        assert calls.sizes == [1]


class TestAnswers:
    async def test_the_fence_answers_each_run_of_a_batch_on_its_own(self, lm):
        kept, cleared = await claim(lm, 2)
        assert await lm.clear_lease(cleared.run_id)
        batcher = CompletionBatcher(lm, WORKER)
        answers = [batcher.submit(active(kept), {}), batcher.submit(active(cleared), {})]
        async with running(batcher):
            assert await asyncio.gather(*answers) == [True, False]

    async def test_an_output_postgres_cannot_store_fails_only_its_own_run(self, pool, lm):
        good, bad, other = await claim(lm, 3)
        refused = []
        batcher = CompletionBatcher(lm, WORKER, on_batch_refused=lambda: refused.append(1))
        answers = [batcher.submit(active(good), {"ok": 1}),
                   batcher.submit(active(bad), {"text": "nul \x00 byte"}),  # jsonb refuses it
                   batcher.submit(active(other), {"ok": 2})]
        async with running(batcher):
            results = await asyncio.gather(*answers, return_exceptions=True)
        assert (results[0], results[2]) == (True, True)
        assert isinstance(results[1], InvalidArgumentError)  # refused before it was sent
        assert refused == [1]
        assert (await lease_row(pool, bad))["status"] == "running"  # its task fails it

    async def test_an_unreachable_database_answers_none_by_the_lease_deadline(
            self, database_dsn, lm):
        [run] = await claim(lm, 1)
        closed = await asyncpg.create_pool(database_dsn, min_size=0, max_size=1)
        await closed.close()
        batcher = CompletionBatcher(LeaseManager(closed), WORKER)
        started = time.monotonic()
        async with running(batcher):
            answer = await asyncio.wait_for(
                batcher.complete(active(run, deadline=started + 0.3), {}), timeout=10)
        assert answer is None  # given up when the next retry would pass the deadline

    async def test_retries_until_the_deadline_are_one_warning_a_count_each_and_a_summary(
            self, database_dsn, lm, caplog):
        # A settling call that kept failing was retried in silence until its lease deadline.
        caplog.set_level(logging.INFO, logger="zeroth_pg.worker")
        [run] = await claim(lm, 1)
        closed = await asyncpg.create_pool(database_dsn, min_size=0, max_size=1)
        await closed.close()
        retries: list[int] = []
        batcher = CompletionBatcher(LeaseManager(closed), WORKER,
                                    on_retry=lambda: retries.append(1))
        async with running(batcher):
            answer = await asyncio.wait_for(
                batcher.complete(active(run, deadline=time.monotonic() + 2.0), {}), timeout=10)
        assert answer is None
        lines = [(r.levelno, r.getMessage()) for r in caplog.records]
        began = [line for line in lines if "failed; its leases are live" in line[1]]
        assert began == [(logging.WARNING, f"settle_runs (run {run.run_id}'s complete) failed; "
                          "its leases are live, retrying in 0.05 s")]
        # Tries at 0, 0.05, 0.15, 0.35, 0.75, 1.55 s, each but the last retried; the next would
        # pass the deadline: given up. The repeats after the first line are one line, when it
        # ends, before the line that gives up.
        assert len(retries) >= 2
        repeats = [line for line in lines if "still failing" in line[1]]
        assert len(repeats) == 1
        assert repeats[0][0] == logging.WARNING
        assert f"still failing: {len(retries) - 1} more time" in repeats[0][1]
        ending = f"run {run.run_id}: giving up its complete"
        gave_up = [n for n, (level, text) in enumerate(lines)
                   if level == logging.ERROR and ending in text]
        assert len(gave_up) == 1
        assert lines.index(repeats[0]) < gave_up[0]

    async def test_a_stopped_loop_leaves_no_run_waiting(self, database_dsn, lm):
        [run] = await claim(lm, 1)
        closed = await asyncpg.create_pool(database_dsn, min_size=0, max_size=1)
        await closed.close()
        batcher = CompletionBatcher(LeaseManager(closed), WORKER)
        answer = batcher.submit(active(run), {})  # deadline 60 s away: retried until then
        async with running(batcher):
            await asyncio.sleep(0.2)
        with pytest.raises(RuntimeError, match="stopped before answering"):
            await answer


class TestMixedOutcomes:
    async def test_a_mixed_batch_of_outcomes_takes_one_settle_runs_call(self, pool, lm):
        done, retried, failed, cancelled, handed = await claim(lm, 5)
        calls = CountingCalls(lm)
        batcher = CompletionBatcher(lm, WORKER)
        policy = RetryPolicy(base_seconds=60, max_seconds=60)
        answers = [
            batcher.submit(active(done), {"ok": 1}),
            batcher.submit_outcome(active(retried), SettleKind.RETRY, policy=policy,
                                   error={"type": "ValueError", "message": "again"}),
            batcher.submit_outcome(active(failed), SettleKind.FAIL,
                                   error={"type": "ValueError", "message": "never"}),
            batcher.submit_outcome(active(cancelled), SettleKind.CANCEL),
            batcher.submit_outcome(active(handed), SettleKind.HAND_BACK)]
        async with running(batcher):
            results = await asyncio.gather(*answers)
        assert results == [True, SettleOutcome.RETRY_SCHEDULED, SettleOutcome.FAILED,
                           SettleOutcome.CANCELLED, SettleOutcome.HANDED_BACK]
        assert calls.kinds == [["complete", "retry", "fail", "cancel", "hand_back"]]
        statuses = [(await lease_row(pool, run))["status"]
                    for run in (done, retried, failed, cancelled, handed)]
        assert statuses == ["completed", "pending", "failed", "cancelled", "pending"]
        # The retry took the policy given: due about a minute later (by the database's clock).
        due = await pool.fetchval(
            "SELECT extract(epoch FROM r.run_after - clock_timestamp()) FROM zeroth.runs r "
            "WHERE r.run_id = $1", retried.run_id)
        assert due > 25  # equal jitter: at least half the 60 s

    async def test_retries_of_differing_policies_go_out_in_separate_calls(self, lm):
        done, slow, fast, registered = await claim(lm, 4)
        calls = CountingCalls(lm)
        batcher = CompletionBatcher(lm, WORKER)
        error = {"type": "ValueError", "message": "again"}
        answers = [
            batcher.submit(active(done), {}),
            batcher.submit_outcome(active(slow), SettleKind.RETRY, error=error,
                                   policy=RetryPolicy(base_seconds=60, max_seconds=60)),
            batcher.submit_outcome(active(fast), SettleKind.RETRY, error=error,
                                   policy=RetryPolicy(base_seconds=0, max_seconds=0)),
            batcher.submit_outcome(active(registered), SettleKind.RETRY, error=error)]
        async with running(batcher):
            results = await asyncio.gather(*answers)
        assert results == [True] + [SettleOutcome.RETRY_SCHEDULED] * 3
        # One call per policy; the completion rides with the first of them.
        assert calls.kinds == [["complete", "retry"], ["retry"], ["retry"]]

    async def test_a_fenced_out_outcome_answers_none_and_the_others_settle(self, lm):
        kept, cleared = await claim(lm, 2)
        assert await lm.clear_lease(cleared.run_id)
        calls = CountingCalls(lm)
        batcher = CompletionBatcher(lm, WORKER)
        answers = [batcher.submit_outcome(active(kept), SettleKind.CANCEL),
                   batcher.submit_outcome(active(cleared), SettleKind.FAIL, error={})]
        async with running(batcher):
            assert await asyncio.gather(*answers) == [SettleOutcome.CANCELLED, None]
        assert calls.sizes == [2]


class _EntryWithABrokenScope:
    """A run entry whose scope cannot be read: grouping its batch raises (a bug's stand-in)."""

    claims_next = False
    outcome_unknown = False

    def __init__(self, run: Any) -> None:
        self.run, self.deadline = run, time.monotonic() + 60

    @property
    def scope(self) -> Any:
        raise RuntimeError("this entry's scope is broken")


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_a_batch_that_raises_ends_the_loop_with_its_error_and_answers_its_runs(
        lm, in_flight):
    # The worker supervises the completion loop: an error it cannot answer must end the loop
    # where the supervisor sees it, also when the batch's call ran in a task of its own.
    [run] = await claim(lm, 1)
    batcher = CompletionBatcher(lm, WORKER, max_in_flight=in_flight)
    answer = batcher.submit(_EntryWithABrokenScope(run), {})  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="scope is broken"):
        await asyncio.wait_for(batcher.run(), timeout=10)
    with pytest.raises(RuntimeError, match="stopped before answering"):
        await answer
