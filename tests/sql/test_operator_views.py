"""The operator views: queue_depth, dead_letters (0003), live_leases, expired_leases, table_health.

Views read the database clock (clock_timestamp()) and take no now_override, so runs are made at
fixed instants far from the present: factories' T0 (2030) gives leases that are live today, PAST
(2020) gives leases that expired long ago. table_health reads the statistics system, so its tests
commit their writes on a fresh database and flush the writer's statistics.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from helpers import DEPLOYMENT, LEASE, T0, WORKER, Lease, claim, enqueue, make_run, wait_until

PAST = datetime(2020, 1, 1, tzinfo=UTC)
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => 60, now_override => $4)"""
SAVE_CHECKPOINT = """SELECT zeroth_test.save_checkpoint(run_id => $1, worker_id => $2,
                         generation => $3,
                         data => '{"step": 1}', now_override => $4)"""
FAIL_RETRYABLE = """SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                        error => '{"reason": "boom"}', retryable => true, now_override => $4)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(
                        deployment_ref => $1, worker_id => $2) WHERE run_id IS NOT NULL"""
RELEASE = """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                 now_override => $4)"""
REQUEST_CANCEL = "SELECT zeroth.request_cancel(run_id => $1)"


async def view(conn: asyncpg.Connection, name: str) -> dict[Any, dict[str, Any]]:
    """The rows of zeroth.<name> keyed by run_id."""
    return {row["run_id"]: dict(row) for row in await conn.fetch(f"SELECT * FROM zeroth.{name}")}


async def one_of_each(conn: asyncpg.Connection, now: datetime) -> dict[str, Lease]:
    """A run in every state that a lease view must tell apart, made at ``now``."""
    return {status: await make_run(conn, status, now=now)
            for status in ("pending", "claimed", "running", "waiting", "completed")}


class TestLiveLeases:
    async def test_claimed_and_running_runs_with_a_live_lease_are_listed(self, conn):
        runs = await one_of_each(conn, T0)
        await one_of_each(conn, PAST)

        rows = await view(conn, "live_leases")

        assert {run_id: row["status"] for run_id, row in rows.items()} == {
            runs["claimed"].run_id: "pending", runs["running"].run_id: "running"}

    async def test_a_row_names_the_holder_its_generation_and_the_lease_times(self, conn):
        lease = await make_run(conn, "running", tenant_id="acme", workspace_id="ws-1")
        before = await conn.fetchval("SELECT clock_timestamp()")

        row = (await view(conn, "live_leases"))[lease.run_id]

        after = await conn.fetchval("SELECT clock_timestamp()")
        expires = T0 + timedelta(seconds=LEASE)
        assert (row["tenant_id"], row["workspace_id"], row["deployment_ref"]) == (
            "acme", "ws-1", DEPLOYMENT)
        assert (row["lease_worker_id"], row["lease_generation"]) == (WORKER, 1)
        assert (row["lease_acquired_at"], row["lease_expires_at"]) == (T0, expires)
        assert (expires - after).total_seconds() <= row["seconds_left"]
        assert row["seconds_left"] <= (expires - before).total_seconds()
        assert row["cancel_requested_at"] is None

    async def test_a_cancel_request_shows_on_the_live_lease(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(REQUEST_CANCEL, lease.run_id) == "cancel_requested"

        row = (await view(conn, "live_leases"))[lease.run_id]

        assert row["cancel_requested_at"] is not None

    async def test_a_renewal_moves_the_expiry(self, conn):
        lease = await make_run(conn, "running")
        renewed_at = T0 + timedelta(seconds=30)
        assert await conn.fetchval(RENEW, lease.run_id, WORKER, 1, renewed_at) is True

        row = (await view(conn, "live_leases"))[lease.run_id]

        assert row["lease_expires_at"] == renewed_at + timedelta(seconds=60)


class TestExpiredLeases:
    async def test_expired_claims_and_orphans_are_listed_with_the_claim_that_takes_them(
            self, conn):
        await one_of_each(conn, T0)
        expired = await one_of_each(conn, PAST)

        rows = await view(conn, "expired_leases")

        assert {run_id: (row["status"], row["reclaimed_by"]) for run_id, row in rows.items()} == {
            expired["claimed"].run_id: ("pending", "claim_pending"),
            expired["running"].run_id: ("running", "claim_orphaned")}

    async def test_an_orphan_shows_its_holder_expiry_and_checkpoints(self, conn):
        lease = await make_run(conn, "running", now=PAST)
        for _ in range(2):
            assert await conn.fetchval(SAVE_CHECKPOINT, lease.run_id, WORKER, 1, PAST)
        before = await conn.fetchval("SELECT clock_timestamp()")

        row = (await view(conn, "expired_leases"))[lease.run_id]

        expired_at = PAST + timedelta(seconds=LEASE)
        assert (row["lease_worker_id"], row["lease_generation"]) == (WORKER, 1)
        assert row["lease_expires_at"] == expired_at
        assert row["seconds_expired"] >= (before - expired_at).total_seconds()
        assert row["checkpoint_seq"] == 2

    async def test_an_orphan_taken_over_moves_to_the_live_leases(self, conn):
        lease = await make_run(conn, "running", now=PAST)

        taken = await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, "worker-b")

        assert [(row["run_id"], row["lease_generation"]) for row in taken] == [(lease.run_id, 2)]
        assert lease.run_id not in await view(conn, "expired_leases")
        live = (await view(conn, "live_leases"))[lease.run_id]
        assert (live["lease_worker_id"], live["lease_generation"]) == ("worker-b", 2)

    async def test_a_released_claim_holds_no_lease_and_is_not_listed(self, conn):
        lease = await make_run(conn, "claimed", now=PAST)
        assert await conn.fetchval(RELEASE, lease.run_id, WORKER, 1, PAST) is True

        assert await view(conn, "expired_leases") == {}
        assert await view(conn, "live_leases") == {}


class TestQueueDepth:
    async def test_pending_runs_are_counted_per_scope_and_deployment(self, conn):
        await enqueue(conn)
        await enqueue(conn)
        await enqueue(conn, deployment_ref="deploy-b", tenant_id="acme", workspace_id="ws-1")
        await make_run(conn, "completed")

        rows = await conn.fetch(
            """SELECT q.tenant_id, q.workspace_id, q.deployment_ref, q.pending
                 FROM zeroth.queue_depth q ORDER BY q.deployment_ref""")

        assert [tuple(row) for row in rows] == [
            ("default", None, DEPLOYMENT, 2), ("acme", "ws-1", "deploy-b", 1)]

    async def test_claimable_excludes_live_claims_and_scheduled_counts_future_runs(self, conn):
        # Later factories' claims at T0 would take the expired claim over: 2030 comes first.
        await make_run(conn, "claimed", now=T0)    # live claim, due in 2030
        await enqueue(conn, now=T0)                # due in 2030
        await enqueue(conn, now=PAST)              # claimable now
        await make_run(conn, "claimed", now=PAST)  # claim expired, claimable now

        row = await conn.fetchrow("SELECT * FROM zeroth.queue_depth")

        assert (row["pending"], row["claimable"], row["scheduled"]) == (4, 3, 2)


class TestDeadLetters:
    async def test_only_runs_whose_retries_ran_out_are_dead_letters(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)
        assert await conn.fetchval(FAIL_RETRYABLE, lease.run_id, WORKER, 1, T0) == (
            "dead_lettered")
        await make_run(conn, "failed")                   # not retryable: failed, no dead letter
        retried = await make_run(conn, "running", max_attempts=2)
        assert await conn.fetchval(FAIL_RETRYABLE, retried.run_id, WORKER, 1, T0) == (
            "retry_scheduled")

        rows = await view(conn, "dead_letters")

        assert list(rows) == [lease.run_id]
        row = rows[lease.run_id]
        assert (row["attempts"], row["max_attempts"], row["dead_lettered_at"]) == (1, 1, T0)
        assert row["error"] == '{"reason": "boom"}'


class TestTableHealth:
    async def test_one_row_per_hot_table_with_sizes(self, conn):
        rows = {row["table_name"]: row
                for row in await conn.fetch("SELECT * FROM zeroth.table_health")}

        assert set(rows) == {"runs", "checkpoints", "admission_slots"}
        for row in rows.values():
            assert row["table_bytes"] >= 0
            assert row["index_bytes"] > 0
            assert row["table_size"].endswith(("bytes", "kB", "MB"))
            assert row["index_size"].endswith(("bytes", "kB", "MB"))

    async def test_tuples_and_hot_renewals_are_counted(self, connect):
        writer, reader = await connect(), await connect()
        leases = [await make_run(writer, "running") for _ in range(5)]
        for seconds in (10, 20, 30):
            for lease in leases:
                assert await writer.fetchval(
                    RENEW, lease.run_id, WORKER, 1, T0 + timedelta(seconds=seconds))
        await writer.execute("SELECT pg_stat_force_next_flush()")

        row = await reader.fetchrow(
            "SELECT * FROM zeroth.table_health WHERE table_name = 'runs'")

        assert row["n_live_tup"] == 5
        assert row["n_dead_tup"] > 0
        # 15 renewals change no indexed column and find room on the page: HOT updates.
        assert row["n_tup_hot_upd"] >= 15
        assert 0 < row["hot_update_ratio"] <= 1
        assert row["table_bytes"] > 0

    async def test_an_open_snapshot_is_named_as_the_oldest_xmin_holder(self, connect):
        holder, reader = await connect(), await connect()
        await claim(reader)  # any work, so the horizon has moved past the holder's snapshot
        transaction = holder.transaction(isolation="repeatable_read")
        await transaction.start()
        try:
            await holder.fetchval("SELECT count(*) FROM zeroth.runs")
            await reader.execute("SELECT zeroth.enqueue_run(deployment_ref => 'after')")

            row = await reader.fetchrow(
                "SELECT * FROM zeroth.table_health WHERE table_name = 'runs'")

            assert row["oldest_xmin_holder"].startswith(
                f"backend {holder.get_server_pid()} (idle in transaction")
            assert row["oldest_xmin_age"] >= 1
            assert row["oldest_xmin_duration"] >= timedelta(0)
        finally:
            await transaction.rollback()

        after = await reader.fetchrow(
            "SELECT * FROM zeroth.table_health WHERE table_name = 'runs'")
        assert not (after["oldest_xmin_holder"] or "").startswith(
            f"backend {holder.get_server_pid()} ")

    async def test_a_snapshot_in_another_database_is_named_elsewhere_not_as_this_ones_horizon(
            self, connect, pg_server_dsn):
        # It does not hold back VACUUM here, but it keeps reads here from pruning as they go
        # (docs/dba-guide.md): named in oldest_xmin_elsewhere, never in oldest_xmin_holder.
        reader = await connect()
        holder = await asyncpg.connect(pg_server_dsn)  # database postgres
        try:
            transaction = holder.transaction(isolation="repeatable_read")
            await transaction.start()
            await holder.fetchval("SELECT 1")  # the snapshot is taken and held
            await reader.execute("SELECT zeroth.enqueue_run(deployment_ref => 'after')")
            named = f"backend {holder.get_server_pid()} in database postgres (idle in transaction"

            async def row() -> Any:
                found = await reader.fetchrow(
                    "SELECT * FROM zeroth.table_health WHERE table_name = 'runs'")
                # Another session of the server (the suite's next clone) may hold an older
                # snapshot for a moment: the view names the oldest.
                return found if (found["oldest_xmin_elsewhere"] or "").startswith(named) else None

            found = await wait_until(row, "the holder named as the oldest elsewhere", within=10)
            assert found["oldest_xmin_elsewhere_age"] >= 1
            assert found["oldest_xmin_elsewhere_duration"] >= timedelta(0)
            assert not (found["oldest_xmin_holder"] or "").startswith(
                f"backend {holder.get_server_pid()} ")
            await transaction.rollback()
        finally:
            await holder.close()
