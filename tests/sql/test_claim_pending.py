"""zeroth.claim_pending: order, lease columns, generations, run_after, batches, max_concurrency,
argument checks, and the recovery checkpoint of a handed-back run."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, T0, WORKER, at, claim, enqueue, make_run, run_row

COLUMNS = """run_id, lease_generation, lease_expires_at, status, attempts, max_attempts, priority,
             thread_id, idempotency_key, payload, metadata, recovery_checkpoint_id,
             checkpoint_data, cancel_requested, active_count, concurrency_saturated,
             concurrency_limit"""


async def claim_rows(conn: asyncpg.Connection, *, deployment_ref: str = DEPLOYMENT,
                     worker_id: str | None = WORKER, tenant_id: str | None = None,
                     workspace_id: str | None = None, max_concurrency: int | None = None,
                     batch_size: int | None = 1, lease_seconds: float | None = LEASE,
                     now: Any = T0) -> list[asyncpg.Record]:
    """Every row claim_pending returns, the run_id-NULL marker included."""
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""SELECT {COLUMNS} FROM zeroth_test.claim_pending(deployment_ref => $1, worker_id => $2,
               tenant_id => $3, workspace_id => $4, max_concurrency => $5, batch_size => $6,
               lease_seconds => $7, now_override => $8)""",
        deployment_ref, worker_id, tenant_id, workspace_id, max_concurrency, batch_size,
        lease_seconds, now)


async def snapshot(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    tables = {
        "runs": "SELECT * FROM zeroth.runs r ORDER BY r.tenant_id, r.workspace_key, r.run_id",
        "slots": """SELECT * FROM zeroth.admission_slots s
                     ORDER BY s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no""",
        "checkpoints": "SELECT * FROM zeroth.checkpoints k ORDER BY k.checkpoint_id",
    }
    return {name: [dict(row) for row in await conn.fetch(sql)] for name, sql in tables.items()}


async def start(conn: asyncpg.Connection, run_id: Any, worker_id: str, generation: int,
                now: Any = T0) -> bool:
    return await conn.fetchval(  # type: ignore[no-any-return]
        """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", run_id, worker_id, generation, now)


async def complete(conn: asyncpg.Connection, run_id: Any, worker_id: str, generation: int,
                   now: Any = T0) -> bool:
    return await conn.fetchval(  # type: ignore[no-any-return]
        """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)""", run_id, worker_id, generation, now)


def assert_marker(rows: list[asyncpg.Record], *, saturated: bool, active_count: int,
                  limit: int | None) -> None:
    assert len(rows) == 1
    marker = rows[0]
    assert marker["run_id"] is None
    assert marker["concurrency_saturated"] is saturated
    assert marker["active_count"] == active_count
    assert marker["concurrency_limit"] == limit
    assert marker["lease_generation"] is None
    assert marker["status"] is None


class TestEmptyQueue:
    async def test_empty_queue_returns_one_unsaturated_marker_row(self, conn):
        assert_marker(await claim_rows(conn), saturated=False, active_count=0, limit=None)

    async def test_empty_queue_under_max_concurrency_reports_the_limit(self, conn):
        rows = await claim_rows(conn, max_concurrency=4)
        assert_marker(rows, saturated=False, active_count=0, limit=4)

    async def test_a_claimed_queue_is_empty_for_the_next_claimer(self, conn):
        lease = await make_run(conn, "claimed")
        rows = await claim_rows(conn, worker_id="worker-b", now=at(1))
        assert_marker(rows, saturated=False, active_count=0, limit=None)
        assert (await run_row(conn, lease.run_id))["lease_worker_id"] == WORKER


class TestOrder:
    async def _four_runs(self, conn: asyncpg.Connection) -> dict[str, Any]:
        return {
            "a": await enqueue(conn, now=T0),  # priority 0, run_after T0, created T0
            "b": await enqueue(conn, now=at(1), run_after=T0),  # same, created later
            "c": await enqueue(conn, now=at(2), run_after=at(-10)),  # earlier run_after
            "d": await enqueue(conn, now=at(3), priority=5),  # highest priority, newest
        }

    async def test_batch_claims_priority_desc_then_run_after_then_created_at(self, conn):
        runs = await self._four_runs(conn)
        rows = await claim(conn, batch_size=4, now=at(10))
        assert [row["run_id"] for row in rows] == [runs[k] for k in "dcab"]

    async def test_single_claims_follow_the_same_order(self, conn):
        runs = await self._four_runs(conn)
        claimed = []
        for _ in range(4):
            rows = await claim(conn, now=at(10))
            assert len(rows) == 1
            claimed.append(rows[0]["run_id"])
        assert claimed == [runs[k] for k in "dcab"]
        assert await claim(conn, now=at(10)) == []

    async def test_negative_priority_comes_after_default_priority(self, conn):
        low = await enqueue(conn, priority=-1, run_after=at(-100))
        normal = await enqueue(conn, now=at(1))
        rows = await claim(conn, batch_size=2, now=at(2))
        assert [row["run_id"] for row in rows] == [normal, low]


class TestLeaseColumns:
    async def test_claim_sets_lease_and_keeps_status_pending(self, conn):
        run_id = await enqueue(conn, priority=2, max_attempts=4, thread_id="t-1",
                               idempotency_key="idem", payload={"p": 1}, metadata={"m": 2})
        rows = await claim_rows(conn, now=at(5), lease_seconds=30)
        assert len(rows) == 1
        claimed = rows[0]
        assert claimed["run_id"] == run_id
        assert claimed["lease_generation"] == 1
        assert claimed["lease_expires_at"] == at(35)
        assert claimed["status"] == "pending"
        assert (claimed["attempts"], claimed["max_attempts"], claimed["priority"]) == (0, 4, 2)
        assert (claimed["thread_id"], claimed["idempotency_key"]) == ("t-1", "idem")
        assert json.loads(claimed["payload"]) == {"p": 1}
        assert json.loads(claimed["metadata"]) == {"m": 2}
        assert claimed["recovery_checkpoint_id"] is None
        assert claimed["checkpoint_data"] is None
        assert claimed["cancel_requested"] is False
        assert claimed["active_count"] == 0
        assert claimed["concurrency_saturated"] is False
        assert claimed["concurrency_limit"] is None

        row = await run_row(conn, run_id)
        assert row["status"] == "pending"
        assert row["lease_worker_id"] == WORKER
        assert row["lease_acquired_at"] == at(5)
        assert row["lease_expires_at"] == at(35)
        assert row["lease_generation"] == 1
        assert row["admission_slot"] is None
        assert row["updated_at"] == at(5)
        assert row["attempts"] == 0
        assert row["started_at"] is None

    async def test_fractional_lease_seconds_are_kept(self, conn):
        await enqueue(conn)
        rows = await claim(conn, lease_seconds=0.25)
        assert rows[0]["lease_expires_at"] == T0 + timedelta(milliseconds=250)

    async def test_lease_of_one_day_is_accepted(self, conn):
        await enqueue(conn)
        rows = await claim(conn, lease_seconds=86400)
        assert rows[0]["lease_expires_at"] == at(86400)


class TestGenerations:
    async def test_generation_goes_0_to_1_and_up_by_one_per_reclaim_after_expiry(self, conn):
        run_id = await enqueue(conn)
        assert (await run_row(conn, run_id))["lease_generation"] == 0
        generations = []
        for i, worker in enumerate(["w-1", "w-2", "w-1"]):
            rows = await claim(conn, worker_id=worker, now=at(i * 61))
            assert [row["run_id"] for row in rows] == [run_id]
            generations.append(rows[0]["lease_generation"])
            row = await run_row(conn, run_id)
            assert (row["lease_worker_id"], row["lease_generation"]) == (worker, generations[-1])
        assert generations == [1, 2, 3]

    async def test_live_lease_is_not_claimable_up_to_and_including_its_expiry(self, conn):
        lease = await make_run(conn, "claimed")
        before = await snapshot(conn)
        for now in (at(1), at(59), at(60)):
            assert await claim(conn, worker_id="worker-b", now=now) == []
        assert await snapshot(conn) == before
        rows = await claim(conn, worker_id="worker-b", now=at(60) + timedelta(microseconds=1))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]

    async def test_same_worker_reclaiming_after_expiry_gets_a_new_generation(self, conn):
        lease = await make_run(conn, "claimed")
        rows = await claim(conn, worker_id=lease.worker_id, now=at(61))
        assert rows[0]["lease_generation"] == lease.generation + 1
        stale_start = await start(conn, lease.run_id, lease.worker_id, lease.generation, at(62))
        assert stale_start is False

    async def test_released_pending_run_is_claimable_at_once_with_a_new_generation(self, conn):
        lease = await make_run(conn, "claimed")
        assert await conn.fetchval(
            """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, lease.worker_id, lease.generation, at(1))
        rows = await claim(conn, worker_id="worker-b", now=at(1))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]


CLAIM_AND_START = """SELECT run_id, attempts FROM zeroth_test.claim_and_start(
    deployment_ref => $1, worker_id => $2, lease_seconds => $3, now_override => $4)
    WHERE run_id IS NOT NULL"""


class TestLapsedClaimsCountAttempts:
    """A claim that lapses before start_run spent an attempt (its worker died before it could
    start the run): the next claim counts it, and with none left the run is dead-lettered, so
    a payload that kills two-step workers (claim_pending, then start_run) cannot loop for
    ever, nor hold up the runs behind it."""

    async def test_a_reclaim_after_a_lapsed_claim_counts_its_attempt(self, conn):
        run_id = await enqueue(conn, max_attempts=3)
        await claim(conn, lease_seconds=10, now=at(0))

        (row,) = await claim(conn, worker_id="worker-b", now=at(11))

        assert (row["run_id"], row["lease_generation"], row["attempts"]) == (run_id, 2, 1)
        assert await start(conn, run_id, "worker-b", 2, at(12))
        assert (await run_row(conn, run_id))["attempts"] == 2

    async def test_claim_and_start_counts_the_lapsed_claim_and_its_own_start(self, conn):
        run_id = await enqueue(conn, max_attempts=3)
        await claim(conn, lease_seconds=10, now=at(0))

        rows = await conn.fetch(CLAIM_AND_START, DEPLOYMENT, "worker-b", LEASE, at(11))

        assert [(r["run_id"], r["attempts"]) for r in rows] == [(run_id, 2)]

    async def test_a_released_claim_is_not_counted(self, conn):
        lease = await make_run(conn, "claimed", max_attempts=2)
        assert await conn.fetchval(
            """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, lease.worker_id, lease.generation, at(1))

        (row,) = await claim(conn, worker_id="worker-b", now=at(2))

        assert row["attempts"] == 0

    async def test_a_poison_run_whose_claims_all_lapse_is_dead_lettered_and_blocks_nothing(
            self, conn):
        # Twelve short claims in a row, none started: first in claim order each time, until its
        # attempts are spent.
        poison = await enqueue(conn, max_attempts=2, priority=10, payload={"poison": True})
        other = await enqueue(conn)
        seen = []
        for i in range(12):
            rows = await claim(conn, worker_id=f"w-{i}", lease_seconds=0.2, now=at(i))
            seen.append(rows[0]["run_id"] if rows else None)
            if rows and rows[0]["run_id"] == other:
                break

        assert seen == [poison, poison, other]
        row = await run_row(conn, poison)
        assert (row["status"], row["attempts"], row["lease_worker_id"]) == ("failed", 2, None)
        assert row["dead_lettered_at"] == at(2)
        assert json.loads(row["error"])["stop_reason"] == "attempts_exhausted"
        assert row["lease_generation"] == 2  # no claim after the last one
        history = await conn.fetch(
            """SELECT attempt, outcome FROM zeroth.attempt_history WHERE run_id = $1
                ORDER BY lease_generation""", poison)
        assert [tuple(h) for h in history] == [(1, "expired"), (2, "dead_lettered")]

    async def test_a_batch_claim_fills_its_batch_past_a_spent_run(self, conn):
        poison = await enqueue(conn, max_attempts=1, priority=10)
        await claim(conn, lease_seconds=1, now=at(0))
        others = [await enqueue(conn, now=at(0.5)) for _ in range(2)]

        rows = await claim(conn, worker_id="worker-b", batch_size=2, now=at(2))

        assert sorted(r["run_id"] for r in rows) == sorted(others)
        assert (await run_row(conn, poison))["status"] == "failed"

    async def test_a_spent_run_is_dead_lettered_under_max_concurrency_and_frees_its_slot(
            self, conn):
        poison = await enqueue(conn, max_attempts=1, priority=10)
        await claim(conn, lease_seconds=1, max_concurrency=1, now=at(0))
        other = await enqueue(conn, now=at(0.5))

        rows = await claim(conn, worker_id="worker-b", max_concurrency=1, now=at(2))

        assert [(r["run_id"], r["active_count"]) for r in rows] == [(other, 0)]
        assert (await run_row(conn, poison))["status"] == "failed"
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.admission_slots WHERE run_id = $1", poison) == 0


class TestRunAfter:
    async def test_future_run_is_not_claimed_until_due(self, conn):
        run_id = await enqueue(conn, run_after=at(100))
        assert await claim(conn, now=at(99)) == []
        assert (await run_row(conn, run_id))["lease_generation"] == 0
        rows = await claim(conn, now=at(100))
        assert [row["run_id"] for row in rows] == [run_id]

    async def test_due_run_is_claimed_before_a_higher_priority_future_run(self, conn):
        await enqueue(conn, priority=100, run_after=at(50))
        due = await enqueue(conn)
        rows = await claim(conn, batch_size=10, now=at(10))
        assert [row["run_id"] for row in rows] == [due]


class TestBatchSize:
    async def test_batch_claims_up_to_n_distinct_runs(self, conn):
        run_ids = {await enqueue(conn, now=at(i)) for i in range(5)}
        first = await claim(conn, batch_size=3, now=at(10))
        second = await claim(conn, batch_size=3, now=at(10))
        assert len(first) == 3
        assert len(second) == 2
        claimed = [row["run_id"] for row in first + second]
        assert set(claimed) == run_ids
        assert len(set(claimed)) == 5
        assert all(row["lease_generation"] == 1 for row in first + second)
        assert await claim(conn, batch_size=3, now=at(10)) == []

    async def test_batch_of_1000_is_accepted(self, conn):
        await enqueue(conn)
        assert len(await claim(conn, batch_size=1000)) == 1


class TestMaxConcurrency:
    async def test_claims_stop_at_the_limit_and_report_saturation(self, conn):
        for i in range(3):
            await enqueue(conn, now=at(i))
        rows = await claim_rows(conn, max_concurrency=2, batch_size=5, now=at(10))
        assert len(rows) == 2
        assert all(row["run_id"] is not None for row in rows)
        assert {row["concurrency_limit"] for row in rows} == {2}
        assert {row["concurrency_saturated"] for row in rows} == {False}
        assert {row["active_count"] for row in rows} == {0}  # live leases seen before this claim

        saturated = await claim_rows(conn, worker_id="worker-b", max_concurrency=2, now=at(11))
        assert_marker(saturated, saturated=True, active_count=2, limit=2)

    async def test_saturated_claim_changes_nothing(self, conn):
        await make_run(conn, "claimed", max_concurrency=1)
        await enqueue(conn, now=at(1))
        before = await snapshot(conn)
        rows = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(2))
        assert_marker(rows, saturated=True, active_count=1, limit=1)
        assert await snapshot(conn) == before

    async def test_claim_records_its_admission_slot(self, conn):
        lease = await make_run(conn, "claimed", max_concurrency=3)
        row = await run_row(conn, lease.run_id)
        slot = await conn.fetchrow(
            """SELECT * FROM zeroth.admission_slots s
                WHERE s.tenant_id = 'default' AND s.workspace_key = '' AND s.deployment_ref = $1
                  AND s.slot_no = $2""", DEPLOYMENT, row["admission_slot"])
        assert row["admission_slot"] is not None
        # The slot names the lease; holder and expiry live on the run row only.
        assert dict(slot) == {"tenant_id": "default", "workspace_key": "",
                              "deployment_ref": DEPLOYMENT, "slot_no": row["admission_slot"],
                              "run_id": lease.run_id, "lease_generation": 1}
        assert (row["lease_worker_id"], row["lease_expires_at"]) == (WORKER, at(60))

    async def test_a_dba_who_expires_a_lease_by_hand_frees_its_slot_at_once(self, conn):
        # The slot only names the lease; the run row is the truth: a manual UPDATE of the run (a
        # DBA unsticking it) frees the slot at once, not at the end of the old lease.
        held = await make_run(conn, "running", max_concurrency=1)
        waiting = await enqueue(conn, now=at(1))
        await conn.execute(
            "UPDATE zeroth.runs SET lease_expires_at = $2 WHERE run_id = $1", held.run_id, at(2))

        rows = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(3))

        assert [r["run_id"] for r in rows] == [waiting]
        assert rows[0]["active_count"] == 0

    async def test_a_limit_without_a_tenant_binds_the_default_scope_only(self, conn):
        # A decision: upstream refuses max_concurrency without an explicit scope
        # because its API could not tell "not passed" from None. Here tenant NULL always means
        # the 'default' tenant and workspace NULL the null workspace, so a limit without them
        # is exactly that scope's limit, and nobody else's (sql/README.md).
        await make_run(conn, "running", max_concurrency=1)
        other = await make_run(conn, "pending", tenant_id="acme")
        await enqueue(conn, now=at(1))

        assert_marker(await claim_rows(conn, worker_id="w-b", max_concurrency=1, now=at(2)),
                      saturated=True, active_count=1, limit=1)
        theirs = await claim_rows(conn, worker_id="w-b", tenant_id="acme", max_concurrency=1,
                                  now=at(2))
        assert [r["run_id"] for r in theirs] == [other.run_id]

    async def test_claims_without_max_concurrency_hold_no_slot_and_are_not_counted(self, conn):
        unbounded = await make_run(conn, "claimed")
        assert (await run_row(conn, unbounded.run_id))["admission_slot"] is None
        await enqueue(conn, now=at(1))
        rows = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(2))
        assert rows[0]["run_id"] is not None
        assert rows[0]["active_count"] == 0

    async def test_completing_a_run_frees_its_slot_for_the_next_claim(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        waiting_run = await enqueue(conn, now=at(1))
        assert_marker(await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(2)),
                      saturated=True, active_count=1, limit=1)
        assert await complete(conn, lease.run_id, lease.worker_id, lease.generation, at(3))
        rows = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(4))
        assert [row["run_id"] for row in rows] == [waiting_run]
        assert rows[0]["active_count"] == 0

    async def test_an_expired_lease_no_longer_counts_against_the_limit(self, conn):
        first = await make_run(conn, "claimed", max_concurrency=1)
        await enqueue(conn, now=at(1))
        assert_marker(await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(60)),
                      saturated=True, active_count=1, limit=1)
        # Both runs are claimable once the first lease lapsed; the one slot bounds the claim to
        # one, and the first run comes first (earlier run_after).
        rows = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, batch_size=2,
                                now=at(61))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(first.run_id, 2)]
        assert rows[0]["active_count"] == 0

    async def test_a_smaller_limit_counts_leases_taken_under_a_larger_one(self, conn):
        for i in range(4):
            await enqueue(conn, now=at(i))
        assert len(await claim(conn, max_concurrency=3, batch_size=3, now=at(10))) == 3
        smaller = await claim_rows(conn, worker_id="worker-b", max_concurrency=1, now=at(11))
        assert_marker(smaller, saturated=True, active_count=3, limit=1)
        larger = await claim_rows(conn, worker_id="worker-b", max_concurrency=4, batch_size=5,
                                  now=at(11))
        assert len(larger) == 1
        assert larger[0]["run_id"] is not None
        assert larger[0]["active_count"] == 3
        assert_marker(await claim_rows(conn, worker_id="worker-c", max_concurrency=4, now=at(12)),
                      saturated=True, active_count=4, limit=4)

    async def test_limits_are_per_deployment(self, conn):
        await make_run(conn, "claimed", max_concurrency=1)
        other = await enqueue(conn, deployment_ref="deploy-b")
        rows = await claim_rows(conn, deployment_ref="deploy-b", max_concurrency=1)
        assert [row["run_id"] for row in rows] == [other]


class TestDatabaseClock:
    """Seed §9.5 (fast worker clock): a worker never supplies its clock. claim_pending takes no
    time at all; admission counts live leases by database time. (The test databases move that
    clock through zeroth_test, which a shipped database does not have: tests/adversarial.)"""

    async def test_claim_pending_takes_no_time_argument(self, conn):
        names = await conn.fetchval(
            """SELECT p.proargnames FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'zeroth' AND p.proname = 'claim_pending'""")
        assert names == ["deployment_ref", "worker_id", "tenant_id", "workspace_id",
                         "max_concurrency", "batch_size", "lease_seconds", "code_version"]

    async def test_admission_counts_live_leases_by_database_time(self, conn):
        await enqueue(conn, now=None)
        await enqueue(conn, now=None)
        db_before = await conn.fetchval("SELECT clock_timestamp()")
        first = await claim_rows(conn, max_concurrency=1, now=None)
        db_after = await conn.fetchval("SELECT clock_timestamp()")
        assert first[0]["run_id"] is not None
        expires = first[0]["lease_expires_at"]
        lease = timedelta(seconds=LEASE)
        assert db_before + lease <= expires <= db_after + lease

        second = await claim_rows(conn, worker_id="fast-clock-worker", max_concurrency=1, now=None)
        assert_marker(second, saturated=True, active_count=1, limit=1)
        assert await conn.fetchval(
            "SELECT zeroth.renew_lease(run_id => $1, worker_id => $2, generation => 1)",
            first[0]["run_id"], WORKER)
        live = await conn.fetchval(
            """SELECT count(*) FROM zeroth.runs r
                WHERE r.lease_worker_id IS NOT NULL AND r.lease_expires_at >= clock_timestamp()""")
        assert live == 1

    async def test_now_override_a_day_ahead_sees_every_lease_as_expired(self, conn):
        # The test clock replaces database time entirely, so a claim one day ahead finds the slot
        # free (the expired lease is retired from its slot first).
        first = await make_run(conn, "claimed", max_concurrency=1)
        await enqueue(conn, now=at(1))
        rows = await claim_rows(conn, worker_id="fast", max_concurrency=1, batch_size=2,
                                now=at(86400))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(first.run_id, 2)]
        assert rows[0]["active_count"] == 0
        assert (await run_row(conn, first.run_id))["lease_worker_id"] == "fast"


class TestRejectedArguments:
    @pytest.mark.parametrize(
        "kwargs",
        [
            pytest.param({"batch_size": 0}, id="batch-size-0"),
            pytest.param({"batch_size": 1001}, id="batch-size-1001"),
            pytest.param({"batch_size": None}, id="batch-size-null"),
            pytest.param({"max_concurrency": 0}, id="max-concurrency-0"),
            pytest.param({"max_concurrency": -1}, id="max-concurrency-negative"),
            pytest.param({"lease_seconds": 0}, id="lease-0"),
            pytest.param({"lease_seconds": -1}, id="lease-negative"),
            pytest.param({"lease_seconds": float("nan")}, id="lease-nan"),
            pytest.param({"lease_seconds": float("inf")}, id="lease-infinite"),
            pytest.param({"lease_seconds": 86401}, id="lease-over-a-day"),
            # lease_seconds NULL is no bad argument since migration 0020: the deployment's
            # registered lease, else 60 s (tests/sql/test_deployments.py).
            pytest.param({"worker_id": ""}, id="empty-worker"),
            pytest.param({"worker_id": None}, id="null-worker"),
            pytest.param({"worker_id": "w" * 201}, id="201-char-worker"),
            pytest.param({"deployment_ref": ""}, id="empty-deployment"),
        ])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, kwargs):
        await make_run(conn, "claimed", max_concurrency=2)
        await enqueue(conn, now=at(1))
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim_rows(conn, now=at(2), **kwargs)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before

    async def test_max_concurrency_with_workspace_but_no_tenant_raises_zp006(self, conn):
        await make_run(conn, "pending", tenant_id="t1", workspace_id="w1")
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim_rows(conn, workspace_id="w1", max_concurrency=1)
        assert caught.value.sqlstate == "ZP006"
        assert await snapshot(conn) == before


class TestNeverClaimed:
    @pytest.mark.parametrize("status", ["running", "waiting", "completed", "failed", "cancelled"])
    async def test_non_pending_run_is_never_claimed_even_after_every_lease_expired(
            self, conn, status):
        await make_run(conn, status)
        before = await snapshot(conn)
        rows = await claim_rows(conn, worker_id="worker-b", batch_size=10, now=at(3600))
        assert_marker(rows, saturated=False, active_count=0, limit=None)
        assert await snapshot(conn) == before

    async def test_runs_of_other_deployments_are_never_claimed(self, conn):
        await enqueue(conn, deployment_ref="deploy-b")
        await enqueue(conn, deployment_ref=DEPLOYMENT + "-suffix")
        before = await snapshot(conn)
        assert await claim(conn, batch_size=10, now=at(1)) == []
        assert await snapshot(conn) == before


class TestRecoveryCheckpoint:
    async def test_handed_back_run_returns_its_latest_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        checkpoint_ids = []
        for step in (1, 2):
            checkpoint_ids.append(await conn.fetchval(
                """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                       generation => $3,
                       data => $4::text::jsonb, now_override => $5)""",
                lease.run_id, lease.worker_id, lease.generation, json.dumps({"step": step}), at(1)))
        assert await conn.fetchval(
            """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3,
                   now_override => $4)""", lease.run_id, lease.worker_id, lease.generation, at(2))

        rows = await claim_rows(conn, worker_id="worker-b", now=at(3))
        assert rows[0]["run_id"] == lease.run_id
        assert rows[0]["lease_generation"] == 2
        assert rows[0]["recovery_checkpoint_id"] == checkpoint_ids[1]
        assert json.loads(rows[0]["checkpoint_data"]) == {"step": 2}
        assert (await run_row(conn, lease.run_id))["recovery_checkpoint_id"] == checkpoint_ids[1]
        assert await conn.fetchval(
            "SELECT zeroth.get_recovery_checkpoint_id(run_id => $1)", lease.run_id
        ) == checkpoint_ids[1]

    async def test_run_without_checkpoints_has_no_recovery_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(
            """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3,
                   now_override => $4)""", lease.run_id, lease.worker_id, lease.generation, at(1))
        rows = await claim_rows(conn, worker_id="worker-b", now=at(2))
        assert rows[0]["run_id"] == lease.run_id
        assert rows[0]["recovery_checkpoint_id"] is None
        assert rows[0]["checkpoint_data"] is None
