"""Child runs hold against hostile callers and a DBA, on a database exactly as shipped.

* bad child id lists, bad start_child_run and wait_for_children input, and cycles (a child
  awaiting its parent, a parent its grandchild) raise a ZP error and change nothing;
* a cancelled parent cascades to its attached children only; a parent's cancel and its child's
  end at the same moment both land;
* a wake-up skipped while the parent's row was locked is made by wake_due_waits; a DBA deleting
  an awaited child ends the wait (the child counts as cancelled) instead of stranding the parent;
* two processes of one lease record one wait outcome; a child ended twice at once is counted
  once; a child redriven after the parent recorded its outcome changes nothing, and a wait made
  after a child's redrive waits for its new end;
* workspaces of one tenant are separate scopes; no hostile role can call an internal helper.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

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
        ("max_attempts", "1001"), ("detached", "NULL"),
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
