"""Steps and events against the roles the product keeps out, on a database exactly as shipped
(no test clock):

* a role with no grant and a zeroth_reader can call none of get_step, record_step,
  wait_for_event, emit_event, wake_due_waits (42501), read none of run_steps, events,
  event_waits, and change nothing;
* a zeroth_worker that does not hold the live lease — another worker id, another tenant, an
  older generation after a takeover, its own lease expired on the real clock — records nothing,
  reads nothing (not even the steps it recorded itself before the takeover), cannot make the run
  wait;
* a zeroth_worker of another tenant emitting the same event name wakes nothing and cannot
  pre-empt the victim's event (first write wins per scope, so its payload is never the victim's);
* a DBA's manual UPDATE that takes a lease away (clear_lease style) fences the old holder.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from held_runs import CLAIM, ENQUEUE, ORPHANED, held_run, lapse

GET = """SELECT step_found, result::text AS result FROM zeroth.get_step(run_id => $1,
             worker_id => $2, generation => $3, step_key => $4, tenant_id => $5)"""
RECORD = """SELECT recorded FROM zeroth.record_step(run_id => $1, worker_id => $2,
                generation => $3, step_key => $4, result => '{"evil": true}', tenant_id => $5)"""
WAIT = """SELECT outcome FROM zeroth.wait_for_event(run_id => $1, worker_id => $2,
              generation => $3, step_key => '#event:approval', name => 'approval',
              tenant_id => $4)"""
EMIT = """SELECT emitted, woken FROM zeroth.emit_event(name => 'approval',
              payload => $1::text::jsonb, tenant_id => $2)"""


async def snapshot(admin: asyncpg.Connection, run_id: Any) -> tuple[Any, ...]:
    row = await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE r.run_id = $1", run_id)
    steps = await admin.fetch(
        "SELECT s.* FROM zeroth.run_steps s WHERE s.run_id = $1 ORDER BY s.step_key", run_id)
    waits = await admin.fetch("SELECT w.* FROM zeroth.event_waits w WHERE w.run_id = $1", run_id)
    events = await admin.fetch("SELECT e.* FROM zeroth.events e ORDER BY e.tenant_id, e.name")
    return (tuple(row), [tuple(s) for s in steps], [tuple(w) for w in waits],
            [tuple(e) for e in events])


class TestNoGrant:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_cannot_call_or_read_anything(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        assert (await worker.fetchrow(RECORD.replace("'{\"evil\": true}'", "'1'"), run_id, "w1",
                                      generation, "s", "acme"))["recorded"] is True
        before = await snapshot(admin, run_id)
        outsider = await login(kind)
        for statement, args in ((GET, (run_id, "w1", generation, "s", "acme")),
                                (RECORD, (run_id, "w1", generation, "s2", "acme")),
                                (WAIT, (run_id, "w1", generation, "acme")),
                                (EMIT, ("1", "acme")),
                                ("SELECT zeroth.wake_due_waits()", ())):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await outsider.fetch(statement, *args)
        for relation in ("run_steps", "events", "event_waits"):
            if kind == "reader":  # 0015: readable, its tenant's rows only; none while unset
                assert await outsider.fetch(f"SELECT * FROM zeroth.{relation}") == []
                continue
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await outsider.fetch(f"SELECT * FROM zeroth.{relation}")
        assert await snapshot(admin, run_id) == before


class TestWorkerWithoutTheLease:
    @pytest.mark.parametrize(("worker_id", "tenant", "generation_offset"), [
        ("w2", "acme", 0),  # another worker id
        ("w1", "globex", 0),  # another tenant
        ("w1", "acme", 1),  # a generation not yet issued
    ])
    async def test_records_reads_and_waits_nothing(self, login, admin, worker_id, tenant,
                                                   generation_offset):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        assert (await worker.fetchrow(RECORD, run_id, "w1", generation, "mine", "acme"))[
            "recorded"] is True
        before = await snapshot(admin, run_id)
        attacker = await login("worker")
        stolen = generation + generation_offset
        assert (await attacker.fetchrow(GET, run_id, worker_id, stolen, "mine", tenant))[
            "step_found"] is None
        assert (await attacker.fetchrow(RECORD, run_id, worker_id, stolen, "x", tenant))[
            "recorded"] is None
        assert (await attacker.fetchrow(WAIT, run_id, worker_id, stolen, tenant))[
            "outcome"] is None
        assert await snapshot(admin, run_id) == before

    async def test_stale_holder_after_a_takeover_neither_records_nor_reads(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        assert (await worker.fetchrow(RECORD, run_id, "w1", generation, "one", "acme"))[
            "recorded"] is True
        await lapse(admin, worker, run_id, generation)  # the lease expires on the real clock
        (taken,) = await worker.fetch(ORPHANED, "w2", "acme")
        assert taken["lease_generation"] == generation + 1
        assert (await worker.fetchrow(RECORD, run_id, "w2", generation + 1, "two", "acme"))[
            "recorded"] is True
        before = await snapshot(admin, run_id)
        for key in ("one", "two"):
            assert (await worker.fetchrow(GET, run_id, "w1", generation, key, "acme"))[
                "step_found"] is None
        assert (await worker.fetchrow(RECORD, run_id, "w1", generation, "two", "acme"))[
            "recorded"] is None
        assert (await worker.fetchrow(WAIT, run_id, "w1", generation, "acme"))["outcome"] is None
        assert await snapshot(admin, run_id) == before

    async def test_a_dba_clearing_the_lease_fences_the_holder(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        await admin.execute(
            """UPDATE zeroth.runs SET lease_expires_at = clock_timestamp() - interval '1 s'
                WHERE run_id = $1""", run_id)
        assert (await worker.fetchrow(RECORD, run_id, "w1", generation, "late", "acme"))[
            "recorded"] is None
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.run_steps WHERE run_id = $1", run_id) == 0


class TestOtherTenant:
    async def test_emit_in_another_tenant_wakes_nothing_and_cannot_preempt(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, tenant="acme")
        assert (await worker.fetchrow(WAIT, run_id, "w1", generation, "acme"))[
            "outcome"] == "waiting"
        attacker = await login("worker")
        assert tuple(await attacker.fetchrow(EMIT, json.dumps({"approved": "forged"}),
                                             "globex")) == (True, 0)
        assert tuple(await attacker.fetchrow(EMIT, json.dumps({"approved": "forged"}),
                                             None)) == (True, 0)  # tenant 'default'
        row = await admin.fetchrow("SELECT status FROM zeroth.runs WHERE run_id = $1", run_id)
        assert row["status"] == "waiting"
        assert tuple(await worker.fetchrow(EMIT, json.dumps({"approved": "ann"}),
                                           "acme")) == (True, 1)
        (claimed,) = await worker.fetch(CLAIM, "w1", "acme", 60)
        payload = await worker.fetchval(
            """SELECT payload::text FROM zeroth.wait_for_event(run_id => $1, worker_id => 'w1',
                   generation => $2, step_key => '#event:approval', name => 'approval',
                   tenant_id => 'acme')""", run_id, claimed["lease_generation"])
        assert json.loads(payload) == {"approved": "ann"}

    async def test_wake_due_waits_returns_only_a_count(self, login, admin):
        worker = await login("worker")
        result = await worker.fetch("SELECT * FROM zeroth.wake_due_waits()")
        assert [tuple(r) for r in result] == [(0,)]


class TestManualUpdate:
    async def test_a_dba_making_a_waiting_run_pending_by_hand_loses_no_wait(self, login, admin):
        """A plain UPDATE (no resume_run): the replay waits again on the same deadline, the
        emit still wakes it, and the payload is recorded once."""
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        first = await worker.fetchrow(WAIT.replace("tenant_id => $4", "tenant_id => $4, "
                                                   "timeout_seconds => 3600")
                                      .replace("SELECT outcome", "SELECT outcome, timeout_at"),
                                      run_id, "w1", generation, "acme")
        assert first["outcome"] == "waiting"
        await admin.execute("""UPDATE zeroth.runs SET status = 'pending', wait_reason = NULL,
                                      run_after = clock_timestamp() WHERE run_id = $1""", run_id)
        (claimed,) = await worker.fetch(CLAIM, "w1", "acme", 60)
        again = await worker.fetchrow(WAIT.replace("SELECT outcome", "SELECT outcome, timeout_at"),
                                      run_id, "w1", claimed["lease_generation"], "acme")
        assert (again["outcome"], again["timeout_at"]) == ("waiting", first["timeout_at"])
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.event_waits WHERE run_id = $1", run_id) == 1
        assert tuple(await worker.fetchrow(EMIT, json.dumps("ok"), "acme")) == (True, 1)


class TestPruning:
    async def test_per_run_event_names_leave_no_row_once_their_runs_are_pruned(self, login,
                                                                              admin):
        """docs/security.md recommends per-run event names; the rows must not outlive the runs
        (50 such runs cancelled and pruned leave no event row)."""
        worker = await login("worker")
        for _ in range(50):
            run_id = await worker.fetchval(ENQUEUE, "acme")
            (row,) = await worker.fetch(CLAIM, "w1", "acme", 60)
            assert row["run_id"] == run_id
            assert await worker.fetchval(
                """SELECT outcome FROM zeroth.wait_for_event(run_id => $1::uuid, worker_id => 'w1',
                       generation => $2, step_key => 'k', name => 'approval:' || $1::uuid::text,
                       tenant_id => 'acme')""", run_id, row["lease_generation"]) == "waiting"
            assert await worker.fetchval(
                "SELECT zeroth.request_cancel(run_id => $1, tenant_id => 'acme')",
                run_id) == "cancelled"
        assert await admin.fetchval("SELECT count(*) FROM zeroth.events") == 50
        while await admin.fetchval(
                "SELECT zeroth.prune_runs(older_than => interval '0', batch_size => 7)"):
            pass
        assert await admin.fetchval("SELECT count(*) FROM zeroth.runs") == 0
        assert await admin.fetchval("SELECT count(*) FROM zeroth.events") == 0
