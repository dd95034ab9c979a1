"""The attempt history against the roles the product keeps out, on a database exactly as shipped:

* a role with no grant can read neither zeroth.run_attempts nor zeroth.attempt_history (42501);
* a zeroth_worker, even the live holder of the run, can neither read, insert, update nor delete a
  history row (42501), and no argument of the functions it may call chooses an outcome: the
  trigger derives it from the run row alone;
* a zeroth_reader sees the rows of the tenant it names in zeroth.tenant_id only, nothing without
  one, and can write none;
* a worker cannot act as zeroth_owner (whose completions the trigger leaves to the completing
  statement), and each completion function writes exactly one row per completed run;
* a stale holder (its lease taken over) ends nothing: its refused writes leave the history as the
  new holder's claim made it.
"""

from __future__ import annotations

import re
from typing import Any

import asyncpg
import pytest
from held_runs import ORPHANED, held_run

COMPLETE = """SELECT zeroth.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  tenant_id => $4)"""
FAIL = """SELECT zeroth.fail_run(run_id => $1, worker_id => $2, generation => $3,
              error => '{"x": 1}', tenant_id => $4)"""
HISTORY = """SELECT a.lease_generation, a.worker_id, a.outcome FROM zeroth.attempt_history a
              WHERE a.run_id = $1 ORDER BY a.lease_generation, a.ended_at NULLS LAST"""
WRITES = (
    "INSERT INTO zeroth.run_attempts (tenant_id, workspace_key, run_id, attempt, "
    "lease_generation, worker_id, ended_at, outcome) VALUES ('acme', '', $1, 9, 9, 'evil', now(), "
    "'completed')",
    "UPDATE zeroth.run_attempts SET outcome = 'completed', ended_at = now() WHERE run_id = $1",
    "DELETE FROM zeroth.run_attempts WHERE run_id = $1",
    # The stored log under the view (migration 0022) and the attempt kept in the runs row.
    "INSERT INTO zeroth.run_attempt_log (tenant_id, workspace_key, run_id, attempt, "
    "lease_generation, worker_id, ended_at, outcome) VALUES ('acme', '', $1, 9, 9, 'evil', "
    "now(), 'completed')",
    "UPDATE zeroth.run_attempt_log SET outcome = 'completed', ended_at = now() WHERE run_id = $1",
    "DELETE FROM zeroth.run_attempt_log WHERE run_id = $1",
    "UPDATE zeroth.runs SET completed_worker_id = 'evil' WHERE run_id = $1",
)


def refusal(statement: str) -> type[Exception]:
    """How a write is refused: zeroth.run_attempts is a view of a UNION (migration 0022), which
    no role can write (55000, before any privilege is checked); the tables by privilege."""
    if re.search(r"zeroth\.run_attempts\b", statement):
        return asyncpg.ObjectNotInPrerequisiteStateError
    return asyncpg.InsufficientPrivilegeError


async def rows(admin: asyncpg.Connection, run_id: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in await admin.fetch(HISTORY, run_id)]


class TestNoGrant:
    @pytest.mark.parametrize("relation", ["run_attempts", "run_attempt_log", "attempt_history"])
    async def test_reads_nothing(self, login, admin, relation):
        worker = await login("worker")
        await held_run(admin, worker)
        nobody = await login("nobody")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await nobody.fetch(f"SELECT * FROM zeroth.{relation}")


class TestWorker:
    @pytest.mark.parametrize("statement", WRITES)
    async def test_cannot_write_history_even_as_the_holder(self, login, admin, statement):
        worker = await login("worker")
        run_id, _ = await held_run(admin, worker)
        before = await rows(admin, run_id)
        with pytest.raises(refusal(statement)):
            await worker.execute(statement, run_id)
        assert await rows(admin, run_id) == before

    @pytest.mark.parametrize("relation", ["run_attempts", "run_attempt_log", "attempt_history"])
    async def test_cannot_read_history(self, login, admin, relation):
        worker = await login("worker")
        await held_run(admin, worker)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await worker.fetch(f"SELECT * FROM zeroth.{relation}")

    async def test_a_setting_named_like_an_outcome_changes_nothing(self, login, admin):
        # The outcome is derived from the run rows, never a setting (the trigger's WHEN reads
        # one, the completions' mark, and only for a completion made as zeroth_owner): a
        # worker cannot label its own failure a success.
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        await worker.execute("SET zeroth.attempt_outcome = 'completed'")
        assert await worker.fetchval(FAIL, run_id, "w1", generation, "acme") == "retry_scheduled"
        assert await rows(admin, run_id) == [(1, "w1", "failed")]

    async def test_cannot_become_the_owner_to_complete_without_a_history_row(self, login, admin):
        # The functions' own completions write their history rows in the completing statement
        # and the trigger skips completions made as zeroth_owner: a worker that could act as
        # zeroth_owner could complete runs that leave no row. It cannot take that role.
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker)
        for become in ("SET ROLE zeroth_owner", "SET SESSION AUTHORIZATION zeroth_owner"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await worker.execute(become)
        assert await worker.fetchval(COMPLETE, run_id, "w1", generation, "acme") is True
        assert await rows(admin, run_id) == [(1, "w1", "completed")]

    async def test_every_completion_function_writes_exactly_one_row(self, login, admin):
        worker = await login("worker")
        singles = [await held_run(admin, worker) for _ in range(3)]
        (first, g1), (second, g2), (third, g3) = singles
        assert await worker.fetchval(COMPLETE, first, "w1", g1, "acme") is True
        assert [r["completed"] for r in await worker.fetch(
            "SELECT completed FROM zeroth.complete_runs(worker_id => 'w1', run_ids => $1::uuid[], "
            "generations => $2::bigint[], tenant_id => 'acme')", [second], [g2])] == [True]
        (row,) = await worker.fetch(
            "SELECT completed FROM zeroth.complete_and_claim(deployment_ref => 'd', "
            "worker_id => 'w1', run_ids => $1::uuid[], generations => $2::bigint[], "
            "tenant_id => 'acme')", [third], [g3])
        assert row["completed"] == [True]
        for run_id in (first, second, third):
            assert await admin.fetchval(
                "SELECT count(*) FROM zeroth.run_attempts WHERE run_id = $1", run_id) == 1
            assert await rows(admin, run_id) == [(1, "w1", "completed")]

    async def test_stale_holder_ends_nothing(self, login, admin):
        worker = await login("worker")
        run_id, generation = await held_run(admin, worker, lease_seconds=0.001)
        await admin.execute("SELECT pg_sleep(0.01)")  # the real clock: the lease expires
        (row,) = await worker.fetch(ORPHANED, "w2", "acme")
        assert row["lease_generation"] == generation + 1
        after_takeover = await rows(admin, run_id)
        assert after_takeover == [(1, "w1", "recovered"), (2, "w2", None)]
        assert await worker.fetchval(COMPLETE, run_id, "w1", generation, "acme") is False
        assert await worker.fetchval(FAIL, run_id, "w1", generation, "acme") is None
        assert await rows(admin, run_id) == after_takeover


class TestReader:
    async def test_sees_its_tenant_only_and_nothing_without_one(self, login, admin):
        worker = await login("worker")
        mine, _ = await held_run(admin, worker, tenant="acme")
        await held_run(admin, worker, tenant="globex")
        reader = await login("reader")
        assert await reader.fetchval("SELECT count(*) FROM zeroth.attempt_history") == 0
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        seen = await reader.fetch("SELECT tenant_id, run_id FROM zeroth.attempt_history")
        assert [(r["tenant_id"], r["run_id"]) for r in seen] == [("acme", mine)]

    @pytest.mark.parametrize("relation", ["run_attempts", "attempt_history"])
    async def test_sees_a_first_claim_completion_of_its_tenant_only(self, login, admin,
                                                                    relation):
        # The attempt that completed a run at its first claim is kept in the runs row, not in
        # zeroth.run_attempt_log (issue 30): readers still see it, through the runs row's
        # policy, with the holder, the claim and the outcome; another tenant's reader does not.
        worker = await login("worker")
        mine, g1 = await held_run(admin, worker, tenant="acme")
        theirs, g2 = await held_run(admin, worker, tenant="globex")
        assert await worker.fetchval(COMPLETE, mine, "w1", g1, "acme") is True
        assert await worker.fetchval(COMPLETE, theirs, "w1", g2, "globex") is True
        assert await admin.fetchval(
            "SELECT count(*) FROM zeroth.run_attempt_log WHERE run_id = ANY ($1::uuid[])",
            [mine, theirs]) == 0
        claimed = await admin.fetchval(
            "SELECT completed_claimed_at FROM zeroth.runs WHERE run_id = $1", mine)
        query = f"""SELECT tenant_id, run_id, attempt, lease_generation, worker_id, claimed_at,
                           started_at IS NOT NULL AS started, ended_at, outcome, error
                      FROM zeroth.{relation} ORDER BY tenant_id"""
        reader = await login("reader")
        assert await reader.fetch(query) == []
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        finished = await admin.fetchval("SELECT finished_at FROM zeroth.runs WHERE run_id = $1",
                                        mine)
        assert [dict(r) for r in await reader.fetch(query)] == [
            {"tenant_id": "acme", "run_id": mine, "attempt": 1, "lease_generation": 1,
             "worker_id": "w1", "claimed_at": claimed, "started": True, "ended_at": finished,
             "outcome": "completed", "error": None}]
        await reader.execute("SET zeroth.tenant_id = 'globex'")
        assert [r["run_id"] for r in await reader.fetch(query)] == [theirs]

    @pytest.mark.parametrize("statement", WRITES)
    async def test_cannot_write(self, login, admin, statement):
        worker = await login("worker")
        run_id, _ = await held_run(admin, worker)
        before = await rows(admin, run_id)
        reader = await login("reader")
        await reader.execute("SET zeroth.tenant_id = 'acme'")
        with pytest.raises(refusal(statement)):
            await reader.execute(statement, run_id)
        assert await rows(admin, run_id) == before
