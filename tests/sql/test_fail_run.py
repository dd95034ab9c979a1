"""zeroth.fail_run: running → pending with backoff (retryable, attempts left), → failed
(not retryable) or → failed and dead-lettered (retries exhausted), for the live lease holder."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, claim, enqueue, make_run, run_row

SOON = at(1)
MICROSECOND = timedelta(microseconds=1)

FAIL = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
              error => $4::text::jsonb, retryable => $5, retry_base_seconds => $6,
              retry_max_seconds => $7, now_override => $8)"""


async def fail(conn: asyncpg.Connection, run_id: UUID | None, *, error: Any = None,
               retryable: bool | None = True, base: float | None = 10.0,
               cap: float | None = 300.0, worker_id: str | None = WORKER,
               generation: int | None = 1, now: datetime = SOON) -> str | None:
    text = None if error is None else json.dumps(error)
    return await conn.fetchval(  # type: ignore[no-any-return]
        FAIL, run_id, worker_id, generation, text, retryable, base, cap, now)


async def start(conn: asyncpg.Connection, run_id: UUID, generation: int, now: datetime,
                worker_id: str = WORKER) -> None:
    assert await conn.fetchval(
        """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", run_id, worker_id, generation, now)


async def slots(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        """SELECT s.slot_no, s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
             FROM zeroth_test.slot_leases s WHERE s.deployment_ref = $1 ORDER BY s.slot_no""",
        DEPLOYMENT)
    return [tuple(row) for row in rows]


def assert_lease_cleared(row: asyncpg.Record) -> None:
    assert [row[c] for c in ("lease_worker_id", "lease_acquired_at", "lease_expires_at",
                             "admission_slot", "recovery_checkpoint_id")] == [None] * 5


def assert_delay_within(row: asyncpg.Record, now: datetime, nominal: float) -> None:
    """run_after - now lies in [nominal / 2, nominal] (equal jitter), to the microsecond."""
    delay = row["run_after"] - now
    assert timedelta(seconds=nominal / 2) - MICROSECOND <= delay
    assert delay <= timedelta(seconds=nominal) + MICROSECOND


class TestRetry:
    async def test_retryable_failure_schedules_a_retry_with_backoff(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        outcome = await fail(conn, lease.run_id, error={"reason": "flaky"}, base=10, now=at(5))

        assert outcome == "retry_scheduled"
        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert_delay_within(row, at(5), 10)
        assert_lease_cleared(row)
        assert row["attempts"] == before["attempts"] == 1
        assert row["lease_generation"] == before["lease_generation"]
        assert json.loads(row["error"]) == {"reason": "flaky"}
        assert (row["finished_at"], row["dead_lettered_at"]) == (None, None)
        assert row["updated_at"] == at(5)

    async def test_backoff_of_every_retry_lies_within_the_jitter_band(self, conn):
        # Many runs, so the random jitter is exercised; each delay must lie in [0.5, 1] * base.
        leases = [await make_run(conn, "running", deployment_ref=f"d-{n}") for n in range(20)]

        for lease in leases:
            assert await fail(conn, lease.run_id, base=8, now=at(2)) == "retry_scheduled"

        delays = set()
        for lease in leases:
            row = await run_row(conn, lease.run_id)
            assert_delay_within(row, at(2), 8)
            delays.add(row["run_after"])
        assert len(delays) > 1, "the jitter should spread the retries"

    async def test_backoff_doubles_with_each_attempt(self, conn):
        lease = await make_run(conn, "running", max_attempts=5)
        now = at(1)
        generation = lease.generation
        for attempt in (1, 2, 3):
            assert await fail(conn, lease.run_id, base=10, generation=generation,
                              now=now) == "retry_scheduled"
            row = await run_row(conn, lease.run_id)
            assert row["attempts"] == attempt
            assert_delay_within(row, now, 10 * 2 ** (attempt - 1))
            now = row["run_after"]
            claimed = await claim(conn, now=now)
            assert [r["run_id"] for r in claimed] == [lease.run_id]
            generation = claimed[0]["lease_generation"]
            await start(conn, lease.run_id, generation, now)

    async def test_backoff_is_capped_by_retry_max_seconds(self, conn):
        lease = await make_run(conn, "running", max_attempts=10)
        now = at(1)
        generation = lease.generation
        # Drive to attempt 4, where base * 2^3 = 80 exceeds the cap of 15.
        for _ in range(3):
            assert await fail(conn, lease.run_id, base=10, cap=15, generation=generation,
                              now=now) == "retry_scheduled"
            now = (await run_row(conn, lease.run_id))["run_after"]
            claimed = await claim(conn, now=now)
            generation = claimed[0]["lease_generation"]
            await start(conn, lease.run_id, generation, now)
        assert (await run_row(conn, lease.run_id))["attempts"] == 4

        assert await fail(conn, lease.run_id, base=10, cap=15, generation=generation,
                          now=now) == "retry_scheduled"

        assert_delay_within(await run_row(conn, lease.run_id), now, 15)

    async def test_zero_base_makes_the_retry_claimable_at_once(self, conn):
        lease = await make_run(conn, "running")

        assert await fail(conn, lease.run_id, base=0, cap=0, now=at(3)) == "retry_scheduled"

        assert (await run_row(conn, lease.run_id))["run_after"] == at(3)
        assert [r["run_id"] for r in await claim(conn, now=at(3))] == [lease.run_id]

    async def test_retried_run_is_claimable_only_once_run_after_has_passed(self, conn):
        lease = await make_run(conn, "running")
        assert await fail(conn, lease.run_id, base=10, now=at(5)) == "retry_scheduled"
        run_after = (await run_row(conn, lease.run_id))["run_after"]

        assert await claim(conn, now=run_after - MICROSECOND) == []
        claimed = await claim(conn, now=run_after)

        assert [(r["run_id"], r["lease_generation"], r["attempts"]) for r in claimed] == [
            (lease.run_id, 2, 1)]

    async def test_retry_frees_the_admission_slot(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        other = await enqueue(conn, priority=10)

        assert await fail(conn, lease.run_id, now=at(2)) == "retry_scheduled"

        assert await slots(conn) == [(1, None, None, None, None)]
        assert [r["run_id"] for r in await claim(conn, max_concurrency=1, now=at(2))] == [other]


class TestNotRetryable:
    async def test_non_retryable_failure_fails_the_run_without_dead_lettering(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        outcome = await fail(conn, lease.run_id, error={"reason": "bad input"},
                             retryable=False, now=at(7))

        assert outcome == "failed"
        row = await run_row(conn, lease.run_id)
        assert row["status"] == "failed"
        assert row["finished_at"] == at(7)
        assert row["dead_lettered_at"] is None
        assert row["run_after"] == before["run_after"]
        assert row["attempts"] == 1
        assert json.loads(row["error"]) == {"reason": "bad input"}
        assert_lease_cleared(row)
        assert await claim(conn, now=at(3600)) == []

    async def test_non_retryable_failure_frees_the_admission_slot(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)

        assert await fail(conn, lease.run_id, retryable=False) == "failed"

        assert await slots(conn) == [(1, None, None, None, None)]


class TestDeadLetter:
    async def test_third_failure_of_a_three_attempt_run_is_dead_lettered(self, conn):
        # The seed's dead-letter threshold was unreachable on the worker path; here it is reached.
        run_id = await enqueue(conn, max_attempts=3)
        now = at(0)
        outcomes = []
        for attempt in (1, 2, 3):
            claimed = await claim(conn, now=now)
            assert [r["run_id"] for r in claimed] == [run_id]
            generation = claimed[0]["lease_generation"]
            await start(conn, run_id, generation, now)
            assert (await run_row(conn, run_id))["attempts"] == attempt
            outcomes.append(await fail(conn, run_id, error={"attempt": attempt}, base=1,
                                       generation=generation, now=now))
            row = await run_row(conn, run_id)
            now = max(now, row["run_after"])

        assert outcomes == ["retry_scheduled", "retry_scheduled", "dead_lettered"]
        row = await run_row(conn, run_id)
        assert row["status"] == "failed"
        assert row["attempts"] == 3
        assert row["dead_lettered_at"] == row["finished_at"] is not None
        assert json.loads(row["error"]) == {"attempt": 3}
        assert_lease_cleared(row)
        assert await claim(conn, now=now + timedelta(days=1)) == []

    async def test_single_attempt_run_is_dead_lettered_on_first_retryable_failure(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)

        assert await fail(conn, lease.run_id, now=at(4)) == "dead_lettered"

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["dead_lettered_at"], row["finished_at"]) == (
            "failed", at(4), at(4))

    async def test_non_retryable_failure_of_the_last_attempt_is_not_dead_lettered(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)

        assert await fail(conn, lease.run_id, retryable=False, now=at(4)) == "failed"

        assert (await run_row(conn, lease.run_id))["dead_lettered_at"] is None


class TestBadArguments:
    @pytest.mark.parametrize(
        "kwargs",
        [
            pytest.param({"base": -1.0}, id="negative-base"),
            pytest.param({"base": 10.0, "cap": 5.0}, id="cap-below-base"),
            pytest.param({"base": 1.0, "cap": 86400.0 * 30 + 1}, id="cap-over-30-days"),
            pytest.param({"base": float("nan")}, id="nan-base"),
            pytest.param({"base": float("nan"), "cap": float("nan")}, id="nan-both"),
            pytest.param({"cap": float("inf")}, id="infinite-cap"),
            # NULL is the deployment's registered side, else 1 / 300 (migration 0020): a pair
            # that is bad against the fallback is still refused.
            pytest.param({"base": None, "cap": 0.5}, id="null-base-above-the-cap"),
            pytest.param({"base": 400.0, "cap": None}, id="base-above-the-null-cap"),
            pytest.param({"retryable": None}, id="null-retryable"),
        ],
    )
    async def test_bad_argument_raises_invalid_argument_and_changes_nothing(self, conn, kwargs):
        # The fence arguments: tests/sql/test_fenced_conformance.py.
        lease = await make_run(conn, "running", max_concurrency=1)
        before = await run_row(conn, lease.run_id)
        slots_before = await slots(conn)
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await fail(conn, lease.run_id, **kwargs)

        assert raised.value.sqlstate == "ZP008"
        assert await run_row(conn, lease.run_id) == before
        assert await slots(conn) == slots_before

    async def test_largest_allowed_cap_of_thirty_days_is_accepted(self, conn):
        lease = await make_run(conn, "running")

        assert await fail(conn, lease.run_id, base=0, cap=86400.0 * 30) == "retry_scheduled"
