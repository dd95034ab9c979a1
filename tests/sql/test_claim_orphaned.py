"""zeroth.claim_orphaned: takeover of running runs whose lease expired, with the latest checkpoint,
claim_limit, saturation reporting, and fencing of the displaced holder."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, T0, WORKER, Lease, at, enqueue, make_run, run_row

COLUMNS = """run_id, lease_generation, lease_expires_at, status, attempts, max_attempts, priority,
             thread_id, idempotency_key, payload, metadata, recovery_checkpoint_id,
             checkpoint_data, cancel_requested, active_count, concurrency_saturated,
             concurrency_limit"""
RESCUER = "worker-b"
AFTER_EXPIRY = at(120)  # factories lease until at(60); this is well past it
CHECKPOINT_AT = at(1)


async def claim_orphans(conn: asyncpg.Connection, *, worker_id: str = RESCUER,
                        deployment_ref: str = DEPLOYMENT, tenant_id: str | None = None,
                        workspace_id: str | None = None, max_concurrency: int | None = None,
                        claim_limit: int | None = None, lease_seconds: float | None = LEASE,
                        now: Any = AFTER_EXPIRY) -> list[asyncpg.Record]:
    """Every row claim_orphaned returns, the run_id-NULL marker included."""
    return await conn.fetch(  # type: ignore[no-any-return]
        f"""SELECT {COLUMNS} FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
               tenant_id => $3, workspace_id => $4, max_concurrency => $5, claim_limit => $6,
               lease_seconds => $7, now_override => $8)""",
        deployment_ref, worker_id, tenant_id, workspace_id, max_concurrency, claim_limit,
        lease_seconds, now)


def claimed_ids(rows: list[asyncpg.Record]) -> list[Any]:
    return [row["run_id"] for row in rows if row["run_id"] is not None]


async def snapshot(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    tables = {
        "runs": "SELECT * FROM zeroth.runs r ORDER BY r.tenant_id, r.workspace_key, r.run_id",
        "slots": """SELECT * FROM zeroth.admission_slots s
                     ORDER BY s.tenant_id, s.workspace_key, s.deployment_ref, s.slot_no""",
        "checkpoints": "SELECT * FROM zeroth.checkpoints k ORDER BY k.checkpoint_id",
    }
    return {name: [dict(row) for row in await conn.fetch(sql)] for name, sql in tables.items()}


async def save_checkpoint(conn: asyncpg.Connection, lease: Lease, data: dict[str, Any], *,
                          checkpoint_id: Any = None, now: Any = CHECKPOINT_AT) -> Any:
    return await conn.fetchval(
        """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2, generation => $3,
               data => $4::text::jsonb, checkpoint_id => $5, now_override => $6)""",
        lease.run_id, lease.worker_id, lease.generation, json.dumps(data), checkpoint_id, now)


class TestWhatIsAnOrphan:
    async def test_only_running_runs_with_expired_leases_are_claimed(self, conn):
        expired = await make_run(conn, "running")  # lease until at(60)
        waiting = await make_run(conn, "waiting")
        live = await make_run(conn, "running", now=at(100))  # lease until at(160)
        claimed_pending = await make_run(conn, "claimed")  # pending, lease lapsed at at(60)
        pending = await make_run(conn, "pending")
        completed = await make_run(conn, "completed")
        untouched = [waiting, live, claimed_pending, pending, completed]
        before = {lease.run_id: dict(await run_row(conn, lease.run_id)) for lease in untouched}

        rows = await claim_orphans(conn, claim_limit=None)
        assert claimed_ids(rows) == [expired.run_id]
        for lease in untouched:
            assert dict(await run_row(conn, lease.run_id)) == before[lease.run_id]

    async def test_lease_expiring_exactly_now_is_still_live(self, conn):
        lease = await make_run(conn, "running")
        assert claimed_ids(await claim_orphans(conn, now=at(60))) == []
        assert (await run_row(conn, lease.run_id))["lease_generation"] == 1

    async def test_no_orphan_returns_one_unsaturated_marker(self, conn):
        await make_run(conn, "running", now=at(100))
        rows = await claim_orphans(conn)
        assert len(rows) == 1
        assert rows[0]["run_id"] is None
        assert rows[0]["concurrency_saturated"] is False
        assert rows[0]["active_count"] == 0
        assert rows[0]["concurrency_limit"] is None

    async def test_orphans_of_other_deployments_are_not_claimed(self, conn):
        other = await make_run(conn, "running", deployment_ref="deploy-b")
        assert claimed_ids(await claim_orphans(conn)) == []
        assert (await run_row(conn, other.run_id))["lease_worker_id"] == WORKER


class TestTakeover:
    async def test_takeover_bumps_generation_and_sets_the_new_lease(self, conn):
        lease = await make_run(conn, "running")
        rows = await claim_orphans(conn, now=at(120), lease_seconds=30)
        assert len(rows) == 1
        claimed = rows[0]
        assert claimed["run_id"] == lease.run_id
        assert claimed["lease_generation"] == lease.generation + 1
        assert claimed["lease_expires_at"] == at(150)
        assert claimed["status"] == "running"
        # The attempt that died with its worker counts: this is attempt 2.
        assert claimed["attempts"] == 2
        assert claimed["cancel_requested"] is False
        row = await run_row(conn, lease.run_id)
        assert row["status"] == "running"
        assert row["lease_worker_id"] == RESCUER
        assert row["lease_generation"] == 2
        assert row["lease_acquired_at"] == at(120)
        assert row["lease_expires_at"] == at(150)
        assert row["attempts"] == 2
        assert row["started_at"] == T0

    async def test_each_takeover_bumps_the_generation_again(self, conn):
        lease = await make_run(conn, "running")
        first = await claim_orphans(conn, worker_id="w-2", now=at(61))
        second = await claim_orphans(conn, worker_id="w-3", now=at(122))
        assert [first[0]["lease_generation"], second[0]["lease_generation"]] == [2, 3]
        assert (await run_row(conn, lease.run_id))["lease_worker_id"] == "w-3"

    async def test_orphans_come_oldest_expiry_first(self, conn):
        newer = await make_run(conn, "running", now=at(10))
        older = await make_run(conn, "running", now=at(0))
        rows = await claim_orphans(conn, claim_limit=1, now=at(200))
        assert claimed_ids(rows) == [older.run_id]
        assert claimed_ids(await claim_orphans(conn, claim_limit=1, now=at(200))) == [newer.run_id]


class TestRecoveryCheckpoint:
    async def test_latest_checkpoint_by_order_is_returned_with_its_data(self, conn):
        lease = await make_run(conn, "running")
        ids = [await save_checkpoint(conn, lease, {"step": step}, now=at(step))
               for step in (1, 2, 3)]
        rows = await claim_orphans(conn)
        assert rows[0]["recovery_checkpoint_id"] == ids[2]
        assert json.loads(rows[0]["checkpoint_data"]) == {"step": 3}
        assert (await run_row(conn, lease.run_id))["recovery_checkpoint_id"] == ids[2]

    async def test_upserting_an_older_checkpoint_id_makes_it_the_latest(self, conn):
        lease = await make_run(conn, "running")
        first = await save_checkpoint(conn, lease, {"step": 1}, now=at(1))
        await save_checkpoint(conn, lease, {"step": 2}, now=at(2))
        again = await save_checkpoint(conn, lease, {"step": 3}, checkpoint_id=first, now=at(3))
        assert again == first
        rows = await claim_orphans(conn)
        assert rows[0]["recovery_checkpoint_id"] == first
        assert json.loads(rows[0]["checkpoint_data"]) == {"step": 3}

    async def test_run_without_checkpoint_has_null_recovery_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        rows = await claim_orphans(conn)
        assert rows[0]["run_id"] == lease.run_id
        assert rows[0]["recovery_checkpoint_id"] is None
        assert rows[0]["checkpoint_data"] is None

    async def test_the_new_holder_can_read_and_build_on_the_checkpoint(self, conn):
        lease = await make_run(conn, "running")
        saved = await save_checkpoint(conn, lease, {"step": 1})
        rows = await claim_orphans(conn)
        assert await conn.fetchval(
            "SELECT zeroth.get_recovery_checkpoint_id(run_id => $1)", lease.run_id) == saved
        rescuer = Lease(lease.run_id, RESCUER, rows[0]["lease_generation"])
        assert await save_checkpoint(conn, rescuer, {"step": 2}, now=at(121)) is not None


class TestClaimLimit:
    async def test_claim_limit_bounds_the_batch(self, conn):
        orphans = [await make_run(conn, "running", now=at(i)) for i in range(3)]
        first = claimed_ids(await claim_orphans(conn, claim_limit=2, now=at(200)))
        second = claimed_ids(await claim_orphans(conn, claim_limit=2, now=at(200)))
        assert len(first) == 2
        assert len(second) == 1
        assert set(first + second) == {lease.run_id for lease in orphans}
        assert claimed_ids(await claim_orphans(conn, claim_limit=2, now=at(200))) == []

    async def test_null_claim_limit_claims_every_orphan(self, conn):
        orphans = [await make_run(conn, "running", now=at(i)) for i in range(4)]
        rows = await claim_orphans(conn, claim_limit=None, now=at(200))
        assert sorted(claimed_ids(rows)) == sorted(lease.run_id for lease in orphans)

    @pytest.mark.parametrize(
        "kwargs",
        [
            pytest.param({"claim_limit": 1001}, id="claim-limit-1001"),
            pytest.param({"claim_limit": -1}, id="claim-limit-negative"),
            pytest.param({"max_concurrency": 0}, id="max-concurrency-0"),
            pytest.param({"lease_seconds": 0}, id="lease-0"),
            pytest.param({"lease_seconds": float("nan")}, id="lease-nan"),
            pytest.param({"lease_seconds": 86401}, id="lease-over-a-day"),
            pytest.param({"worker_id": ""}, id="empty-worker"),
            pytest.param({"deployment_ref": ""}, id="empty-deployment"),
        ])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, kwargs):
        await make_run(conn, "running")
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim_orphans(conn, **kwargs)
        assert caught.value.sqlstate == "ZP008"
        assert await snapshot(conn) == before

    async def test_max_concurrency_with_workspace_but_no_tenant_raises_zp006(self, conn):
        await make_run(conn, "running", tenant_id="t1", workspace_id="w1")
        before = await snapshot(conn)
        with pytest.raises(asyncpg.PostgresError) as caught:
            async with conn.transaction():
                await claim_orphans(conn, workspace_id="w1", max_concurrency=1)
        assert caught.value.sqlstate == "ZP006"
        assert await snapshot(conn) == before


class TestRunsThatKillTheirWorker:
    """A run whose handler takes its process down is not recovered for ever: every re-lease of
    an orphan counts an attempt, and one out of attempts is dead-lettered instead of
    re-leased."""

    async def test_each_recovery_counts_an_attempt_until_the_run_is_dead_lettered(self, conn):
        lease = await make_run(conn, "running", max_attempts=3)  # attempt 1, lease to 60
        attempts = []
        for n, worker in enumerate(["w-2", "w-3"], start=1):
            rows = await claim_orphans(conn, worker_id=worker, now=at(120 * n))
            attempts.append([(r["attempts"], r["lease_generation"]) for r in rows
                             if r["run_id"] is not None])
        assert attempts == [[(2, 2)], [(3, 3)]]

        # Attempt 3 dies too: nothing is re-leased, the run ends as a dead letter.
        assert claimed_ids(await claim_orphans(conn, worker_id="w-4", now=at(400))) == []
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["attempts"], row["lease_worker_id"]) == ("failed", 3, None)
        assert row["dead_lettered_at"] == at(400)
        error = json.loads(row["error"])
        assert (error["stop_reason"], error["worker_id"], error["lease_generation"]) == (
            "attempts_exhausted", "w-3", 3)

    async def test_the_dead_letter_frees_its_slot_and_the_claim_says_so(self, conn):
        await make_run(conn, "running", max_attempts=1, max_concurrency=1)
        waiting = await enqueue(conn, now=at(1))

        assert claimed_ids(await claim_orphans(conn, max_concurrency=1, now=at(120))) == []

        rows = await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_pending(deployment_ref => $1,
                   worker_id => 'w-x', max_concurrency => 1, now_override => $2)""",
            DEPLOYMENT, at(121))
        assert [r["run_id"] for r in rows] == [waiting]

    async def test_claim_limit_zero_ends_what_nobody_may_resume_and_re_leases_nothing(self, conn):
        # A worker with no free slot: it still ends the orphans that block
        # their threads; the resumable one with attempts left waits for a slot, and the marker
        # row says one is waiting.
        exhausted = await make_run(conn, "running", max_attempts=1)
        resumable = await make_run(conn, "running", max_attempts=3)

        rows = await claim_orphans(conn, claim_limit=0, now=at(120))

        assert claimed_ids(rows) == []
        assert [r["concurrency_saturated"] for r in rows] == [True]
        assert (await run_row(conn, exhausted.run_id))["status"] == "failed"
        row = await run_row(conn, resumable.run_id)
        assert (row["status"], row["attempts"], row["lease_generation"]) == ("running", 1, 1)

    async def test_a_run_with_attempts_left_is_re_leased_not_ended(self, conn):
        lease = await make_run(conn, "running", max_attempts=2)

        rows = await claim_orphans(conn, now=at(120))

        assert [(r["run_id"], r["attempts"]) for r in rows] == [(lease.run_id, 2)]


class TestMaxConcurrency:
    async def test_saturated_with_an_orphan_waiting_reports_saturated(self, conn):
        orphan = await make_run(conn, "running")  # no slot; lease lapses at at(60)
        await make_run(conn, "running", max_concurrency=1, now=at(100))  # holds the only slot
        before = await snapshot(conn)
        rows = await claim_orphans(conn, max_concurrency=1, now=at(120))
        assert len(rows) == 1
        assert rows[0]["run_id"] is None
        assert rows[0]["concurrency_saturated"] is True
        assert rows[0]["active_count"] == 1
        assert rows[0]["concurrency_limit"] == 1
        assert await snapshot(conn) == before
        assert (await run_row(conn, orphan.run_id))["lease_generation"] == 1

    async def test_saturated_without_an_orphan_is_a_definitive_empty_scan(self, conn):
        await make_run(conn, "running", max_concurrency=1, now=at(100))
        rows = await claim_orphans(conn, max_concurrency=1, now=at(120))
        assert len(rows) == 1
        assert rows[0]["run_id"] is None
        assert rows[0]["concurrency_saturated"] is False
        assert rows[0]["active_count"] == 1
        assert rows[0]["concurrency_limit"] == 1

    async def test_takeover_under_max_concurrency_takes_the_orphans_slot(self, conn):
        orphan = await make_run(conn, "running", max_concurrency=1)
        rows = await claim_orphans(conn, max_concurrency=1, now=at(120))
        assert claimed_ids(rows) == [orphan.run_id]
        assert rows[0]["active_count"] == 0
        row = await run_row(conn, orphan.run_id)
        slot = await conn.fetchrow(
            """SELECT * FROM zeroth.admission_slots s
                WHERE s.deployment_ref = $1 AND s.slot_no = $2""", DEPLOYMENT,
            row["admission_slot"])
        # The slot names the new lease; the lease itself (holder, expiry) lives on the run only.
        assert (slot["run_id"], slot["lease_generation"]) == (orphan.run_id, 2)
        assert row["lease_worker_id"] == RESCUER
        # The slot is live again: a pending claim under the same limit is now saturated.
        await enqueue(conn, now=at(121))
        pending = await conn.fetch(
            """SELECT run_id, concurrency_saturated FROM zeroth_test.claim_pending(
                   deployment_ref => $1, worker_id => 'worker-c', max_concurrency => 1,
                   now_override => $2)""", DEPLOYMENT, at(122))
        assert [(r["run_id"], r["concurrency_saturated"]) for r in pending] == [(None, True)]

    async def test_free_slots_bound_the_batch(self, conn):
        for i in range(3):
            await make_run(conn, "running", now=at(i))
        rows = await claim_orphans(conn, max_concurrency=2, claim_limit=10, now=at(200))
        assert len(claimed_ids(rows)) == 2
        assert {row["concurrency_limit"] for row in rows} == {2}


class TestDisplacedHolder:
    async def _taken_over(self, conn: asyncpg.Connection,
                          rescuer: str = RESCUER) -> tuple[Lease, Lease]:
        old = await make_run(conn, "running")
        rows = await claim_orphans(conn, worker_id=rescuer, now=at(120))
        return old, Lease(old.run_id, rescuer, rows[0]["lease_generation"])

    @pytest.mark.parametrize("rescuer", [RESCUER, WORKER], ids=["other-worker", "same-worker-id"])
    async def test_old_generation_cannot_renew_commit_checkpoint_or_finish(self, conn, rescuer):
        old, new = await self._taken_over(conn, rescuer)
        fence = (old.run_id, old.worker_id, old.generation)
        before = await snapshot(conn)
        now = at(121)
        assert await conn.fetchval(
            """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", *fence, now) is False
        assert await conn.fetchval(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                   columns => '{"output": {"stale": true}}', now_override => $4)""",
            *fence, now) is False
        assert await save_checkpoint(conn, old, {"stale": True}, now=now) is None
        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", *fence, now) is False
        assert await conn.fetchval(
            """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", *fence, now) is None
        assert await conn.fetchval(
            """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", *fence, now) is False
        assert await conn.fetchval(
            """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3, now_override => $4)""", *fence, now) is False
        assert await snapshot(conn) == before

        assert await conn.fetchval(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                   columns => '{"output": {"fresh": true}}', now_override => $4)""",
            new.run_id, new.worker_id, new.generation, now) is True
        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", new.run_id, new.worker_id, new.generation, now) is True


class TestCancelRequested:
    async def test_pending_cancel_request_surfaces_in_the_claim_row(self, conn):
        lease = await make_run(conn, "running")
        outcome = await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(10))
        assert outcome == "cancel_requested"
        rows = await claim_orphans(conn, now=at(120))
        assert claimed_ids(rows) == [lease.run_id]
        assert rows[0]["cancel_requested"] is True

    async def test_the_rescuer_can_then_honour_the_cancel(self, conn):
        lease = await make_run(conn, "running")
        await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(10))
        rows = await claim_orphans(conn, now=at(120))
        assert await conn.fetchval(
            """SELECT zeroth_test.cancel_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, RESCUER, rows[0]["lease_generation"],
            at(121))
        assert (await run_row(conn, lease.run_id))["status"] == "cancelled"
