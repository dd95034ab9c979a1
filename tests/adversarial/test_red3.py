"""Red team 3: attacks on issue 16 (commit 832d743) — the attempt history written set-based by
the completions, and the triggers for redriven and deleted child runs — as the roles the product
keeps out and as a DBA, on a database exactly as shipped.

Each test is one attack; it passes when the promise held.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import asyncpg
import pytest
from roles import dsn_as, login_role
from test_attempt_history_roles import held_run
from test_red2 import COMPLETE, ENQUEUE, held

BATCH = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1,
               run_ids => $2::uuid[], generations => $3::bigint[], tenant_id => 'acme')"""
HISTORY = """SELECT a.lease_generation, a.worker_id, a.outcome FROM zeroth.run_attempts a
              WHERE a.run_id = $1 ORDER BY a.lease_generation, a.ended_at"""
#: A DBA's completion by hand: what complete_run does, without the function.
DBA_COMPLETE = """UPDATE zeroth.runs SET status = 'completed', finished_at = now(),
                      updated_at = now(), output = '{"by": "dba"}',
                      lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                      admission_slot = NULL
                   WHERE run_id = $1"""


async def ended(admin: asyncpg.Connection, run_id: Any) -> list[tuple[Any, ...]]:
    """The ended attempts of a run, straight from zeroth.run_attempts."""
    return [tuple(r) for r in await admin.fetch(HISTORY, run_id)]


class TestDbaCompletionAsTheOwner:
    """The trigger runs_attempt_history skips running → completed updates made as zeroth_owner
    (the completion functions write those rows themselves). A DBA acting as zeroth_owner is not
    one of those functions: its completion must still leave exactly one row."""

    @pytest.mark.parametrize("become", ["SET ROLE zeroth_owner",
                                        "SET SESSION AUTHORIZATION zeroth_owner"])
    async def test_a_dba_completing_by_hand_as_zeroth_owner_leaves_one_row(
            self, login, admin, become):
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        await admin.execute(become)
        try:
            assert await admin.fetchval("SELECT current_user::text") == "zeroth_owner"
            await admin.execute(DBA_COMPLETE, run_id)
        finally:
            await admin.execute("RESET SESSION AUTHORIZATION; RESET ROLE")
        assert await admin.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id) == "completed"
        assert await ended(admin, run_id) == [(generation, "w1", "completed")]

    async def test_a_login_member_of_zeroth_owner_completing_by_hand_leaves_one_row(
            self, login, admin, pg_server_dsn, database_dsn):
        # docs/dba-guide.md's `ops` role: a LOGIN member of zeroth_owner, acting as itself.
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        with login_role(pg_server_dsn, "zeroth_owner") as (name, password):
            ops = await asyncpg.connect(dsn_as(database_dsn, name, password))
            try:
                await ops.execute(DBA_COMPLETE, run_id)
            finally:
                await ops.close()
        assert await ended(admin, run_id) == [(generation, "w1", "completed")]

    async def test_the_mark_alone_never_skips_a_row(self, login, admin):
        # The setting the completions raise for their call: a superuser (not zeroth_owner) who
        # sets it, and a worker who sets it before its calls, still get exactly one row each.
        worker = await login("worker")
        by_hand, generation = await held(admin, worker)
        await admin.execute("SET zeroth.completion_records_attempt = 'on'")
        try:
            await admin.execute(DBA_COMPLETE, by_hand)
        finally:
            await admin.execute("RESET zeroth.completion_records_attempt")
        assert await ended(admin, by_hand) == [(generation, "w1", "completed")]
        await worker.execute("SET zeroth.completion_records_attempt = 'on'")
        single, g1 = await held(admin, worker)
        batched, g2 = await held(admin, worker)
        failed, g3 = await held(admin, worker)
        assert await worker.fetchval(COMPLETE, single, "w1", g1, "acme") is True
        assert [r["completed"] for r in await worker.fetch(BATCH, "w1", [batched], [g2])] == [True]
        assert await worker.fetchval(
            "SELECT zeroth.fail_run(run_id => $1, worker_id => 'w1', generation => $2, "
            "retryable => false, tenant_id => 'acme')", failed, g3) == "failed"
        assert await ended(admin, single) == [(g1, "w1", "completed")]
        assert await ended(admin, batched) == [(g2, "w1", "completed")]
        assert await ended(admin, failed) == [(g3, "w1", "failed")]

    async def test_no_product_role_can_act_as_zeroth_owner(self, admin):
        # Who may skip the trigger is whoever may act as zeroth_owner: none of the product's
        # roles (nor PUBLIC) is a member of it, directly or through another role.
        rows = await admin.fetch(
            """SELECT r.rolname::text AS name,
                      pg_has_role(r.oid, 'zeroth_owner', 'USAGE') AS usage,
                      pg_has_role(r.oid, 'zeroth_owner', 'MEMBER') AS member
                 FROM pg_roles r WHERE r.rolname IN ('zeroth_worker', 'zeroth_reader')""")
        assert sorted(tuple(r) for r in rows) == [("zeroth_reader", False, False),
                                                  ("zeroth_worker", False, False)]
        owner_of = await admin.fetch(
            """SELECT m.member::regrole::text FROM pg_auth_members m
                WHERE m.roleid = 'zeroth_owner'::regrole
                  AND m.member IN ('zeroth_worker'::regrole, 'zeroth_reader'::regrole)""")
        assert owner_of == []


class TestCompletionWriters:
    """The trigger leaves exactly two writers' completions to them; no other function may move a
    run to completed, and only those two may carry the mark."""

    async def test_only_complete_run_and_complete_locked_runs_complete_runs_and_carry_the_mark(
            self, admin):
        rows = await admin.fetch(
            """SELECT p.proname::text AS name, p.prosrc AS source,
                      coalesce('zeroth.completion_records_attempt=on' = ANY (p.proconfig), false)
                          AS marked
                 FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace""")
        completing = {r["name"] for r in rows
                      if re.search(r"SET\s+status\s*=\s*'completed'", r["source"], re.I)}
        assert completing == {"complete_run", "_complete_locked_runs"}
        assert {r["name"] for r in rows if r["marked"]} == completing
        for r in rows:
            if r["name"] in completing:
                assert "INSERT INTO zeroth.run_attempts" in r["source"], r["name"]
            # Nobody raises the mark for a part of a call (it would outlive the statement).
            assert "completion_records_attempt" not in r["source"], r["name"]


class TestBatches:
    async def test_mixed_batch_records_exactly_the_live_completions(self, login, admin):
        """complete_runs / complete_and_claim with a live lease, a stale generation (taken over),
        another worker's run, a claim not started, an already completed run and an unknown id:
        one row for the live one, nothing else written."""
        worker = await login("worker")
        live, g_live = await held(admin, worker)
        other, g_other = await held(admin, worker, worker_id="w2")
        done, g_done = await held(admin, worker)
        assert await worker.fetchval(COMPLETE, done, "w1", g_done, "acme") is True
        await admin.fetchval(ENQUEUE, "acme")
        (claimed,) = await worker.fetch(
            "SELECT run_id, lease_generation FROM zeroth.claim_pending(deployment_ref => 'd', "
            "worker_id => 'w1', tenant_id => 'acme') WHERE run_id IS NOT NULL")
        stale, g_stale = await held_run(admin, worker, lease_seconds=0.001)
        await admin.execute("SELECT pg_sleep(0.01)")
        (taken,) = await worker.fetch(
            "SELECT run_id, lease_generation FROM zeroth.claim_orphaned(deployment_ref => 'd', "
            "worker_id => 'w3', tenant_id => 'acme', grace_seconds => 0) "
            "WHERE run_id IS NOT NULL")
        assert (taken["run_id"], taken["lease_generation"]) == (stale, g_stale + 1)
        unknown = uuid.uuid4()
        ids = [other, done, claimed["run_id"], stale, unknown, live]
        gens = [g_other, g_done, claimed["lease_generation"], g_stale, 1, g_live]
        before = {run: await ended(admin, run) for run in ids}
        rows = await worker.fetch(BATCH, "w1", ids, gens)
        assert [(r["run_id"], r["completed"]) for r in rows] == [
            (run, run == live) for run in ids]
        for run in ids:
            expected = before[run] + ([(g_live, "w1", "completed")] if run == live else [])
            assert await ended(admin, run) == expected, run
        # Again through complete_and_claim, the same refusals: nothing more is written.
        await worker.fetch(
            "SELECT completed FROM zeroth.complete_and_claim(deployment_ref => 'none', "
            "worker_id => 'w1', run_ids => $1::uuid[], generations => $2::bigint[], "
            "tenant_id => 'acme')", ids, gens)
        for run in ids:
            expected = before[run] + ([(g_live, "w1", "completed")] if run == live else [])
            assert await ended(admin, run) == expected, run

    async def test_a_batch_of_another_scope_completes_and_records_nothing(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held(admin, worker, tenant="acme")
        for tenant, workspace in (("globex", None), ("acme", "ws"), (None, None)):
            rows = await worker.fetch(
                "SELECT completed FROM zeroth.complete_runs(worker_id => 'w1', "
                "run_ids => $1::uuid[], generations => $2::bigint[], tenant_id => $3, "
                "workspace_id => $4)", [run_id], [generation], tenant, workspace)
            assert [r["completed"] for r in rows] == [False]
            assert await worker.fetchval(
                "SELECT zeroth.complete_run(run_id => $1, worker_id => 'w1', generation => $2, "
                "tenant_id => $3, workspace_id => $4)", run_id, generation, tenant,
                workspace) is False
        assert await ended(admin, run_id) == []
        assert await admin.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id) == "running"
