"""Every completion leaves exactly one attempt history row, whoever completes the run.

* a DBA completing a run by hand leaves one row as a superuser, as a LOGIN member of
  zeroth_owner and as zeroth_owner itself (SET ROLE / SET SESSION AUTHORIZATION): the history
  trigger leaves an end to the settle path only when the row carries the generation it recorded
  (runs.attempt_recorded_generation), which only the settling statement writes, and the old
  session mark set by anyone never skips a row;
* no product role is, or can make itself, a member of zeroth_owner;
* only the settle path (zeroth._settle) completes runs, recording them in the same statement,
  and no function carries a session mark; commit_fenced cannot complete a run;
* mixed, cross-scope and malformed batches (complete_runs, complete_and_claim) record exactly
  the live completions, and bad input raises ZP and writes no history;
* a reader sees only its own tenant's rows written by a batch.
"""

from __future__ import annotations

import json
import re
import uuid

import asyncpg
import pytest
from held_runs import held_run
from roles import dsn_as, login_role
from test_child_run_attacks import COMPLETE, ENQUEUE, held
from test_child_wait_counts import (
    CLAIM_ON,
    ended,
)

BATCH = """SELECT run_id, completed FROM zeroth.complete_runs(worker_id => $1,
               run_ids => $2::uuid[], generations => $3::bigint[], tenant_id => 'acme')"""

#: A DBA's completion by hand: what complete_run does, without the function.
DBA_COMPLETE = """UPDATE zeroth.runs SET status = 'completed', finished_at = now(),
                      updated_at = now(), output = '{"by": "dba"}',
                      lease_worker_id = NULL, lease_acquired_at = NULL, lease_expires_at = NULL,
                      admission_slot = NULL
                   WHERE run_id = $1"""


class TestDbaCompletionAsTheOwner:
    """The trigger runs_attempt_history skips the ends the settle path recorded itself (it used
    to skip running → completed updates made as zeroth_owner under a session mark). A DBA acting
    as zeroth_owner is not the settle path: its completion must still leave exactly one row."""

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

    async def test_the_mark_does_not_outlive_the_completion_that_set_it(self, login, admin):
        # One transaction: complete_run and complete_runs (the mark is on during each), then the
        # DBA, as zeroth_owner, completes another run by hand: recorded by the trigger.
        worker = await login("worker")
        first, g1 = await held(admin, worker)
        second, g2 = await held(admin, worker)
        by_hand, g3 = await held(admin, worker)
        async with admin.transaction():
            assert await admin.fetchval(COMPLETE, first, "w1", g1, "acme") is True
            assert [r["completed"] for r in await admin.fetch(BATCH, "w1", [second], [g2])] == [
                True]
            # Lowered by the function that raised it ('off'), never left 'on'.
            assert await admin.fetchval(
                "SELECT current_setting('zeroth.completion_records_attempt', true)") in (
                    "", None, "off")
            await admin.execute("SET LOCAL ROLE zeroth_owner")
            await admin.execute(DBA_COMPLETE, by_hand)
        for run, generation in ((first, g1), (second, g2), (by_hand, g3)):
            assert await ended(admin, run) == [(generation, "w1", "completed")]


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


    @pytest.mark.parametrize("kind", ["nobody", "zeroth_reader", "zeroth_worker"])
    async def test_no_login_role_can_make_itself_zeroth_owner(
            self, pg_server_dsn, database_dsn, kind):
        member_of = None if kind == "nobody" else kind
        with login_role(pg_server_dsn, member_of) as (name, password):
            hostile = await asyncpg.connect(dsn_as(database_dsn, name, password))
            try:
                for statement in ("SET ROLE zeroth_owner",
                                  "SET SESSION AUTHORIZATION zeroth_owner",
                                  "GRANT zeroth_owner TO CURRENT_USER"):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await hostile.execute(statement)
                # A role may set its own login defaults, this one included: it is checked when
                # the next session starts, and refused there (a warning; the session stays the
                # role itself).
                await hostile.execute("ALTER ROLE CURRENT_USER SET role = 'zeroth_owner'")
            finally:
                await hostile.close()
            again = await asyncpg.connect(dsn_as(database_dsn, name, password))
            try:
                assert await again.fetchval("SELECT current_user::text") == name
                assert await again.fetchval(
                    "SELECT pg_has_role(current_user, 'zeroth_owner', 'USAGE')") is False
            finally:
                await again.close()


class TestCompletionWriters:
    """The trigger leaves to the settle path exactly the ends it records itself; no other
    function may move a run to completed, and no function uses a session mark any more."""

    async def test_only_the_settle_path_completes_runs_and_records_them_itself(self, admin):
        rows = await admin.fetch(
            """SELECT p.proname::text AS name, p.prosrc AS source,
                      coalesce(array_to_string(p.proconfig, ' '), '') AS config
                 FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace""")
        # No function hard-codes a completion: _settle writes the status of the edge it found in
        # zeroth.run_transitions.
        assert {r["name"] for r in rows
                if re.search(r"SET\s+status\s*=\s*'completed'", r["source"], re.I)} == set()
        # Only the settle path marks an end as recorded, and it writes that record itself in the
        # same statement (any other end, completions included, goes through the trigger).
        marking = {r["name"] for r in rows
                   if re.search(r"attempt_recorded_generation\s*=", r["source"])}
        assert marking == {"_settle"}
        (settle,) = [r["source"] for r in rows if r["name"] == "_settle"]
        assert "INSERT INTO zeroth.run_attempt_log" in settle
        assert re.search(r"SET\s+status\s*=\s*e\.to_status", settle)
        for r in rows:
            # The old session mark (zeroth.completion_records_attempt) is gone everywhere.
            assert "completion_records_attempt" not in r["source"], r["name"]
            assert "completion_records_attempt" not in r["config"], r["name"]
        trigger = await admin.fetchval(
            "SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t "
            "WHERE t.tgname = 'runs_attempt_history'")
        assert "current_user" not in trigger.lower()
        assert "attempt_recorded_generation" in trigger


    @pytest.mark.parametrize("columns", [
        {"status": "completed"}, {"Status": "completed", "output": {"v": 1}},
        {' "status" ': "completed"}, {"finished_at": "2026-01-01T00:00:00Z"},
        {"lease_worker_id": None}, {"status\t": "completed"}])
    async def test_commit_fenced_cannot_complete_a_run(self, login, admin, columns):
        """The one worker function that writes run columns by name never reaches status (or
        the lease): a holder cannot complete its run outside the completions' history write."""
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetchval(
                "SELECT zeroth.commit_fenced(run_id => $1, worker_id => 'w1', generation => $2, "
                "columns => $3::text::jsonb, tenant_id => 'acme')", run_id, generation,
                json.dumps(columns))
        assert err.value.sqlstate in ("ZP004", "ZP005", "ZP008"), err.value
        assert await admin.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id) == "running"
        assert await ended(admin, run_id) == []


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
        # (None, "ws"): a workspace without a tenant is an impossible scope, which matches nothing.
        for tenant, workspace in (("globex", None), ("acme", "ws"), (None, None), (None, "ws")):
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


    async def test_completing_a_claim_not_started_raises_zp003_and_writes_nothing(
            self, login, admin):
        worker = await login("worker")
        await admin.fetchval(ENQUEUE, "acme")
        (claimed,) = await worker.fetch(
            "SELECT run_id, lease_generation FROM zeroth.claim_pending(deployment_ref => 'd', "
            "worker_id => 'w1', tenant_id => 'acme') WHERE run_id IS NOT NULL")
        run_id, generation = claimed["run_id"], claimed["lease_generation"]
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetchval(COMPLETE, run_id, "w1", generation, "acme")
        assert err.value.sqlstate == "ZP003", err.value
        assert [r["completed"] for r in await worker.fetch(BATCH, "w1", [run_id],
                                                            [generation])] == [False]
        assert await ended(admin, run_id) == []
        row = await admin.fetchrow("SELECT status::text, lease_worker_id FROM zeroth.runs "
                                   "WHERE run_id = $1", run_id)
        assert tuple(row) == ("pending", "w1")


    @pytest.mark.parametrize(("call", "args"), [
        ("complete_runs", "run_ids => $1::uuid[] || $1::uuid[], generations => $2::bigint[] || "
                          "$2::bigint[]"),
        ("complete_runs", "run_ids => $1::uuid[], generations => $2::bigint[] || 7::bigint"),
        ("complete_runs", "run_ids => $1::uuid[], generations => $2::bigint[], "
                          "outputs => ARRAY['1', '2']::jsonb[]"),
        ("complete_runs", "run_ids => $1::uuid[], generations => $2::bigint[], "
                          "outputs => '[0:0]={1}'::jsonb[]"),
        ("complete_runs", "run_ids => $1::uuid[] || NULL::uuid, generations => $2::bigint[] || "
                          "1::bigint"),
        ("complete_runs", "run_ids => $1::uuid[], generations => $2::bigint[], worker_id => ''"),
        ("complete_and_claim", "deployment_ref => 'd', run_ids => $1::uuid[], "
                               "generations => $2::bigint[], batch_size => 0"),
        ("complete_and_claim", "deployment_ref => 'd', run_ids => $1::uuid[], "
                               "generations => $2::bigint[], lease_seconds => -1"),
        ("complete_and_claim", "deployment_ref => '', run_ids => $1::uuid[], "
                               "generations => $2::bigint[]"),
    ])
    async def test_bad_batch_input_raises_zp_and_writes_no_history(
            self, login, admin, call, args):
        """Refused whole: a live completion in the same call is not kept, nor its history row
        (complete_and_claim's claim arguments are checked after its completions ran)."""
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        if "worker_id" not in args:
            args += ", worker_id => 'w1'"
        if "tenant_id" not in args:
            args += ", tenant_id => 'acme'"
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetch(f"SELECT * FROM zeroth.{call}({args})", [run_id], [generation])
        assert err.value.sqlstate.startswith("ZP"), err.value
        assert await ended(admin, run_id) == []
        assert await admin.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id) == "running"


class TestReaderScope:
    async def test_a_reader_sees_only_its_tenants_batch_written_rows(self, login, admin):
        """The completions write their history rows themselves, with the scope of the call: a
        reader naming one tenant sees that tenant's rows (every workspace) and no other's."""
        worker = await login("worker")
        mine = []
        for tenant in ("acme", "globex"):
            for workspace in (None, "ws"):
                await admin.fetchval(
                    "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', "
                    "tenant_id => $1, workspace_id => $2)", tenant, workspace)
                (row,) = await worker.fetch(CLAIM_ON, "d", tenant, workspace)
                rows = await worker.fetch(
                    "SELECT completed FROM zeroth.complete_and_claim(deployment_ref => 'none', "
                    "worker_id => 'w1', run_ids => $1::uuid[], generations => $2::bigint[], "
                    "tenant_id => $3, workspace_id => $4)",
                    [row["run_id"]], [row["lease_generation"]], tenant, workspace)
                assert rows[0]["completed"] == [True]
                if tenant == "acme":
                    mine.append((row["run_id"], workspace))
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        seen = await reader.fetch(
            "SELECT run_id, workspace_id, outcome FROM zeroth.attempt_history")
        assert sorted((r["run_id"], r["workspace_id"], r["outcome"]) for r in seen) == sorted(
            (run, ws, "completed") for run, ws in mine)
        assert await reader.fetchval(
            "SELECT count(*) FROM zeroth.run_attempts WHERE tenant_id <> 'acme'") == 0


