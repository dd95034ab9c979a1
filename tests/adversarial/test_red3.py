"""Red team 3: attacks on issue 16 (commit 832d743) — the attempt history written set-based by
the completions, and the triggers for redriven and deleted child runs — as the roles the product
keeps out and as a DBA, on a database exactly as shipped. Races: tests/races/test_red3_races.py.

Each test is one attack; it passes when the promise held:

* attempt history: a DBA completing a run by hand leaves exactly one row as a superuser, as a
  LOGIN member of zeroth_owner, and as zeroth_owner itself (SET ROLE / SET SESSION AUTHORIZATION:
  was a break, zero rows — the trigger skipped every running → completed update made as
  zeroth_owner; it now also needs the mark the two completion writers set for their call only);
  the mark set by a superuser or a worker never skips a row; no product role is a member of
  zeroth_owner; only complete_run and zeroth._complete_locked_runs complete runs and carry the
  mark; mixed, cross-scope and malformed batches record exactly the live completions (ZP and
  nothing written for bad input, complete_and_claim included);
* child runs: a child ended, redriven and ended again wakes an all wait once, after the last
  end; an any wait woken then redriven waits for a new end; a skipped wake-up (met_at) is
  unmarked by the redrive; a DBA flipping an ended child is not counted twice; a member of
  zeroth_owner reopening a child by hand recounts; bad redrives raise ZP and change nothing; no
  product role can redrive, delete or reopen a child or touch a wait; a DBA deleting an awaited
  child (pending, running, waiting, ended, redriven) counts it once, its holder lands nothing;
  another tenant's or workspace's child whose parent has the same run id never touches this
  scope; seeded random walks keep a waiting parent's count the truth after every step.

One break fixed in the races module: a child's redrive deadlocked with prune_runs deleting its
ended parent (the reopen trigger now takes wait rows only while the parent waits for children).
"""

from __future__ import annotations

import json
import random
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
    """The trigger leaves exactly two writers' completions to them; no other function may move a
    run to completed, and only those two may carry the mark."""

    async def test_only_complete_run_and_complete_locked_runs_complete_runs_and_carry_the_mark(
            self, admin):
        rows = await admin.fetch(
            """SELECT p.proname::text AS name, p.prosrc AS source,
                      coalesce(array_to_string(p.proconfig, ' '), '') AS config
                 FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace""")
        completing = {r["name"] for r in rows
                      if re.search(r"SET\s+status\s*=\s*'completed'", r["source"], re.I)}
        assert completing == {"complete_run", "_complete_locked_runs"}
        raise_mark = "set_config('zeroth.completion_records_attempt', 'on', true)"
        lower_mark = "set_config('zeroth.completion_records_attempt', 'off', true)"
        assert {r["name"] for r in rows if "completion_records_attempt" in r["source"]} \
            == completing
        for r in rows:
            # No SET clause carries the mark (it needs a superuser's grant at install).
            assert "completion_records_attempt" not in r["config"], r["name"]
            if r["name"] in completing:
                assert "INSERT INTO zeroth.run_attempts" in r["source"], r["name"]
                # Raised once just before the completing statement and lowered once after it,
                # so it never outlives the call.
                source = r["source"]
                assert source.count(raise_mark) == 1, r["name"]
                assert source.count(lower_mark) == 1, r["name"]
                raised, lowered = source.index(raise_mark), source.index(lower_mark)
                completing_at = re.search(r"SET\s+status\s*=\s*'completed'", source).start()
                assert raised < completing_at < lowered, r["name"]


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


# -- child runs: redriven and deleted children (triggers runs_child_run_reopened / _deleted) --

START_ON = """SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'w1',
                  generation => $2, step_key => $3, deployment_ref => $3, max_attempts => 1,
                  tenant_id => $4, workspace_id => $5)"""
CLAIM_ON = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $1,
                  worker_id => 'w1', tenant_id => $2, workspace_id => $3, lease_seconds => 60)
               WHERE run_id IS NOT NULL"""
WAIT_ON = """SELECT outcome, children::text AS children FROM zeroth.wait_for_children(
                 run_id => $1, worker_id => 'w1', generation => $2, step_key => $3,
                 child_run_ids => $4::uuid[], mode => $5, tenant_id => $6, workspace_id => $7)"""
END_CHILD = {
    "complete": """SELECT zeroth.complete_run(run_id => $1, worker_id => 'w1', generation => $2,
                       output => '{"v": 1}', tenant_id => $3, workspace_id => $4)::text""",
    "fail": """SELECT zeroth.fail_run(run_id => $1, worker_id => 'w1', generation => $2,
                   error => '{"boom": 1}', retryable => false, tenant_id => $3,
                   workspace_id => $4)""",
}
REDRIVE = "SELECT zeroth.redrive_run(run_id => $1, tenant_id => $2, workspace_id => $3)"
WAITS = """SELECT step_key, remaining, met_at IS NOT NULL AS met FROM zeroth.child_waits
            WHERE parent_run_id = $1 AND tenant_id = $2 ORDER BY step_key"""


class Family:
    """A parent run held by worker w1 in one scope, with one child per key, each child on a
    deployment named after its key (so a claim takes exactly that child)."""

    def __init__(self, admin: asyncpg.Connection, worker: asyncpg.Connection,
                 tenant: str = "acme", workspace: str | None = None) -> None:
        self.admin, self.worker, self.tenant, self.workspace = admin, worker, tenant, workspace
        self.run_id: Any = None
        self.generation = 0
        self.kids: dict[str, Any] = {}
        self.leases: dict[str, int] = {}

    async def start(self, *keys: str, run_id: Any = None) -> Family:
        self.run_id = await self.admin.fetchval(
            "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1, "
            "workspace_id => $2, run_id => $3)", self.tenant, self.workspace, run_id)
        await self.claim_parent()
        for key in keys:
            self.kids[key] = await self.worker.fetchval(
                START_ON, self.run_id, self.generation, key, self.tenant, self.workspace)
        return self

    async def claim_parent(self) -> None:
        (row,) = await self.worker.fetch(CLAIM_ON, "d", self.tenant, self.workspace)
        assert row["run_id"] == self.run_id
        self.generation = row["lease_generation"]

    async def wait(self, keys: list[str], mode: str = "all", step: str = "w") -> tuple[Any, Any]:
        row = await self.worker.fetchrow(WAIT_ON, self.run_id, self.generation, step,
                                         [self.kids[k] for k in keys], mode, self.tenant,
                                         self.workspace)
        return row["outcome"], None if row["children"] is None else json.loads(row["children"])

    async def run(self, key: str) -> None:
        (row,) = await self.worker.fetch(CLAIM_ON, key, self.tenant, self.workspace)
        assert row["run_id"] == self.kids[key]
        self.leases[key] = row["lease_generation"]

    async def end(self, key: str, how: str = "complete") -> None:
        if key not in self.leases:
            await self.run(key)
        got = await self.worker.fetchval(END_CHILD[how], self.kids[key], self.leases.pop(key),
                                         self.tenant, self.workspace)
        assert got == {"complete": "true", "fail": "failed"}[how]

    async def redrive(self, key: str) -> None:
        assert await self.admin.fetchval(REDRIVE, self.kids[key], self.tenant,
                                         self.workspace) is True

    async def status(self, run: Any = None) -> str:
        return await self.admin.fetchval(
            "SELECT status::text FROM zeroth.runs WHERE run_id = $1 AND tenant_id = $2 "
            "AND workspace_id IS NOT DISTINCT FROM $3",
            self.run_id if run is None else run, self.tenant, self.workspace)

    async def remaining(self, step: str = "w") -> int | None:
        return await self.admin.fetchval(
            "SELECT remaining FROM zeroth.child_waits WHERE parent_run_id = $1 AND "
            "tenant_id = $2 AND workspace_key = $3 AND step_key = $4", self.run_id, self.tenant,
            "" if self.workspace is None else f"w:{self.workspace}", step)

    async def scope_rows(self) -> tuple[Any, ...]:
        """Every row of this scope in runs, child_runs, child_waits, run_steps, run_attempts."""
        wskey = "" if self.workspace is None else f"w:{self.workspace}"
        out = []
        for relation in ("runs", "child_runs", "child_waits", "run_steps", "run_attempts"):
            out.append([tuple(r) for r in await self.admin.fetch(
                f"SELECT t.* FROM zeroth.{relation} t WHERE t.tenant_id = $1 "
                f"AND t.workspace_key = $2 ORDER BY t::text", self.tenant, wskey)])
        return tuple(out)


class TestRedrivenChildren:
    async def test_end_redrive_end_again_wakes_an_all_wait_once_after_the_last_end(
            self, login, admin):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.end("k1", "fail")
        assert (await f.status(), await f.remaining()) == ("waiting", 1)
        await f.redrive("k1")
        assert (await f.status(), await f.remaining()) == ("waiting", 2)
        await f.end("k1")  # its second end counts once
        assert (await f.status(), await f.remaining()) == ("waiting", 1)
        await f.end("k2")
        assert (await f.status(), await f.remaining()) == ("pending", 0)
        await f.claim_parent()
        outcome, children = await f.wait(["k1", "k2"])
        assert outcome == "ready"
        assert [(c["status"], c["output"]) for c in children] == [
            ("completed", {"v": 1}), ("completed", {"v": 1})]

    async def test_an_any_wait_woken_by_a_child_then_redriven_waits_for_a_new_end(
            self, login, admin):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"], "any"))[0] == "waiting"
        await f.end("k1", "fail")
        assert await f.status() == "pending"  # woken by the first end
        await f.redrive("k1")  # before the parent replays its wait: k1 has not ended now
        await f.claim_parent()
        assert (await f.wait(["k1", "k2"], "any"))[0] == "waiting"
        assert await f.remaining() == 2
        await f.end("k2")
        assert await f.status() == "pending"
        await f.claim_parent()
        outcome, children = await f.wait(["k1", "k2"], "any")
        assert outcome == "ready"
        assert [c["status"] for c in children] == [None, "completed"]

    async def test_a_skipped_any_wake_up_is_unmarked_by_the_redrive(self, login, admin, connect):
        """The parent's row is held when k1 ends: the wait is marked met (met_at) for the sweep.
        k1 is redriven before the sweep: the wait is no longer met, so the sweep wakes nothing;
        the parent wakes when k2 ends."""
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"], "any"))[0] == "waiting"
        locker = await connect()
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE", f.run_id)
        await f.end("k1", "fail")
        await tx.commit()
        assert await admin.fetch(WAITS, f.run_id, "acme") == [("w", 1, True)]
        await f.redrive("k1")
        assert await admin.fetch(WAITS, f.run_id, "acme") == [("w", 2, False)]
        assert await admin.fetchval("SELECT zeroth.wake_due_waits()") == 0
        assert await f.status() == "waiting"
        await f.end("k2")
        assert await f.status() == "pending"

    async def test_a_dba_flipping_an_ended_child_between_ends_counts_it_once(
            self, login, admin):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.end("k1")
        await admin.execute("UPDATE zeroth.runs SET status = 'failed', error = '{\"dba\": 1}' "
                            "WHERE run_id = $1", f.kids["k1"])
        # ended → ended is no new end (runs_child_run_finished fires on active → ended): not
        # counted again, and the parent keeps the outcome it was told first.
        assert (await f.status(), await f.remaining()) == ("waiting", 1)
        await f.end("k2")
        assert await f.status() == "pending"

    async def test_a_login_member_of_zeroth_owner_reopening_a_child_by_hand_recounts(
            self, login, admin, pg_server_dsn, database_dsn):
        """The triggers run as the DBA's role: a member of zeroth_owner (not a superuser) sees
        the owner-only child tables through its membership, so its reopen is not lost."""
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.end("k1")
        assert await f.remaining() == 1
        with login_role(pg_server_dsn, "zeroth_owner") as (name, password):
            ops = await asyncpg.connect(dsn_as(database_dsn, name, password))
            try:
                await ops.execute("UPDATE zeroth.runs SET status = 'pending', finished_at = NULL "
                                  "WHERE run_id = $1", f.kids["k1"])
            finally:
                await ops.close()
        assert (await f.status(), await f.remaining()) == ("waiting", 2)
        await f.end("k2")
        assert await f.status() == "waiting"
        await f.end("k1")
        assert await f.status() == "pending"

    async def test_an_operator_redriving_a_cancelled_family_gets_one_wake_after_the_new_ends(
            self, login, admin):
        """The parent is cancelled while it waits (its attached children with it); the operator
        redrives the children, then the parent (neither is waiting when the children reopen:
        the parent's old wait row is left to its replay). The replayed wait waits for the
        children's new ends and is woken once, after the last."""
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        assert await admin.fetchval(
            "SELECT outcome FROM zeroth.request_cancel_v2(run_id => $1, action => 'cancel', "
            "tenant_id => 'acme')", f.run_id) == "cancelled"
        assert [await f.status(f.kids[k]) for k in ("k1", "k2")] == ["cancelled", "cancelled"]
        await f.redrive("k1")
        await f.redrive("k2")
        assert await admin.fetchval(REDRIVE, f.run_id, "acme", None) is True
        await f.claim_parent()
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        assert await f.remaining() == 2
        await f.end("k1")
        assert await f.status() == "waiting"
        await f.end("k2")
        assert await f.status() == "pending"
        await f.claim_parent()
        outcome, children = await f.wait(["k1", "k2"])
        assert outcome == "ready"
        assert [c["status"] for c in children] == ["completed", "completed"]


    @pytest.mark.parametrize("call", ["null", "pending", "unknown", "other_tenant",
                                      "other_workspace"])
    async def test_a_bad_redrive_of_a_child_raises_zp_and_changes_nothing(
            self, login, admin, call):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.end("k1", "fail")
        args = {"null": (None, "acme", None), "pending": (f.kids["k2"], "acme", None),
                "unknown": (uuid.uuid4(), "acme", None),
                "other_tenant": (f.kids["k1"], "globex", None),
                "other_workspace": (f.kids["k1"], "acme", "ws")}[call]
        before = await f.scope_rows()
        with pytest.raises(asyncpg.PostgresError) as err:
            await admin.fetchval(REDRIVE, *args)
        assert err.value.sqlstate.startswith("ZP"), err.value
        assert await f.scope_rows() == before


    @pytest.mark.parametrize("kind", ["nobody", "reader", "worker"])
    async def test_no_product_role_can_redrive_delete_or_reopen_a_child(
            self, login, admin, kind):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.end("k1", "fail")
        hostile = await login(kind)
        if kind == "reader":
            await hostile.execute("SET zeroth.tenant_id = 'acme'")
        before = await f.scope_rows()
        for statement in (
                REDRIVE,
                "DELETE FROM zeroth.runs WHERE run_id = $1 AND $2::text IS NOT DISTINCT FROM $2 "
                "AND $3::text IS NOT DISTINCT FROM $3",
                "UPDATE zeroth.runs SET status = 'pending' WHERE run_id = $1 "
                "AND $2::text IS NOT DISTINCT FROM $2 AND $3::text IS NOT DISTINCT FROM $3",
                "UPDATE zeroth.child_runs SET status = NULL, finished_at = NULL "
                "WHERE child_run_id = $1 AND $2::text IS NOT DISTINCT FROM $2 "
                "AND $3::text IS NOT DISTINCT FROM $3",
                "UPDATE zeroth.child_waits SET remaining = 0 WHERE $1::uuid = ANY (child_run_ids) "
                "AND $2::text IS NOT DISTINCT FROM $2 AND $3::text IS NOT DISTINCT FROM $3"):
            for run in (f.kids["k1"], f.kids["k2"]):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await hostile.execute(statement, run, "acme", None)
        assert await f.scope_rows() == before


class TestDeletedChildren:
    @pytest.mark.parametrize("state", ["pending", "running", "waiting", "completed",
                                       "redriven"])
    async def test_a_dba_deleting_an_awaited_child_counts_it_once(self, login, admin, state):
        worker = await login("worker")
        f = await Family(admin, worker).start("victim", "other")
        assert (await f.wait(["victim", "other"]))[0] == "waiting"
        if state in ("running", "waiting"):
            await f.run("victim")
        if state == "waiting":
            assert await worker.fetchval(
                "SELECT zeroth.pause_run(run_id => $1, worker_id => 'w1', generation => $2, "
                "reason => 'dba', tenant_id => 'acme')", f.kids["victim"],
                f.leases["victim"]) is True
        if state in ("completed", "redriven"):
            await f.end("victim", "complete" if state == "completed" else "fail")
        if state == "redriven":
            await f.redrive("victim")
        assert await f.status(f.kids["victim"]) == state.replace("redriven", "pending")
        await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", f.kids["victim"])
        assert (await f.status(), await f.remaining()) == ("waiting", 1)
        await f.end("other")
        assert (await f.status(), await f.remaining()) == ("pending", 0)
        await f.claim_parent()
        outcome, children = await f.wait(["victim", "other"])
        assert outcome == "ready"
        victim = children[0]
        if state == "completed":
            assert (victim["status"], victim["output"]) == ("completed", {"v": 1})
        else:
            assert victim["status"] == "cancelled"
            assert victim["error"]["deleted_status"] == state.replace("redriven", "pending")

    async def test_the_holder_of_a_deleted_child_lands_nothing(self, login, admin):
        worker = await login("worker")
        f = await Family(admin, worker).start("victim", "other")
        assert (await f.wait(["victim", "other"]))[0] == "waiting"
        await f.run("victim")
        await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", f.kids["victim"])
        before = await f.scope_rows()
        # Its lease went with the row: fenced out (complete_run false, fail_run NULL).
        for how, refused in (("complete", "false"), ("fail", None)):
            assert await worker.fetchval(END_CHILD[how], f.kids["victim"], f.leases["victim"],
                                         "acme", None) == refused
        assert await f.scope_rows() == before
        assert await f.remaining() == 1

    async def test_a_dba_deleting_a_parent_with_its_children_in_one_statement(
            self, login, admin):
        worker = await login("worker")
        f = await Family(admin, worker).start("k1", "k2")
        assert (await f.wait(["k1", "k2"]))[0] == "waiting"
        await f.run("k1")
        bystander = await Family(admin, worker, tenant="globex").start("k1")
        assert (await bystander.wait(["k1"]))[0] == "waiting"
        theirs = await bystander.scope_rows()
        await admin.execute("DELETE FROM zeroth.runs WHERE run_id = ANY ($1::uuid[])",
                            [f.run_id, *f.kids.values()])
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.child_runs WHERE parent_run_id = $1", f.run_id) == 0
        assert await bystander.scope_rows() == theirs


class TestChildScopes:
    """Another scope's child, whose parent has the same run id (enqueue_run takes a caller's
    run_id), ends, is redriven and is deleted: this scope's parent, links and waits never move."""

    @pytest.mark.parametrize(("tenant", "workspace"), [("globex", None), ("acme", "ws")])
    async def test_another_scopes_child_never_touches_this_scopes_parent(
            self, login, admin, tenant, workspace):
        worker = await login("worker")
        mine = await Family(admin, worker).start("k1")
        assert (await mine.wait(["k1"]))[0] == "waiting"
        theirs = await Family(admin, worker, tenant=tenant, workspace=workspace).start(
            "k1", run_id=mine.run_id)
        assert theirs.run_id == mine.run_id
        assert (await theirs.wait(["k1"]))[0] == "waiting"
        before = await mine.scope_rows()
        await theirs.end("k1", "fail")
        assert await theirs.status() == "pending"
        await theirs.redrive("k1")
        await theirs.claim_parent()
        assert (await theirs.wait(["k1"]))[0] == "waiting"
        await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", theirs.kids["k1"])
        assert await theirs.status() == "pending"
        assert await mine.scope_rows() == before
        assert await mine.status() == "waiting"


class TestRandomWalk:
    """Seeded random walks over one parent and three children: ends (completed, failed),
    redrives, DBA deletes, ends while another session holds the parent's row (a skipped wake-up),
    sweeps, the woken parent's replays and a running parent's new waits (a ready wait records the
    step, the next wait takes a new step key). After every step: each child's outcome copy says
    whether it has ended; while the parent waits, its wait's count is the number of listed
    children not ended, and it waits only while the wait is not met (or marked for the sweep); a
    wait is ready exactly when it is met."""

    @pytest.mark.parametrize("seed", range(12))
    async def test_the_wait_count_is_the_truth_after_every_step(
            self, login, admin, connect, seed):
        rng = random.Random(seed)
        mode = "all" if seed % 2 == 0 else "any"
        worker = await login("worker")
        keys = ["k1", "k2", "k3"]
        f = await Family(admin, worker).start(*keys)
        locker = await connect()
        step = 0
        outcome, _ = await f.wait(keys, mode, step=f"w{step}")
        assert outcome == "waiting"
        deleted: set[str] = set()
        log: list[str] = []
        for _ in range(60):
            states = {k: (None if k in deleted else await f.status(f.kids[k])) for k in keys}
            choices = []
            for k, st in states.items():
                if st in ("pending", "running"):
                    choices += [("end", k, "complete"), ("end", k, "fail"),
                                ("locked_end", k, "fail")]
                if st in ("failed", "cancelled"):
                    choices += [("redrive", k, None)] * 3
                if st is not None and rng.random() < 0.08:
                    choices.append(("delete", k, None))
                if st == "pending" and k not in f.leases:
                    choices.append(("claim", k, None))
            choices.append(("sweep", None, None))
            parent = await f.status()
            if parent in ("pending", "running"):  # woken, or running after a ready wait
                choices += [("wait", None, parent)] * 2
            op, key, how = rng.choice(choices)
            log.append(f"{op} {key or ''} {how or ''}".strip())
            if op == "end":
                await f.end(key, how)
            elif op == "claim":
                await f.run(key)
            elif op == "locked_end":
                tx = locker.transaction()
                await tx.start()
                await locker.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR UPDATE",
                                     f.run_id)
                await f.end(key, how)
                await tx.commit()
            elif op == "redrive":
                await f.redrive(key)
                f.leases.pop(key, None)
            elif op == "delete":
                await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", f.kids[key])
                deleted.add(key)
                f.leases.pop(key, None)
            elif op == "sweep":
                await admin.fetchval("SELECT zeroth.wake_due_waits()")
            elif op == "wait":  # a woken parent replays its wait; a running one waits anew
                if how == "pending":
                    await f.claim_parent()
                outcome, _ = await f.wait(keys, mode, step=f"w{step}")
                assert outcome == ("ready" if await self.met(f, mode) else "waiting"), log
                if outcome == "ready":  # recorded; the parent runs on, its next wait a new key
                    step += 1
            await self.check(f, keys, mode, deleted, f"w{step}", log)
        # The rest end: a parent still waiting must be woken (by the ends, or the sweep).
        for k in keys:
            if k not in deleted and await f.status(f.kids[k]) in ("pending", "running"):
                await f.end(k)
        await admin.fetchval("SELECT zeroth.wake_due_waits()")
        assert await f.status() in ("pending", "running"), log
        assert step >= 1, log  # the walk got at least one wait recorded

    @staticmethod
    async def met(f: Family, mode: str) -> bool:
        ended_now = await f.admin.fetchval(
            "SELECT count(status) FROM zeroth.child_runs WHERE parent_run_id = $1", f.run_id)
        return ended_now == 3 if mode == "all" else ended_now >= 1

    async def check(self, f: Family, keys: list[str], mode: str, deleted: set[str], step: str,
                    log: list[str]) -> None:
        for k in keys:
            copy = await f.admin.fetchval(
                "SELECT status::text FROM zeroth.child_runs WHERE child_run_id = $1", f.kids[k])
            if k in deleted:
                assert copy is not None, (k, log)
                continue
            st = await f.status(f.kids[k])
            assert (copy is None) == (st in ("pending", "running", "waiting")), (k, st, copy, log)
        if await f.status() != "waiting":
            return
        ended_now = await f.admin.fetchval(
            "SELECT count(status) FROM zeroth.child_runs WHERE parent_run_id = $1", f.run_id)
        assert await f.remaining(step) == 3 - ended_now, log
        marked = await f.admin.fetchval(
            "SELECT met_at IS NOT NULL FROM zeroth.child_waits WHERE parent_run_id = $1 "
            "AND step_key = $2", f.run_id, step)
        assert not await self.met(f, mode) or marked, ("a met wait left unmarked", log)
