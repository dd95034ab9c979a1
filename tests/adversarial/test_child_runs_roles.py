"""Child runs against the roles the product keeps out, on a database exactly as shipped (no test
clock):

* a role with no grant and a zeroth_reader can call neither start_child_run nor
  wait_for_children (42501), read neither child_runs nor child_waits, and change nothing;
* a zeroth_worker that does not hold the parent's live lease — another worker id, another
  tenant, a generation not issued, an older generation of the same worker id after it re-took the
  run, a lease expired on the real clock and taken over — starts no child and cannot make the
  parent wait (NULL, nothing changed);
* a zeroth_worker holding a lease of its own cannot start a child into another scope (the child
  lives in the parent's scope) nor await runs that are not its own children — another tenant's
  child, a sibling's child, a plain run (ZP008, nothing changed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from held_runs import ENQUEUE, ORPHANED, held_run, lapse

START = """SELECT child_run_id, created FROM zeroth.start_child_run(run_id => $1, worker_id => $2,
               generation => $3, step_key => $4, deployment_ref => 'child-d',
               payload => '{"x": 1}', tenant_id => $5)"""
WAIT = """SELECT outcome, children::text AS children FROM zeroth.wait_for_children(run_id => $1,
              worker_id => $2, generation => $3, step_key => '#children',
              child_run_ids => $4::uuid[], tenant_id => $5)"""


async def snapshot(admin: asyncpg.Connection) -> tuple[Any, ...]:
    runs = await admin.fetch("SELECT r.* FROM zeroth.runs r ORDER BY r.run_id")
    links = await admin.fetch("SELECT c.* FROM zeroth.child_runs c ORDER BY c.child_run_id")
    waits = await admin.fetch("SELECT w.* FROM zeroth.child_waits w ORDER BY w.parent_run_id")
    steps = await admin.fetch("SELECT s.* FROM zeroth.run_steps s ORDER BY s.run_id, s.step_key")
    return tuple([tuple(r) for r in rows] for rows in (runs, links, waits, steps))


async def parent_with_child(admin, worker, **kwargs) -> tuple[Any, int, Any]:
    run_id, generation = await held_run(admin, worker, **kwargs)
    tenant = kwargs.get("tenant", "acme")
    row = await worker.fetchrow(START, run_id, kwargs.get("worker_id", "w1"), generation, "c1",
                                tenant)
    assert row["created"] is True
    return run_id, generation, row["child_run_id"]


class TestNoGrant:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_cannot_call_or_read_anything(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation, child = await parent_with_child(admin, worker)
        before = await snapshot(admin)
        outsider = await login(kind)
        for statement, args in ((START, (run_id, "w1", generation, "c2", "acme")),
                                (WAIT, (run_id, "w1", generation, [child], "acme"))):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await outsider.fetch(statement, *args)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await outsider.fetch("SELECT * FROM zeroth.child_waits")
        if kind == "nobody":
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await outsider.fetch("SELECT * FROM zeroth.child_runs")
        else:  # the run page's children: its tenant's only, none while it names no tenant
            assert await outsider.fetch("SELECT * FROM zeroth.child_runs") == []
            assert await outsider.fetch("SELECT * FROM zeroth.child_list") == []
        assert await snapshot(admin) == before


class TestWorkerWithoutTheLease:
    @pytest.mark.parametrize(("worker_id", "tenant", "generation_offset"), [
        ("w2", "acme", 0),  # another worker id
        ("w1", "globex", 0),  # another tenant
        ("w1", "acme", 1),  # a generation not yet issued
    ])
    async def test_starts_nothing_and_cannot_make_the_parent_wait(
            self, login, admin, worker_id, tenant, generation_offset):
        worker = await login("worker")
        run_id, generation, child = await parent_with_child(admin, worker)
        before = await snapshot(admin)
        attacker = await login("worker")
        stolen = generation + generation_offset
        assert tuple(await attacker.fetchrow(START, run_id, worker_id, stolen, "evil",
                                             tenant)) == (None, None)
        assert tuple(await attacker.fetchrow(START, run_id, worker_id, stolen, "c1",
                                             tenant)) == (None, None)  # not even its id
        assert tuple(await attacker.fetchrow(WAIT, run_id, worker_id, stolen, [child],
                                             tenant)) == (None, None)
        assert await snapshot(admin) == before

    @pytest.mark.parametrize("taker", ["w2", "w1"])  # w1: the same worker id re-took the run
    async def test_an_older_generation_after_a_takeover_starts_nothing(self, login, admin, taker):
        worker = await login("worker")
        run_id, generation, child = await parent_with_child(admin, worker)
        await lapse(admin, worker, run_id, generation)  # the lease expires on the real clock
        (taken,) = await worker.fetch(ORPHANED, taker, "acme")
        assert taken["lease_generation"] == generation + 1
        before = await snapshot(admin)
        stale = await login("worker")
        for key in ("c1", "c2"):
            assert tuple(await stale.fetchrow(START, run_id, "w1", generation, key,
                                              "acme")) == (None, None)
        assert tuple(await stale.fetchrow(WAIT, run_id, "w1", generation, [child],
                                          "acme")) == (None, None)
        assert await snapshot(admin) == before
        # The new holder's replay gets the child the first attempt started.
        assert tuple(await worker.fetchrow(START, run_id, taker, generation + 1, "c1",
                                           "acme")) == (child, False)

    async def test_a_lease_expired_on_the_real_clock_starts_nothing(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, lease_seconds=0.2)
        await asyncio.sleep(0.3)
        before = await snapshot(admin)
        assert tuple(await worker.fetchrow(START, run_id, "w1", generation, "late",
                                           "acme")) == (None, None)
        assert await snapshot(admin) == before


class TestOtherScope:
    async def test_a_worker_cannot_await_runs_that_are_not_its_children(self, login, admin):
        victim = await login("worker")
        _, _, foreign_child = await parent_with_child(admin, victim, tenant="acme")
        attacker = await login("worker")
        mine, generation, own_child = await parent_with_child(
            admin, attacker, tenant="globex", worker_id="w9")
        _, _, sibling_child = await parent_with_child(
            admin, attacker, tenant="globex", worker_id="w9")
        plain = await admin.fetchval(ENQUEUE, "globex")
        before = await snapshot(admin)
        for others in ([foreign_child], [own_child, foreign_child], [sibling_child], [plain]):
            with pytest.raises(asyncpg.PostgresError) as err:
                await attacker.fetch(WAIT, mine, "w9", generation, others, "globex")
            assert err.value.sqlstate == "ZP008", others
        # Naming the victim's scope with its own lease: fenced out (the lease is not there).
        assert tuple(await attacker.fetchrow(WAIT, mine, "w9", generation, [foreign_child],
                                             "acme")) == (None, None)
        assert await snapshot(admin) == before

    async def test_a_child_lives_in_its_parents_scope(self, login, admin):
        worker = await login("worker")
        run_id, generation, child = await parent_with_child(admin, worker, tenant="globex")
        row = await admin.fetchrow(
            "SELECT tenant_id, workspace_id, parent_run_id FROM zeroth.runs WHERE run_id = $1",
            child)
        assert tuple(row) == ("globex", None, run_id)
        # Asking for another tenant with the parent's lease is fenced out: no child in acme.
        assert tuple(await worker.fetchrow(START, run_id, "w1", generation, "c2",
                                           "acme")) == (None, None)
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE tenant_id = 'acme'") == 0
