"""The settle path (zeroth._lock_settle + zeroth._settle, public as settle_runs) against the
people it must keep out, on a database as shipped (no test clock):

* a stale holder (its lease expired and was taken over) settles nothing, whatever outcome it
  asks for, and the new holder's settle still lands;
* a mixed batch naming another worker's runs (and another tenant's) settles exactly the
  caller's own, reports the others (ZP002) and changes nothing of theirs;
* a DBA's UPDATE of the run between the lock and the settle (same transaction) is never
  overwritten: the settle finds no row version it locked and changes nothing, and the DBA's end
  is recorded once, by the trigger;
* an outcome that is not a legal edge of zeroth.run_transitions (a completion of a claim not
  started) changes nothing and is reported (ZP012); no product role can add an edge;
* a zeroth_reader and a LOGIN role with no grant cannot call settle_runs (42501) nor the
  internal settle helpers, and change nothing.
* the ends of another worker's lease — claim_for_takeover, reconcile_thread_runs,
  claim_orphaned, request_cancel(_v2), clear_lease — go through the same settle: along an edge a
  DBA removed they change nothing (a takeover takes nothing, the others raise ZP003).
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from held_runs import ORPHANED, held_run
from test_child_run_attacks import ENQUEUE, family, held, snapshot, status
from test_child_wait_counts import ended

SETTLE = """SELECT run_id, outcome, sqlstate FROM zeroth.settle_runs(worker_id => $1,
                run_ids => $2::uuid[], generations => $3::bigint[], outcomes => $4::text[],
                tenant_id => $5)"""

OUTCOMES = ["complete", "retry", "fail", "cancel", "hand_back"]


async def settle(conn: asyncpg.Connection, worker_id: str, items: list[tuple[Any, int, str]],
                 tenant: str | None = "acme") -> list[tuple[Any, Any, Any]]:
    rows = await conn.fetch(SETTLE, worker_id, [i[0] for i in items], [i[1] for i in items],
                            [i[2] for i in items], tenant)
    return [tuple(r) for r in rows]


class TestStaleHolder:
    @pytest.mark.parametrize("outcome", OUTCOMES)
    async def test_a_holder_whose_lease_was_taken_over_settles_nothing(
            self, login, admin, outcome):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, lease_seconds=0.001)
        await admin.execute("SELECT pg_sleep(0.01)")
        (taken,) = await worker.fetch(ORPHANED, "w3", "acme")
        assert (taken["run_id"], taken["lease_generation"]) == (run_id, generation + 1)
        before = await snapshot(admin)

        # The old generation, and the new one under the old worker's id: both fenced out.
        assert await settle(worker, "w1", [(run_id, generation, outcome)]) == [
            (run_id, None, "ZP002")]
        assert await settle(worker, "w1", [(run_id, generation + 1, outcome)]) == [
            (run_id, None, "ZP002")]
        assert await snapshot(admin) == before

        # The new holder's settle lands, and its attempt is recorded once.
        assert (await settle(worker, "w3", [(run_id, generation + 1, "complete")]))[0][1:] == (
            "completed", None)
        assert [row[1:] for row in await ended(admin, run_id)] == [
            ("w1", "recovered"), ("w3", "completed")]


class TestMixedBatch:
    async def test_another_workers_and_another_tenants_runs_are_reported_not_settled(
            self, login, admin):
        worker = await login("worker")
        mine, g_mine = await held(admin, worker)
        theirs, g_theirs = await held(admin, worker, worker_id="w2")
        elsewhere, g_elsewhere = await held(admin, worker, tenant="globex")
        also_mine, g_also = await held(admin, worker)
        untouched = {run: await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE run_id = $1",
                                               run) for run in (theirs, elsewhere)}

        result = await settle(worker, "w1", [(theirs, g_theirs, "cancel"),
                                              (mine, g_mine, "fail"),
                                              (elsewhere, g_elsewhere, "complete"),
                                              (also_mine, g_also, "hand_back")])

        assert result == [(theirs, None, "ZP002"), (mine, "failed", None),
                          (elsewhere, None, "ZP002"), (also_mine, "handed_back", None)]
        for run, row in untouched.items():
            assert await admin.fetchrow(
                "SELECT r.* FROM zeroth.runs r WHERE run_id = $1", run) == row
            assert await ended(admin, run) == []
        assert await ended(admin, mine) == [(g_mine, "w1", "failed")]
        assert await ended(admin, also_mine) == [(g_also, "w1", "handed_back")]

    @pytest.mark.parametrize("outcome", ["release", "expire", "sleep", "pause", "wait",
                                         "take_over", "unrecoverable", "revoke", "clear",
                                         "COMPLETE", "complete "])
    async def test_an_internal_or_unknown_outcome_is_refused_whole(self, login, admin, outcome):
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        other, g_other = await held(admin, worker)
        before = await snapshot(admin)
        with pytest.raises(asyncpg.PostgresError) as info:
            await settle(worker, "w1", [(other, g_other, "complete"),
                                        (run_id, generation, outcome)])
        assert info.value.sqlstate == "ZP008"
        assert await snapshot(admin) == before


class TestDbaBetweenLockAndSettle:
    @pytest.mark.parametrize("update", [
        # The DBA ends the run by hand.
        """UPDATE zeroth.runs SET status = 'cancelled', finished_at = now(), updated_at = now(),
               lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
               admission_slot = NULL WHERE run_id = $1""",
        # The DBA expires the lease.
        "UPDATE zeroth.runs SET lease_expires_at = now() - interval '1 s' WHERE run_id = $1",
        # The DBA hands the lease to another worker.
        "UPDATE zeroth.runs SET lease_worker_id = 'dba' WHERE run_id = $1",
    ])
    async def test_a_row_changed_after_the_lock_is_not_settled(self, login, admin, update):
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        async with admin.transaction():
            lock = await admin.fetchrow(
                "SELECT slot_rows, run_rows FROM zeroth._lock_settle('acme', '', 'w1', "
                "ARRAY[$1]::uuid[], ARRAY[$2]::bigint[])", run_id, generation)
            assert len(lock["run_rows"]) == 1
            await admin.execute(update, run_id)
            changed = await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE run_id = $1",
                                           run_id)
            history = await ended(admin, run_id)
            rows = await admin.fetch(
                "SELECT outcome, sqlstate FROM zeroth._settle('acme', '', 'w1', "
                "ARRAY[$1]::uuid[], ARRAY[$2]::bigint[], '{complete}', NULL, NULL, NULL, "
                "NULL, NULL, $3::tid[], $4::tid[], clock_timestamp())",
                run_id, generation, lock["run_rows"], lock["slot_rows"])
            assert [tuple(r) for r in rows] == [(None, "ZP002")]
            assert await admin.fetchrow(
                "SELECT r.* FROM zeroth.runs r WHERE run_id = $1", run_id) == changed
            assert await ended(admin, run_id) == history
        # What the DBA ended by hand is recorded once, by the trigger; nothing completed it.
        assert all(row[2] != "completed" for row in await ended(admin, run_id))
        assert len(await ended(admin, run_id)) == len(history)


class TestUnlistedEdge:
    @pytest.mark.parametrize("outcome", ["complete", "retry", "fail", "hand_back"])
    async def test_settling_a_claim_not_started_changes_nothing(self, login, admin, outcome):
        worker = await login("worker")
        await admin.fetchval(ENQUEUE, "acme")
        (claimed,) = await worker.fetch(
            "SELECT run_id, lease_generation FROM zeroth.claim_pending(deployment_ref => 'd', "
            "worker_id => 'w1', tenant_id => 'acme') WHERE run_id IS NOT NULL")
        before = await snapshot(admin)
        assert await settle(worker, "w1", [(claimed["run_id"], claimed["lease_generation"],
                                            outcome)]) == [(claimed["run_id"], None, "ZP012")]
        assert await snapshot(admin) == before

    @pytest.mark.parametrize("kind", ["nobody", "reader", "worker"])
    async def test_no_product_role_can_add_an_edge(self, login, admin, kind):
        hostile = await login(kind)
        before = await admin.fetch("SELECT t.* FROM zeroth.run_transitions t ORDER BY edge_no")
        for statement in (
                "INSERT INTO zeroth.run_transitions VALUES (99, 'pending', 'completed', "
                "'completed', 'x')",
                "UPDATE zeroth.run_transitions SET to_status = 'completed'",
                "DELETE FROM zeroth.run_transitions"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.execute(statement)
        assert await admin.fetch(
            "SELECT t.* FROM zeroth.run_transitions t ORDER BY edge_no") == before


class TestRoles:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_only_a_worker_may_settle(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        hostile = await login(kind)
        before = await snapshot(admin)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await settle(hostile, "w1", [(run_id, generation, "complete")])
        for call in (
                "SELECT zeroth._lock_settle('acme', '', 'w1', ARRAY[$1]::uuid[], "
                "ARRAY[$2]::bigint[])",
                "SELECT zeroth._settle_one('acme', '', $1, 'w1', $2, 'complete')",
                "SELECT * FROM zeroth._settle('acme', '', 'w1', ARRAY[$1]::uuid[], "
                "ARRAY[$2]::bigint[], '{complete}', NULL, NULL, NULL, NULL, NULL, '{}', '{}', "
                "now())"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.fetch(call, run_id, generation)
        assert await snapshot(admin) == before
        # The worker role itself cannot reach the internal helpers either.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.fetch("SELECT zeroth._settle_one('acme', '', $1, 'w1', $2, 'complete')",
                               run_id, generation)


# Every single-run end, the edge it settles along, and the call (run, worker, generation, tenant).
SINGLE_RUN_ENDS = {
    "complete_run": ("completed", "SELECT zeroth.complete_run($1, $2, $3, tenant_id => $4)"),
    "fail_run": ("failed", "SELECT zeroth.fail_run($1, $2, $3, retryable => false, "
                           "tenant_id => $4)"),
    "pause_run": ("paused", "SELECT zeroth.pause_run($1, $2, $3, 'r', tenant_id => $4)"),
    "sleep_run": ("slept", "SELECT * FROM zeroth.sleep_run($1, $2, $3, delay_seconds => 60, "
                           "tenant_id => $4)"),
    "hand_back_to_pending": ("handed_back",
                             "SELECT zeroth.hand_back_to_pending($1, $2, $3, tenant_id => $4)"),
    "cancel_run": ("cancelled", "SELECT zeroth.cancel_run($1, $2, $3, tenant_id => $4)"),
    "release_lease": ("expired", "SELECT zeroth.release_lease($1, $2, $3, tenant_id => $4)"),
    "expire_recovery_lease": ("expired", "SELECT zeroth.expire_recovery_lease($1, $2, $3, "
                                         "tenant_id => $4)"),
    "wait_for_event": ("waited", "SELECT * FROM zeroth.wait_for_event($1, $2, $3, 'e', 'ev', "
                                 "tenant_id => $4)"),
    "wait_for_children": ("waited", "SELECT * FROM zeroth.wait_for_children($1, $2, $3, 'c', "
                                    "$5::uuid[], tenant_id => $4)"),
}


class TestEdgeRemovedByDba:
    @pytest.mark.parametrize("call", sorted(SINGLE_RUN_ENDS))
    async def test_a_single_run_end_along_a_removed_edge_raises_and_changes_nothing(
            self, login, admin, call):
        # The live holder's end along an edge a DBA deleted from zeroth.run_transitions is refused
        # out loud (ZP003, as for a status without the edge), never reported as a lost lease
        # (false / outcome NULL) nor as an outcome that did not happen (wait_*: 'cancelled').
        worker = await login("worker")
        edge, statement = SINGLE_RUN_ENDS[call]
        run_id, generation, children = await family(admin, worker)
        removed = await admin.fetch(
            "DELETE FROM zeroth.run_transitions WHERE from_status = 'running' AND outcome = $1 "
            "RETURNING *", edge)
        assert len(removed) == 1
        try:
            before = await snapshot(admin)
            args = [run_id, "w1", generation, "acme"]
            if "$5" in statement:
                args.append(children)
            with pytest.raises(asyncpg.PostgresError) as info:
                await worker.fetch(statement, *args)
            assert info.value.sqlstate == "ZP003"
            assert await snapshot(admin) == before
        finally:
            await admin.executemany(
                "INSERT INTO zeroth.run_transitions VALUES ($1, $2, $3, $4, $5)",
                [tuple(r) for r in removed])
        # The edge back, the same end lands.
        await worker.fetch(statement, *args)
        assert await status(admin, run_id) != "running" or call in (
            "release_lease", "expire_recovery_lease")


#: A DBA hands a settled run's lease to a worker by hand, without a claim: running again under
#: the generation the settle path already recorded (no new generation).
DBA_REOPEN = """UPDATE zeroth.runs SET status = 'running', lease_worker_id = 'w1',
                    lease_acquired_at = now(), lease_expires_at = now() + interval '1 hour',
                    started_at = now(), attempts = attempts + 1, run_after = now()
                 WHERE run_id = $1"""

DBA_FAIL = """UPDATE zeroth.runs SET status = 'failed', finished_at = now(), updated_at = now(),
                  lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL
               WHERE run_id = $1"""


class TestDbaReopensASettledGeneration:
    @pytest.mark.parametrize("end", ["dba", "settle"])
    async def test_an_attempt_reopened_by_hand_under_a_recorded_generation_is_recorded_once(
            self, login, admin, end):
        # The settle path marks the generation it recorded (attempt_recorded_generation). A DBA
        # who reopens the run under that same generation starts another attempt: its end —
        # by hand or by the settle path — is recorded exactly once, never skipped for the mark.
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        assert (await settle(worker, "w1", [(run_id, generation, "retry")]))[0][1:] == (
            "retry_scheduled", None)
        assert [row[1:] for row in await ended(admin, run_id)] == [("w1", "failed")]
        await admin.execute(DBA_REOPEN, run_id)
        if end == "dba":
            await admin.execute(DBA_FAIL, run_id)
            label = "failed"
        else:
            assert (await settle(worker, "w1", [(run_id, generation, "complete")]))[0][1:] == (
                "completed", None)
            label = "completed"
        assert [row[1:] for row in await ended(admin, run_id)] == [
            ("w1", "failed"), ("w1", label)]


#: The ends of another worker's lease, each with the edge it takes (from a running run past
#: lease + grace, or a pending one for an operator's cancel), the call and the status after it.
#: They end through the settle path too (issue 33): the lease is cleared in one place and only
#: along a listed edge.
ADMIN_ENDS = {
    "claim_for_takeover": (
        "running", "takeover_requeued",
        "SELECT count(*) FROM zeroth.claim_for_takeover(run_id => $1, tenant_id => $2, "
        "grace_seconds => 0)", "pending"),
    "reconcile_thread_runs": (
        "running", "takeover_requeued",
        "SELECT count(*) FROM zeroth.reconcile_thread_runs(deployment_ref => 'd', tenant_id => $2, "
        "grace_seconds => 0) WHERE run_id = $1", "pending"),
    "claim_orphaned": (
        "running", "orphan_recovered",
        "SELECT count(*) FROM zeroth.claim_orphaned(deployment_ref => 'd', worker_id => 'w2', "
        "tenant_id => $2, grace_seconds => 0, claim_limit => 0) "
        "WHERE run_id IS NOT NULL AND $1::uuid IS NOT NULL", "failed"),
    "request_cancel_v2": (
        "running", "takeover_cancelled",
        "SELECT outcome FROM zeroth.request_cancel_v2(run_id => $1, tenant_id => $2, "
        "grace_seconds => 0)", "cancelled"),
    "request_cancel": (
        "pending", "cancel_requested",
        "SELECT zeroth.request_cancel(run_id => $1, tenant_id => $2)", "cancelled"),
    # An operator's clear_lease of a running run: the lease expired in place, no attempt ended.
    "clear_lease": (
        "running", "expired",
        "SELECT zeroth.clear_lease(run_id => $1, tenant_id => $2)", "running"),
}

LAPSE = """UPDATE zeroth.runs SET lease_expires_at = now() - interval '1 hour',
               lease_acquired_at = now() - interval '2 hours', thread_id = 't1',
               resumable = $2 WHERE run_id = $1"""  # a thread's run, for reconcile_thread_runs


class TestAdminEndsFollowTheTransitionTable:
    @pytest.mark.parametrize("call", sorted(ADMIN_ENDS))
    async def test_an_end_of_another_workers_lease_along_a_removed_edge_changes_nothing(
            self, login, admin, call):
        # Takeovers and an operator's cancel clear a lease through zeroth._settle, so an edge a
        # DBA deleted from zeroth.run_transitions stops them as it stops a worker's own ends: the
        # run, its slot and its history stay as they were (a takeover takes nothing; a cancel
        # or a clear raises ZP003).
        worker = await login("worker")
        from_status, edge, statement, after = ADMIN_ENDS[call]
        if from_status == "running":
            run_id, _generation = await held(admin, worker)
            await admin.execute(LAPSE, run_id, call != "claim_orphaned")
        else:
            run_id = await admin.fetchval(ENQUEUE, "acme")
        removed = await admin.fetch(
            "DELETE FROM zeroth.run_transitions WHERE from_status = $1 AND outcome = $2 "
            "RETURNING *", from_status, edge)
        assert len(removed) == 1
        try:
            before = await snapshot(admin)
            if call.startswith("request_cancel") or call == "clear_lease":
                with pytest.raises(asyncpg.PostgresError) as info:
                    await admin.fetch(statement, run_id, "acme")
                assert info.value.sqlstate == "ZP003"
            else:
                assert await admin.fetchval(statement, run_id, "acme") == 0
            assert await snapshot(admin) == before
        finally:
            await admin.executemany(
                "INSERT INTO zeroth.run_transitions VALUES ($1, $2, $3, $4, $5)",
                [tuple(r) for r in removed])
        # The edge back, the same end lands, and its attempt (if it ended one) is recorded once.
        await admin.fetch(statement, run_id, "acme")
        assert await status(admin, run_id) == after
        if from_status == "running":
            assert len(await ended(admin, run_id)) == (call != "clear_lease")
