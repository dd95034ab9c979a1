"""A parent waiting for children is woken once, after the last awaited end, whatever happens to
the children: redrives, a DBA's DELETE or UPDATE, other scopes. On a shipped database.

* a child ended, redriven and ended again wakes an all wait once, after the last end; an any wait
  woken then redriven waits for a new end; a skipped wake-up (met_at) is unmarked by the redrive;
  an operator redriving a cancelled family gets one wake after the new ends;
* a DBA flipping an ended child is not counted twice; a member of zeroth_owner reopening a child
  by hand recounts; bad redrives raise ZP and change nothing; no product role can redrive,
  delete or reopen a child or touch a wait;
* a DBA deleting an awaited child (pending, running, waiting, ended, redriven) counts it once,
  and the child's holder lands nothing; deleting a parent with its children in one statement;
* another tenant's or workspace's child whose parent has the same run id never touches this
  scope; seeded random walks keep a waiting parent's count the truth after every step.

Races of the same: tests/races/test_child_wait_races.py.
"""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import asyncpg
import pytest
from roles import dsn_as, login_role

HISTORY = """SELECT a.lease_generation, a.worker_id, a.outcome FROM zeroth.run_attempts a
              WHERE a.run_id = $1 ORDER BY a.lease_generation, a.ended_at"""


async def ended(admin: asyncpg.Connection, run_id: Any) -> list[tuple[Any, ...]]:
    """The ended attempts of a run, straight from zeroth.run_attempts."""
    return [tuple(r) for r in await admin.fetch(HISTORY, run_id)]


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
