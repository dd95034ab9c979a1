"""A renewal refused because another session re-leased the run into another slot in between
leaves no zombie slot counting against K for a whole lease: a slot holds no copy of the lease,
it names (run, generation), so a slot whose run moved on is free however the renewal ended.
"""

from __future__ import annotations

from helpers import DEPLOYMENT, at, enqueue, make_run, run_row
from interleave import assert_waits_for, finished

K = 2
RENEW = """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => 'worker-a', generation => 1,
               now_override => $2)"""
CLAIM_ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                        deployment_ref => $1, worker_id => 'worker-c', max_concurrency => $2,
                        now_override => $3) WHERE run_id IS NOT NULL"""
CLAIM = """SELECT run_id, concurrency_saturated, active_count FROM zeroth_test.claim_pending(
               deployment_ref => $1, worker_id => 'worker-d', max_concurrency => $2,
               now_override => $3)"""
LIVE_SLOTS = """SELECT count(*) FROM zeroth_test.slot_leases s
                 WHERE s.deployment_ref = $1 AND s.lease_expires_at >= $2"""


class TestRefusedRenewalLeavesNoZombieSlot:
    async def test_renewal_refused_after_a_re_lease_into_another_slot(self, sessions):
        renewer, rescuer, db = sessions
        lease = await make_run(db, "running", max_concurrency=K)  # slot 1, generation 1, to 60
        # The rescuer holds the run row, so the renewal (which sampled 59, inside its lease)
        # cannot finish before the re-lease: on main it had already renewed its slot row.
        await rescuer.begin()
        await rescuer.call("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", lease.run_id)
        renewal = renewer.spawn(RENEW, lease.run_id, at(59))
        await assert_waits_for(db, renewer, rescuer, renewal)
        taken = (await rescuer.rows(CLAIM_ORPHANED, DEPLOYMENT, K, at(61))).value
        assert [(r["run_id"], r["lease_generation"]) for r in taken] == [(lease.run_id, 2)]
        await rescuer.commit()

        assert (await finished(renewal)).value is False
        # One live lease in the scope: a second run is admitted under K = 2.
        assert await db.fetchval(LIVE_SLOTS, DEPLOYMENT, at(62)) == 1
        waiting = await enqueue(db, now=at(62))
        rows = await db.fetch(CLAIM, DEPLOYMENT, K, at(62))
        assert [(r["run_id"], r["concurrency_saturated"], r["active_count"]) for r in rows] == [
            (waiting, False, 1)]
        row = await run_row(db, lease.run_id)
        assert (row["lease_worker_id"], row["lease_generation"]) == ("worker-c", 2)
