"""Red team 2: attacks on the code merged for child runs (0014), the dashboard views (0015) and
the attempt history (0016), as the roles the product keeps out, on a database exactly as shipped.

Each test is one attack; it passes when the promise held:

* child runs: bad child id lists and cycles raise a ZP error and change nothing; a cancelled
  parent cascades to attached children only; a wake-up skipped while the parent's row was locked
  is made by wake_due_waits; a DBA deleting an awaited child wakes the parent;
* internal helpers cannot be called by any hostile role;
* the attempt history: a reader sees no other tenant's open attempt (the zeroth.runs part of the
  view); a DBA's manual updates never raise;
* the dashboard views and the tables under them: a reader naming one tenant sees that tenant's
  rows only (wait_list does not join another tenant's event of the same name); a worker and a
  role with no grant read none of them;
* least privilege from the catalog: each role executes, reads and writes only what sql/README.md
  grants it.

Both once open (held as strict xfails until fixed): a DBA's DELETE of an awaited child now ends
the wait as a cancelled child (trigger runs_child_run_deleted); a wait made after a child's redrive
waits for its new end (trigger runs_child_run_reopened clears the outcome copy).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from roles import readme_grants

ENQUEUE = "SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', tenant_id => $1)"
CLAIM = """SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => $3,
               worker_id => $1, tenant_id => $2, lease_seconds => 60) WHERE run_id IS NOT NULL"""
START = """SELECT child_run_id, created FROM zeroth.start_child_run(run_id => $1, worker_id => $2,
               generation => $3, step_key => $4, deployment_ref => 'child-d',
               payload => '{"x": 1}', tenant_id => $5, detached => $6)"""
WAIT = """SELECT outcome, children::text AS children FROM zeroth.wait_for_children(run_id => $1,
              worker_id => $2, generation => $3, step_key => '#children',
              child_run_ids => $4::uuid[], tenant_id => $5)"""
COMPLETE = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => '{"v": 1}', tenant_id => $4)"""

#: The dashboard's views and the tables they read, which a reader may select from.
VIEWS = ("scope_overview", "run_list", "run_activity", "checkpoint_list", "step_list", "wait_list",
         "attempt_history", "queue_depth", "live_leases", "expired_leases", "dead_letters",
         "child_list")
READER_TABLES = ("runs", "checkpoints", "run_steps", "events", "event_waits", "run_attempts",
                 "child_runs")


async def snapshot(admin: asyncpg.Connection) -> tuple[Any, ...]:
    out = []
    for relation in ("runs", "child_runs", "child_waits", "run_steps", "run_attempts"):
        out.append([tuple(r) for r in await admin.fetch(
            f"SELECT t.* FROM zeroth.{relation} t ORDER BY t::text")])
    return tuple(out)


async def held(admin, worker, tenant="acme", worker_id="w1", deployment="d") -> tuple[Any, int]:
    if deployment == "d":
        await admin.fetchval(ENQUEUE, tenant)
    (row,) = await worker.fetch(CLAIM, worker_id, tenant, deployment)
    return row["run_id"], row["lease_generation"]


async def family(admin, worker, tenant="acme", detached=(False,)) -> tuple[Any, int, list[Any]]:
    """A held parent and its children (started, pending)."""
    run_id, generation = await held(admin, worker, tenant)
    children = []
    for i, flag in enumerate(detached):
        row = await worker.fetchrow(START, run_id, "w1", generation, f"c{i}", tenant, flag)
        children.append(row["child_run_id"])
    return run_id, generation, children


async def status(admin, run_id) -> str:
    return await admin.fetchval("SELECT status::text FROM zeroth.runs WHERE run_id = $1", run_id)


class TestChildRuns:
    @pytest.mark.parametrize("ids", ["empty", "null_list", "null_in", "duplicate", "huge"])
    async def test_bad_child_id_lists_raise_zp_and_change_nothing(self, login, admin, ids):
        worker = await login("worker")
        run_id, generation, (child,) = await family(admin, worker)
        lists: dict[str, Any] = {"empty": [], "null_list": None, "null_in": [child, None],
                                 "duplicate": [child, child],
                                 "huge": [child] + [f"00000000-0000-0000-0000-{i:012d}"
                                                    for i in range(10_000)]}
        before = await snapshot(admin)
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetch(WAIT, run_id, "w1", generation, lists[ids], "acme")
        assert err.value.sqlstate.startswith("ZP"), err.value
        assert await snapshot(admin) == before

    @pytest.mark.parametrize(("argument", "value"), [
        ("mode", "'ALL'"), ("mode", "NULL"), ("step_key", "''"), ("step_key", "NULL"),
        ("step_key", "repeat('k', 401)"), ("run_id", "NULL"), ("worker_id", "NULL"),
        ("worker_id", "''"), ("generation", "NULL"),
        ("workspace_id", "'ws', tenant_id => NULL"),
    ])
    async def test_bad_wait_for_children_input_raises_zp_and_changes_nothing(
            self, login, admin, argument, value):
        worker = await login("worker")
        run_id, generation, (child,) = await family(admin, worker)
        arguments = {"run_id": "$1", "worker_id": "'w1'", "generation": "$2",
                     "step_key": "'w'", "child_run_ids": "ARRAY[$3]::uuid[]", "mode": "'all'",
                     "tenant_id": "'acme'"}
        arguments[argument] = value
        if argument == "workspace_id":
            del arguments["tenant_id"]
        call = ", ".join(f"{k} => {v}" for k, v in arguments.items())
        before = await snapshot(admin)
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetch(f"SELECT * FROM zeroth.wait_for_children({call}) "
                               "WHERE $1::uuid IS NOT NULL AND $2::bigint IS NOT NULL",
                               run_id, generation, child)
        assert err.value.sqlstate.startswith("ZP"), err.value
        assert await snapshot(admin) == before

    async def test_no_cycle_a_child_cannot_await_its_parent_nor_a_parent_its_grandchild(
            self, login, admin):
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        child_held, child_generation = await held(admin, worker, deployment="child-d")
        assert child_held == child
        grandchild = (await worker.fetchrow(START, child, "w1", child_generation, "g", "acme",
                                            False))["child_run_id"]
        before = await snapshot(admin)
        for run_id, gen, others in ((child, child_generation, [parent]),
                                    (child, child_generation, [child]),
                                    (parent, generation, [grandchild]),
                                    (parent, generation, [parent])):
            with pytest.raises(asyncpg.PostgresError) as err:
                await worker.fetch(WAIT, run_id, "w1", gen, others, "acme")
            assert err.value.sqlstate == "ZP008"
        assert await snapshot(admin) == before

    async def test_a_cancelled_parent_cancels_attached_children_only(self, login, admin):
        worker = await login("worker")
        parent, generation, (attached, detached) = await family(
            admin, worker, detached=(False, True))
        row = await worker.fetchrow(WAIT, parent, "w1", generation, [attached, detached], "acme")
        assert row["outcome"] == "waiting"
        await admin.fetchval("SELECT zeroth.request_cancel(run_id => $1, tenant_id => 'acme')",
                             parent)
        assert await status(admin, parent) == "cancelled"
        assert await status(admin, attached) == "cancelled"
        assert await status(admin, detached) == "pending"
        # The detached child may still end; the cancelled parent is not woken nor changed.
        before = await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE run_id = $1", parent)
        child_run, child_generation = await held(admin, worker, deployment="child-d")
        assert child_run == detached
        assert await worker.fetchval(COMPLETE, detached, "w1", child_generation, "acme") is True
        assert await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE run_id = $1",
                                    parent) == before

    async def test_a_wake_up_skipped_under_a_locked_parent_is_made_by_the_sweep(
            self, login, admin, connect):
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        assert (await worker.fetchrow(WAIT, parent, "w1", generation, [child],
                                      "acme"))["outcome"] == "waiting"
        child_run, child_generation = await held(admin, worker, deployment="child-d")
        assert child_run == child
        locker = await connect()
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM zeroth.runs WHERE run_id = $1 FOR NO KEY UPDATE",
                             parent)
        assert await worker.fetchval(COMPLETE, child, "w1", child_generation, "acme") is True
        await tx.commit()
        assert await status(admin, parent) == "waiting"  # skipped, marked
        assert await admin.fetchval(
            "SELECT met_at IS NOT NULL FROM zeroth.child_waits WHERE parent_run_id = $1", parent)
        assert await admin.fetchval("SELECT zeroth.wake_due_waits()") == 1
        assert await status(admin, parent) == "pending"
        # The woken parent replays its wait and gets the child's outcome, once.
        again, generation2 = await held(admin, worker)
        assert again == parent
        row = await worker.fetchrow(WAIT, parent, "w1", generation2, [child], "acme")
        assert row["outcome"] == "ready"
        assert '"v": 1' in row["children"]

    async def test_a_dba_deleting_an_awaited_child_does_not_strand_the_parent(
            self, login, admin):
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        assert (await worker.fetchrow(WAIT, parent, "w1", generation, [child],
                                      "acme"))["outcome"] == "waiting"
        await admin.execute("DELETE FROM zeroth.runs WHERE run_id = $1", child)
        await admin.fetchval("SELECT zeroth.wake_due_waits()")
        assert await status(admin, parent) != "waiting"

    @pytest.mark.parametrize(("argument", "value"), [
        ("step_key", "''"), ("step_key", "repeat('k', 401)"), ("step_key", "NULL"),
        ("deployment_ref", "''"), ("deployment_ref", "NULL"), ("payload", "'[1]'"),
        ("payload", "NULL"), ("metadata", "'1'"), ("max_attempts", "0"),
        ("max_attempts", "1001"), ("priority", "NULL"), ("detached", "NULL"),
        ("workspace_id", "'ws'::text, tenant_id => NULL"),
    ])
    async def test_bad_start_child_run_input_raises_zp_and_changes_nothing(
            self, login, admin, argument, value):
        worker = await login("worker")
        run_id, generation = await held(admin, worker)
        arguments = {"step_key": "'k'", "deployment_ref": "'child-d'", "payload": "'{}'",
                     "metadata": "'{}'", "max_attempts": "3", "priority": "0",
                     "detached": "false", "tenant_id": "'acme'"}
        arguments[argument] = value
        if argument == "workspace_id":
            del arguments["tenant_id"]
        call = ", ".join(f"{k} => {v}" for k, v in arguments.items())
        before = await snapshot(admin)
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetch(f"SELECT * FROM zeroth.start_child_run(run_id => $1, "
                               f"worker_id => 'w1', generation => $2, {call})",
                               run_id, generation)
        assert err.value.sqlstate.startswith("ZP"), err.value
        assert await snapshot(admin) == before

    @pytest.mark.parametrize("ended", [False, True])
    async def test_two_processes_of_one_lease_record_one_wait_outcome(
            self, login, admin, ended):
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        if ended:
            _child_run, child_generation = await held(admin, worker, deployment="child-d")
            assert await worker.fetchval(COMPLETE, child, "w1", child_generation, "acme")
        first, second = await login("worker"), await login("worker")
        rows = await asyncio.gather(
            first.fetchrow(WAIT, parent, "w1", generation, [child], "acme"),
            second.fetchrow(WAIT, parent, "w1", generation, [child], "acme"))
        outcomes = sorted(str(tuple(r)) for r in rows)
        if ended:  # both read the one recorded result
            assert rows[0]["outcome"] == rows[1]["outcome"] == "ready"
            assert rows[0]["children"] == rows[1]["children"]
        else:  # one left to wait; the other finds the lease given back
            assert [r["outcome"] for r in rows].count("waiting") == 1, outcomes
            assert [r["outcome"] for r in rows].count(None) == 1, outcomes
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.run_steps WHERE run_id = $1 AND step_key = '#children'",
            parent) == (1 if ended else 0)

    async def test_a_child_redriven_after_the_parent_recorded_its_outcome_changes_nothing(
            self, login, admin):
        worker = await login("worker")
        parent, generation = await held(admin, worker)
        (child,) = await worker.fetch(
            "SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'w1', "
            "generation => $2, step_key => 'c', deployment_ref => 'child-d', max_attempts => 1, "
            "tenant_id => 'acme')", parent, generation)
        child = child["child_run_id"]
        assert (await worker.fetchrow(WAIT, parent, "w1", generation, [child],
                                      "acme"))["outcome"] == "waiting"
        _, child_generation = await held(admin, worker, deployment="child-d")
        assert await worker.fetchval(
            "SELECT zeroth.fail_run(run_id => $1, worker_id => 'w1', generation => $2, "
            "error => '{\"boom\": 1}', tenant_id => 'acme')", child, child_generation
        ) == "dead_lettered"
        assert await status(admin, parent) == "pending"
        _, generation2 = await held(admin, worker)
        recorded = (await worker.fetchrow(WAIT, parent, "w1", generation2, [child],
                                          "acme"))["children"]
        assert '"failed"' in recorded
        assert await admin.fetchval(
            "SELECT zeroth.redrive_run(run_id => $1, tenant_id => 'acme')", child) is True
        _, child_generation2 = await held(admin, worker, deployment="child-d")
        assert await worker.fetchval(COMPLETE, child, "w1", child_generation2, "acme") is True
        # The parent's accepted outcome is the recorded one; its replay returns it unchanged.
        assert await status(admin, parent) == "running"
        assert (await worker.fetchrow(WAIT, parent, "w1", generation2, [child],
                                      "acme"))["children"] == recorded

    async def test_a_wait_after_a_childs_redrive_waits_for_its_new_end(self, login, admin):
        worker = await login("worker")
        parent, generation = await held(admin, worker)
        (row,) = await worker.fetch(
            "SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'w1', "
            "generation => $2, step_key => 'c', deployment_ref => 'child-d', max_attempts => 1, "
            "tenant_id => 'acme')", parent, generation)
        child = row["child_run_id"]
        _, child_generation = await held(admin, worker, deployment="child-d")
        assert await worker.fetchval(
            "SELECT zeroth.fail_run(run_id => $1, worker_id => 'w1', generation => $2, "
            "tenant_id => 'acme')", child, child_generation) == "dead_lettered"
        assert await admin.fetchval(
            "SELECT zeroth.redrive_run(run_id => $1, tenant_id => 'acme')", child) is True
        assert await status(admin, child) == "pending"
        row = await worker.fetchrow(WAIT, parent, "w1", generation, [child], "acme")
        assert row["outcome"] == "waiting", row["children"]

    async def test_workspaces_of_one_tenant_are_separate_scopes(self, login, admin):
        worker = await login("worker")
        held_in = {}
        for ws in ("ws1", "ws2"):
            await admin.fetchval("SELECT run_id FROM zeroth.enqueue_run(deployment_ref => 'd', "
                                 "tenant_id => 'acme', workspace_id => $1)", ws)
            (row,) = await worker.fetch(
                "SELECT run_id, lease_generation FROM zeroth.claim_and_start(deployment_ref => "
                "'d', worker_id => 'w1', tenant_id => 'acme', workspace_id => $1, "
                "lease_seconds => 60) WHERE run_id IS NOT NULL", ws)
            held_in[ws] = (row["run_id"], row["lease_generation"])
        start = ("SELECT child_run_id FROM zeroth.start_child_run(run_id => $1, worker_id => 'w1', "
                 "generation => $2, step_key => 'c', deployment_ref => 'child-d', "
                 "tenant_id => 'acme', workspace_id => $3)")
        wait = ("SELECT outcome FROM zeroth.wait_for_children(run_id => $1, worker_id => 'w1', "
                "generation => $2, step_key => 'w', child_run_ids => $3::uuid[], "
                "tenant_id => 'acme', workspace_id => $4)")
        run1, gen1 = held_in["ws1"]
        run2, gen2 = held_in["ws2"]
        child1 = await worker.fetchval(start, run1, gen1, "ws1")
        before = await snapshot(admin)
        # ws1's parent named in ws2 or in the tenant's default workspace: fenced out.
        for ws in ("ws2", None):
            assert await worker.fetchval(start, run1, gen1, ws) is None
            assert await worker.fetchval(wait, run1, gen1, [child1], ws) is None
        # ws2's parent cannot await ws1's child.
        with pytest.raises(asyncpg.PostgresError) as err:
            await worker.fetch(wait, run2, gen2, [child1], "ws2")
        assert err.value.sqlstate == "ZP008"
        assert await snapshot(admin) == before
        assert await admin.fetchval("SELECT workspace_id FROM zeroth.runs WHERE run_id = $1",
                                    child1) == "ws1"

    @pytest.mark.parametrize("how", ["two_processes", "batch_twice"])
    async def test_a_child_ended_twice_at_once_is_counted_once(self, login, admin, how):
        worker = await login("worker")
        parent, generation, (c1, c2) = await family(admin, worker, detached=(False, False))
        assert (await worker.fetchrow(WAIT, parent, "w1", generation, [c1, c2],
                                      "acme"))["outcome"] == "waiting"
        claimed = dict([await held(admin, worker, deployment="child-d") for _ in range(2)])
        if how == "two_processes":  # the same worker id and lease from two connections
            first, second = await login("worker"), await login("worker")
            done = await asyncio.gather(
                first.fetchval(COMPLETE, c1, "w1", claimed[c1], "acme"),
                second.fetchval(COMPLETE, c1, "w1", claimed[c1], "acme"))
            assert done.count(True) == 1, done
        else:  # a batch naming the child twice is refused whole (ZP), then sent once
            before = await snapshot(admin)
            batch = ("SELECT * FROM zeroth.complete_runs(worker_id => 'w1', "
                     "run_ids => $1::uuid[], generations => $2::bigint[], tenant_id => 'acme')")
            with pytest.raises(asyncpg.PostgresError) as err:
                await worker.fetch(batch, [c1, c1], [claimed[c1], claimed[c1]])
            assert err.value.sqlstate.startswith("ZP"), err.value
            assert await snapshot(admin) == before
            rows = await worker.fetch(batch, [c1], [claimed[c1]])
            assert [r["completed"] for r in rows] == [True]
        assert await status(admin, parent) == "waiting"  # c2 has not ended
        assert await admin.fetchval(
            "SELECT remaining FROM zeroth.child_waits WHERE parent_run_id = $1", parent) == 1
        assert await worker.fetchval(COMPLETE, c2, "w1", claimed[c2], "acme") is True
        assert await status(admin, parent) == "pending"

    @pytest.mark.parametrize("kind", ["nobody", "reader", "worker"])
    async def test_internal_helpers_are_not_callable(self, login, admin, kind):
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        hostile = await login(kind)
        before = await snapshot(admin)
        for call in (
                "SELECT zeroth._child_outcomes('acme', '', $1, ARRAY[$2]::uuid[])",
                "SELECT zeroth._children_ended('acme', '', $1, ARRAY[$2]::uuid[])",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.fetch(call, parent, child)
        for call in ("SELECT zeroth._leave_for_wait('acme', '', $1, 'w1', $2, 'children:x', now())",
                     "SELECT zeroth._lock_leased_run('acme', '', $1, 'w1', $2)"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.fetch(call, parent, generation)
        assert await snapshot(admin) == before


class TestAttemptHistory:
    async def test_a_reader_sees_no_other_tenants_open_or_ended_attempts(self, login, admin):
        worker = await login("worker")
        theirs, _generation = await held(admin, worker, tenant="globex")  # open attempt
        ended, gen2 = await held(admin, worker, tenant="globex")
        assert await worker.fetchval(COMPLETE, ended, "w1", gen2, "globex") is True
        mine, _ = await held(admin, worker, tenant="acme")
        reader = await login("reader")
        assert await reader.fetch("SELECT * FROM zeroth.attempt_history") == []  # no tenant set
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        seen = await reader.fetch("SELECT tenant_id, run_id FROM zeroth.attempt_history")
        assert {tuple(r) for r in seen} == {("acme", mine)}
        await reader.execute("SET zeroth.tenant_id = ''")
        assert await reader.fetch("SELECT * FROM zeroth.attempt_history") == []
        assert theirs != mine

    async def test_a_dbas_manual_updates_never_raise(self, admin, login):
        worker = await login("worker")
        run_id, _generation = await held(admin, worker)
        statements = (
            "UPDATE zeroth.runs SET lease_worker_id = 'dba' WHERE run_id = $1",
            "UPDATE zeroth.runs SET lease_generation = lease_generation - 1 WHERE run_id = $1",
            "UPDATE zeroth.runs SET lease_generation = lease_generation + 1 WHERE run_id = $1",
            "UPDATE zeroth.runs SET status = 'pending', lease_worker_id = NULL, "
            "lease_expires_at = NULL, lease_acquired_at = NULL, admission_slot = NULL "
            "WHERE run_id = $1",
            "UPDATE zeroth.runs SET status = 'failed', finished_at = now() WHERE run_id = $1",
        )
        for statement in statements:
            await admin.execute(statement, run_id)
        outcomes = await admin.fetch(
            "SELECT outcome FROM zeroth.run_attempts WHERE run_id = $1 ORDER BY ended_at, "
            "outcome DESC", run_id)
        # One row per update that changed or cleared a holder (the last had none: no row). The
        # DBA's reset of a running run to pending reads as a retried failure (running → pending
        # with no hand-back nor sleep is what fail_run with attempts left does).
        assert [r["outcome"] for r in outcomes] == ["lease_lost"] * 3 + ["failed"]


async def two_tenants(admin, worker) -> dict[str, Any]:
    """In acme and globex each: a running run with a checkpoint, a step and an event wait on
    the event 'e', a completed run, a dead-lettered run; 'e' is emitted in globex only."""
    made: dict[str, Any] = {}
    for tenant in ("acme", "globex"):
        run_id, generation = await held(admin, worker, tenant)
        await worker.fetchval("SELECT zeroth.save_checkpoint(run_id => $1, worker_id => 'w1', "
                              "generation => $2, data => '{}', tenant_id => $3)",
                              run_id, generation, tenant)
        await worker.fetch("SELECT * FROM zeroth.record_step(run_id => $1, worker_id => 'w1', "
                           "generation => $2, step_key => 's', result => '1', tenant_id => $3)",
                           run_id, generation, tenant)
        done, gen2 = await held(admin, worker, tenant)
        assert await worker.fetchval(COMPLETE, done, "w1", gen2, tenant) is True
        waiter, gen3 = await held(admin, worker, tenant)
        row = await worker.fetchrow(
            "SELECT * FROM zeroth.wait_for_event(run_id => $1, worker_id => 'w1', "
            "generation => $2, step_key => 'ev', name => 'e', tenant_id => $3)",
            waiter, gen3, tenant)
        assert row["outcome"] == "waiting"
        made[tenant] = (run_id, done, waiter)
    # Emitting in globex wakes globex's waiter; acme's wait stays open with no event.
    await admin.fetch("SELECT * FROM zeroth.emit_event(name => 'e', tenant_id => 'globex')")
    return made


class TestViews:
    async def test_a_reader_naming_a_tenant_sees_only_its_rows(self, login, admin):
        worker = await login("worker")
        made = await two_tenants(admin, worker)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        for relation in VIEWS + READER_TABLES:
            rows = await reader.fetch(f"SELECT tenant_id FROM zeroth.{relation}")
            assert {r["tenant_id"] for r in rows} <= {"acme"}, relation
        for relation in ("run_list", "checkpoint_list", "step_list", "wait_list",
                         "attempt_history", "scope_overview"):
            assert await reader.fetch(f"SELECT 1 FROM zeroth.{relation}"), relation
        # acme's wait does not see globex's event of the same name.
        (wait,) = await reader.fetch("SELECT run_id, emitted_at FROM zeroth.wait_list")
        assert wait["run_id"] == made["acme"][2]
        assert wait["emitted_at"] is None
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.fetch("SELECT * FROM zeroth.child_waits")

    async def test_a_reader_without_a_tenant_sees_nothing(self, login, admin):
        worker = await login("worker")
        await two_tenants(admin, worker)
        reader = await login("reader")
        for relation in VIEWS + READER_TABLES:
            assert await reader.fetch(f"SELECT * FROM zeroth.{relation}") == [], relation

    @pytest.mark.parametrize("kind", ["nobody", "worker"])
    async def test_a_worker_or_a_role_with_no_grant_reads_no_view(self, login, admin, kind):
        worker = await login("worker")
        await two_tenants(admin, worker)
        hostile = await login(kind)
        await hostile.execute("SET zeroth.tenant_id = 'acme'")
        for relation in VIEWS + READER_TABLES + ("child_waits",):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await hostile.fetch(f"SELECT * FROM zeroth.{relation}")

    async def test_a_reader_cannot_write_through_a_view_or_table(self, login, admin):
        worker = await login("worker")
        made = await two_tenants(admin, worker)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        before = await snapshot(admin)
        for statement in ("UPDATE zeroth.run_list SET status = 'completed'",
                          "DELETE FROM zeroth.wait_list",
                          "DELETE FROM zeroth.run_steps",
                          "UPDATE zeroth.events SET payload = '1'",
                          "DELETE FROM zeroth.event_waits"):
            with pytest.raises(asyncpg.PostgresError) as err:
                await reader.execute(statement)
            # 42501, or 55000 for a view PostgreSQL cannot write through at all.
            assert err.value.sqlstate in ("42501", "55000"), statement
        assert await snapshot(admin) == before
        assert made


class TestLeastPrivilege:
    @pytest.mark.parametrize("kind", ["nobody", "reader", "worker"])
    async def test_each_role_has_exactly_its_documented_rights(self, login, admin, kind):
        """The catalog as each hostile role sees it: the functions it may execute and the
        relations it may write are those sql/README.md grants, nothing more (new 0014-0016
        objects included)."""
        hostile = await login(kind)
        name = await hostile.fetchval("SELECT current_user")
        executable = {r["proname"] for r in await admin.fetch(
            "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'zeroth'::regnamespace "
            "AND has_function_privilege($1, p.oid, 'EXECUTE')", name)}
        writable = {r["relname"] for r in await admin.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace "
            "AND c.relkind IN ('r', 'v', 'p') AND (has_table_privilege($1, c.oid, "
            "'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'))", name)}
        readable = {r["relname"] for r in await admin.fetch(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'zeroth'::regnamespace "
            "AND c.relkind IN ('r', 'v', 'p', 'm', 'S') AND has_table_privilege($1, c.oid, "
            "'SELECT')", name)}
        assert writable == set()
        if kind == "nobody":
            assert (executable, readable) == (set(), set())
        elif kind == "worker":
            assert executable <= readme_grants("zeroth_worker"), executable - readme_grants(
                "zeroth_worker")
            assert readable == set()
        else:
            granted = {g.removeprefix("zeroth.") for g in readme_grants("zeroth_reader")}
            assert executable <= granted, executable - granted
            assert readable <= granted, readable - granted
            assert not any(n.startswith("_") for n in executable)


class TestCancelMeetsEnd:
    @pytest.mark.parametrize("round_", range(3))
    async def test_a_parents_cancel_and_its_childs_end_at_once_both_land(
            self, login, admin, connect, round_):
        """The cancel cascade locks the child after the parent; the child's end locks the child,
        then takes the parent SKIP LOCKED: neither waits for the other in a cycle, and the parent
        ends cancelled whichever commits first."""
        worker = await login("worker")
        parent, generation, (child,) = await family(admin, worker)
        assert (await worker.fetchrow(WAIT, parent, "w1", generation, [child],
                                      "acme"))["outcome"] == "waiting"
        _, child_generation = await held(admin, worker, deployment="child-d")
        canceller = await connect()
        ender = await login("worker")
        cancelled, completed = await asyncio.gather(
            canceller.fetchval("SELECT zeroth.request_cancel(run_id => $1, tenant_id => 'acme')",
                               parent),
            ender.fetchval(COMPLETE, child, "w1", child_generation, "acme"),
            return_exceptions=True)
        assert not isinstance(cancelled, BaseException), cancelled
        assert not isinstance(completed, BaseException), completed
        assert await status(admin, parent) == "cancelled"
        assert await status(admin, child) in ("completed", "running")
        assert round_ >= 0
