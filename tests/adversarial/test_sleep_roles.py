"""zeroth.sleep_run against the roles the product keeps out, on a database exactly as shipped
(no test clock):

* a role with no grant and a zeroth_reader cannot call it (42501) and change nothing;
* a zeroth_worker that does not hold the live lease — another worker id, another scope, an older
  generation after a takeover, its own lease expired on the real clock — is refused (outcome
  NULL) and changes nothing, checkpoint included;
* a holder cannot bring its own clock: there is no now_override, a session setting does not move
  the database clock, and a resume_at in the past is "now" (it cannot put the run ahead of the
  queue, which is ordered by run_after).
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from held_runs import CLAIM, ENQUEUE, held_run

SLEEP = """SELECT outcome, run_after FROM zeroth.sleep_run(run_id => $1, worker_id => $2,
               generation => $3, delay_seconds => $4, resume_at => $5,
               checkpoint => '{"evil": true}', tenant_id => $6)"""


async def snapshot(admin: asyncpg.Connection, run_id: Any) -> tuple[Any, ...]:
    row = await admin.fetchrow("SELECT r.* FROM zeroth.runs r WHERE r.run_id = $1", run_id)
    checkpoints = await admin.fetchval(
        "SELECT count(*) FROM zeroth.checkpoints WHERE run_id = $1", run_id)
    return (tuple(row), checkpoints)


class TestNoGrant:
    @pytest.mark.parametrize("kind", ["nobody", "reader"])
    async def test_cannot_call_sleep_run(self, login, admin, kind):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        before = await snapshot(admin, run_id)
        outsider = await login(kind)

        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await outsider.fetch(SLEEP, run_id, "w1", generation, 5.0, None, "acme")

        assert await snapshot(admin, run_id) == before


class TestWorkerWithoutTheLease:
    @pytest.mark.parametrize(("worker_id", "tenant", "generation_offset"), [
        ("w2", "acme", 0), ("w1", "globex", 0), ("w1", "default", 0), ("w1", "acme", 1),
        ("w1", "acme", -1)], ids=["other_worker", "other_tenant", "default_tenant",
                                   "future_generation", "older_generation"])
    async def test_is_refused_and_changes_nothing(self, login, admin, worker_id, tenant,
                                                  generation_offset):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        before = await snapshot(admin, run_id)

        row = await worker.fetchrow(SLEEP, run_id, worker_id, generation + generation_offset,
                                    5.0, None, tenant)

        assert tuple(row) == (None, None)
        assert await snapshot(admin, run_id) == before

    async def test_an_older_generation_after_a_takeover_cannot_sleep(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, lease_seconds=0.2)
        await asyncio.sleep(0.3)  # the lease runs out on the database clock
        (taken,) = await worker.fetch(
            """SELECT run_id, lease_generation FROM zeroth.claim_orphaned(deployment_ref => 'd',
                   worker_id => 'w1', tenant_id => 'acme') WHERE run_id IS NOT NULL""")
        assert (taken["run_id"], taken["lease_generation"]) == (run_id, generation + 1)
        before = await snapshot(admin, run_id)

        # Same worker id, the generation it held before: the stale task of a stalled process.
        row = await worker.fetchrow(SLEEP, run_id, "w1", generation, 5.0, None, "acme")

        assert row["outcome"] is None
        assert await snapshot(admin, run_id) == before

    async def test_a_holder_whose_lease_expired_on_the_real_clock_cannot_sleep(self, login,
                                                                             admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, lease_seconds=0.2)
        await asyncio.sleep(0.3)
        before = await snapshot(admin, run_id)

        row = await worker.fetchrow(SLEEP, run_id, "w1", generation, 5.0, None, "acme")

        assert row["outcome"] is None
        assert await snapshot(admin, run_id) == before


class TestHolderCannotBringItsOwnClock:
    async def test_there_is_no_now_override(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)

        with pytest.raises(asyncpg.UndefinedFunctionError):
            await worker.fetch(
                """SELECT * FROM zeroth.sleep_run(run_id => $1, worker_id => 'w1',
                       generation => $2, delay_seconds => 5, tenant_id => 'acme',
                       now_override => '2000-01-01')""", run_id, generation)

    async def test_a_clock_setting_does_not_move_the_delay(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        await worker.execute("SET zeroth_test.now = '2000-01-01 00:00:00+00'")
        before = await admin.fetchval("SELECT clock_timestamp()")

        row = await worker.fetchrow(SLEEP, run_id, "w1", generation, 5.0, None, "acme")

        after = await admin.fetchval("SELECT clock_timestamp()")
        assert row["outcome"] == "sleeping"
        assert before.timestamp() + 5 <= row["run_after"].timestamp() <= after.timestamp() + 5

    async def test_a_resume_at_in_the_past_cannot_jump_the_queue(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        ahead = await admin.fetchval(ENQUEUE, "acme")  # due now, queued before the sleep
        before = await admin.fetchval("SELECT clock_timestamp()")

        row = await worker.fetchrow(SLEEP, run_id, "w1", generation, None,
                                    await admin.fetchval("SELECT '2000-01-01'::timestamptz"),
                                    "acme")

        assert row["outcome"] == "sleeping"
        assert row["run_after"] >= before
        (first,) = await worker.fetch(CLAIM, "w2", "acme", 60)
        assert first["run_id"] == ahead
