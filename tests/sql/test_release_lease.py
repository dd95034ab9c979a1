"""zeroth.release_lease: give up exactly (worker_id, generation), never bumping the generation.

A pending run becomes claimable at once; a running run keeps its holder and gets an expired lease
(a running run without a lease would be stranded, F-02) so claim_orphaned recovers it.
"""

from __future__ import annotations

from datetime import timedelta

from helpers import (
    DEPLOYMENT,
    WORKER,
    at,
    claim,
    enqueue,
    listen,
    make_run,
    next_payload,
    run_row,
    wakeup_key,
)

RELEASE = """SELECT zeroth_test.release_lease(run_id => $1, worker_id => $2, generation => $3,
                 tenant_id => $4, workspace_id => $5, now_override => $6)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation, recovery_checkpoint_id
                      FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
                          max_concurrency => $3, now_override => $4)
                     WHERE run_id IS NOT NULL"""
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               now_override => $4)"""
SLOT = """SELECT s.run_id, s.lease_worker_id, s.lease_generation FROM zeroth_test.slot_leases s
           WHERE s.deployment_ref = $1 AND s.slot_no = 1"""
OTHER = "worker-b"
MICROSECOND = timedelta(microseconds=1)
NOW = at(10)


async def release(conn, run_id, worker_id=WORKER, generation=1, *, tenant_id=None,
                  workspace_id=None, now=NOW):
    return await conn.fetchval(RELEASE, run_id, worker_id, generation, tenant_id, workspace_id,
                               now)


async def claim_orphaned(conn, worker_id=OTHER, *, max_concurrency=None, now=NOW):
    return await conn.fetch(CLAIM_ORPHANED, DEPLOYMENT, worker_id, max_concurrency, now)




class TestReleaseOfClaimedPendingRun:
    async def test_release_clears_every_lease_column(self, conn):
        lease = await make_run(conn, "claimed")

        assert await release(conn, lease.run_id) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "pending"
        assert row["lease_worker_id"] is None
        assert row["lease_acquired_at"] is None
        assert row["lease_expires_at"] is None
        assert row["admission_slot"] is None
        assert row["recovery_checkpoint_id"] is None
        assert row["updated_at"] == at(10)

    async def test_release_does_not_bump_the_generation(self, conn):
        lease = await make_run(conn, "claimed")

        await release(conn, lease.run_id)

        assert (await run_row(conn, lease.run_id))["lease_generation"] == 1

    async def test_released_run_is_claimable_at_once_and_next_claim_bumps_generation(self, conn):
        lease = await make_run(conn, "claimed")
        await release(conn, lease.run_id)

        # Well before the released lease would have expired (T0 + 60 s).
        rows = await claim(conn, worker_id=OTHER, now=at(11))

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]
        row = await run_row(conn, lease.run_id)
        assert (row["lease_worker_id"], row["lease_generation"]) == (OTHER, 2)


class TestReleaseOfRunningRun:
    async def test_release_keeps_holder_and_expires_lease_in_place(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await release(conn, lease.run_id, now=at(10)) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "running"
        assert row["lease_worker_id"] == WORKER
        assert row["lease_acquired_at"] == before["lease_acquired_at"]
        assert row["lease_expires_at"] == at(10) - MICROSECOND
        assert row["lease_generation"] == 1
        assert row["admission_slot"] is None

    async def test_release_never_leaves_a_running_run_without_a_lease(self, conn):
        lease = await make_run(conn, "running")

        await release(conn, lease.run_id)

        stranded = await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.status = 'running'"
            " AND r.lease_worker_id IS NULL")
        assert stranded == 0

    async def test_released_running_run_is_recovered_by_claim_orphaned(self, conn):
        lease = await make_run(conn, "running")
        await release(conn, lease.run_id, now=at(10))

        rows = await claim_orphaned(conn, now=at(10))

        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["lease_worker_id"]) == ("running", OTHER)

    async def test_released_holder_cannot_renew_its_expired_lease(self, conn):
        lease = await make_run(conn, "running")
        await release(conn, lease.run_id, now=at(10))

        assert await conn.fetchval(RENEW, lease.run_id, WORKER, 1, at(10)) is False

class TestReleaseMatchesTheExactGeneration:
    # A stale generation of the same worker id after a takeover is refused and changes nothing:
    # test_fenced_conformance.py (a lease taken over, same_worker_id, release_lease).

    async def test_second_release_of_a_pending_run_is_refused(self, conn):
        lease = await make_run(conn, "claimed")
        assert await release(conn, lease.run_id) is True
        before = await run_row(conn, lease.run_id)

        assert await release(conn, lease.run_id, now=at(20)) is False

        assert dict(await run_row(conn, lease.run_id)) == dict(before)

class TestReleaseNeedsALiveLease:
    async def test_an_expired_running_lease_stays_an_orphan_for_recovery(self, conn):
        lease = await make_run(conn, "running")

        assert await release(conn, lease.run_id, now=at(600)) is False

        assert [r["run_id"] for r in await claim_orphaned(conn, now=at(600))] == [lease.run_id]

class TestReleaseFreesTheSlot:
    async def test_release_of_pending_run_frees_its_slot_for_another_claim(self, conn):
        lease = await make_run(conn, "claimed", max_concurrency=1)
        waiting_run = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(5)) == []

        await release(conn, lease.run_id, now=at(10))

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        rows = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(11))
        assert len(rows) == 1
        assert rows[0]["run_id"] in {lease.run_id, waiting_run}

    async def test_release_of_running_run_frees_its_slot_and_keeps_the_holder(self, conn):
        lease = await make_run(conn, "running", max_concurrency=1)
        assert (await run_row(conn, lease.run_id))["admission_slot"] == 1

        await release(conn, lease.run_id, now=at(10))

        assert tuple(await conn.fetchrow(SLOT, DEPLOYMENT)) == (None, None, None)
        row = await run_row(conn, lease.run_id)
        assert (row["admission_slot"], row["lease_worker_id"]) == (None, WORKER)
        rows = await claim_orphaned(conn, max_concurrency=1, now=at(10))
        assert [(r["run_id"], r["lease_generation"]) for r in rows] == [(lease.run_id, 2)]


class TestReleaseNotifiesWakeup:
    async def test_release_notifies_the_runs_scope(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "claimed")
        queue = await listen(listener, "zeroth_wakeup")

        assert await release(actor, lease.run_id) is True

        assert await next_payload(queue) == await wakeup_key(actor, DEPLOYMENT, "default", None)

    async def test_refused_release_sends_no_wakeup(self, connect):
        actor, listener = await connect(), await connect()
        lease = await make_run(actor, "claimed")
        queue = await listen(listener, "zeroth_wakeup")

        assert await release(actor, lease.run_id, OTHER, 1) is False
        await actor.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")

        # Notifications arrive in commit order: nothing came before the sentinel.
        assert await next_payload(queue) == "sentinel"


