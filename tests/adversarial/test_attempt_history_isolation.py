"""The attempt history (zeroth.attempt_history) as a reader and as a DBA, on a shipped database.

A reader sees no other tenant's attempts, open (the zeroth.runs part of the view) or ended; a
DBA's manual updates of runs never make the history trigger raise.
"""

from __future__ import annotations

from test_child_run_attacks import COMPLETE, held


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
