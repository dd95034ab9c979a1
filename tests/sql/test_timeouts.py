"""Attempt and run timeouts (issue 34, item 2), decided on the database clock.

A deployment's attempt_timeout_seconds / run_timeout_seconds (zeroth.deployments, set by
register_deployment / set_deployment_defaults) or a run's own (enqueue_run) become deadlines when a
claim leases the run (runs.attempt_deadline_at each claim, runs.run_deadline_at the first); the
lease is capped there, renewals never pass them (ZP013 once passed), and the run is ended by
whoever sees it next: its holder's settle of kind timeout, the orphan sweep (claim_orphaned), a
claim (a pending run past its run deadline). Every end goes through zeroth.run_transitions."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, at, enqueue, make_run, run_row

OTHER = "worker-b"


async def set_timeouts(conn: asyncpg.Connection, attempt: float | None = None,
                       run: float | None = None, **kwargs: Any) -> asyncpg.Record:
    return await conn.fetchrow(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth.set_deployment_defaults(deployment_ref => $1,
               attempt_timeout_seconds => $2, run_timeout_seconds => $3, unset => $4)""",
        DEPLOYMENT, attempt, run, kwargs.get("unset"))


async def claim_start(conn: asyncpg.Connection, now: float, worker: str = WORKER,
                      lease: float | None = 60.0) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT * FROM zeroth_test.claim_and_start(deployment_ref => $1, worker_id => $2,
               lease_seconds => $3, batch_size => 10, now_override => $4)""",
        DEPLOYMENT, worker, lease, at(now))
    return [r for r in rows if r["run_id"] is not None]


async def sweep(conn: asyncpg.Connection, now: float, worker: str = OTHER,
                claim_limit: int | None = None) -> list[asyncpg.Record]:
    rows = await conn.fetch(
        """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => $2,
               claim_limit => $3, now_override => $4)""", DEPLOYMENT, worker, claim_limit, at(now))
    return [r for r in rows if r["run_id"] is not None]


async def renew(conn: asyncpg.Connection, run_id: UUID, generation: int, now: float,
                lease: float = 60.0) -> bool:
    return await conn.fetchval(  # type: ignore[no-any-return]
        """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
               lease_seconds => $4, now_override => $5)""", run_id, WORKER, generation, lease,
        at(now))


def error_of(row: asyncpg.Record) -> dict[str, Any]:
    return json.loads(row["error"]) if isinstance(row["error"], str) else dict(row["error"])


async def attempts_of(conn: asyncpg.Connection, run_id: UUID) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        """SELECT a.attempt, a.worker_id, a.outcome, a.ended_at FROM zeroth.run_attempts a
            WHERE a.run_id = $1 ORDER BY a.lease_generation""", run_id)
    return [tuple(r) for r in rows]


class TestRegistry:
    async def test_set_deployment_defaults_stores_the_timeouts_and_audits_them(self, conn):
        result = await set_timeouts(conn, 30, 3600)
        assert (result["outcome"], result["attempt_timeout_seconds"],
                result["run_timeout_seconds"]) == ("created", 30, 3600)
        new = json.loads(await conn.fetchval(
            "SELECT new_values::text FROM zeroth.deployment_changes WHERE deployment_ref = $1",
            DEPLOYMENT))
        assert (new["attempt_timeout_seconds"], new["run_timeout_seconds"]) == (30, 3600)
        listed = await conn.fetchrow(
            "SELECT attempt_timeout_seconds, run_timeout_seconds FROM zeroth.list_deployments($1)",
            DEPLOYMENT)
        assert tuple(listed) == (30, 3600)

    async def test_null_keeps_a_timeout_and_unset_clears_it(self, conn):
        await set_timeouts(conn, 30, 3600)
        kept = await set_timeouts(conn, None, None)
        assert (kept["outcome"], kept["attempt_timeout_seconds"]) == ("unchanged", 30)
        cleared = await set_timeouts(conn, None, None, unset=["attempt_timeout_seconds"])
        assert (cleared["outcome"], cleared["attempt_timeout_seconds"],
                cleared["run_timeout_seconds"]) == ("updated", None, 3600)

    async def test_a_registration_states_the_timeouts_and_one_without_them_unsets_them(self, conn):
        first = await conn.fetchrow(
            """SELECT * FROM zeroth.register_deployment(deployment_ref => $1,
                   attempt_timeout_seconds => 10, run_timeout_seconds => 100)""", DEPLOYMENT)
        assert (first["attempt_timeout_seconds"], first["run_timeout_seconds"]) == (10, 100)
        # The call of before 0021 (no timeouts named) still resolves, and states "none".
        again = await conn.fetchrow(
            "SELECT * FROM zeroth.register_deployment(deployment_ref => $1, max_attempts => 3,"
            " priority => 0)", DEPLOYMENT)
        assert (again["outcome"], again["attempt_timeout_seconds"],
                again["run_timeout_seconds"]) == ("updated", None, None)

    @pytest.mark.parametrize(("attempt", "run"), [
        (0.5, None), (86400 * 31, None), (float("nan"), None), (None, 0),
        (None, 86400 * 366), (None, float("inf"))])
    async def test_out_of_bounds_timeouts_are_refused_and_change_nothing(self, conn, attempt, run):
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await set_timeouts(conn, attempt, run)
        assert raised.value.sqlstate == "ZP008"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.deployments") == 0

    @pytest.mark.parametrize(("attempt", "run"), [
        (0, None), (86400 * 31, None), (None, 0), (None, 86400 * 366), (-5, 10)])
    async def test_a_runs_own_timeouts_out_of_bounds_are_refused(self, conn, attempt, run):
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await enqueue(conn, attempt_timeout_seconds=attempt, run_timeout_seconds=run)
        assert raised.value.sqlstate == "ZP008"
        items = json.dumps([{"attempt_timeout_seconds": attempt, "run_timeout_seconds": run}])
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await conn.fetch("SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, "
                                 "runs => $2::jsonb)", DEPLOYMENT, items)
        assert raised.value.sqlstate == "ZP008"
        assert await conn.fetchval("SELECT count(*) FROM zeroth.runs") == 0

    async def test_an_enqueue_runs_item_carries_its_own_timeouts(self, conn):
        items = json.dumps([{"attempt_timeout_seconds": 5, "run_timeout_seconds": 50}, {},
                            {"thread_id": "t", "attempt_timeout_seconds": 7}])
        ids = [r["run_id"] for r in await conn.fetch(
            "SELECT run_id FROM zeroth.enqueue_runs(deployment_ref => $1, runs => $2::jsonb) "
            "ORDER BY ordinality", DEPLOYMENT, items)]
        got = [tuple(await conn.fetchrow(
            "SELECT attempt_timeout_seconds, run_timeout_seconds FROM zeroth.runs "
            "WHERE run_id = $1", run_id)) for run_id in ids]
        assert got == [(5, 50), (None, None), (7, None)]

    async def test_a_runs_own_timeouts_are_whole_seconds(self, conn):
        await conn.fetch("SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, "
                         "runs => '[{\"attempt_timeout_seconds\": 2}]')", DEPLOYMENT)
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await conn.fetch("SELECT * FROM zeroth.enqueue_runs(deployment_ref => $1, "
                                 "runs => '[{\"attempt_timeout_seconds\": 1.5}]')", DEPLOYMENT)
        assert raised.value.sqlstate == "ZP008"


class TestClaimFixesTheDeadlines:
    async def test_without_a_timeout_a_claim_is_what_it_was(self, conn):
        run_id = await enqueue(conn)
        [row] = await claim_start(conn, 0)
        assert (row["lease_expires_at"], row["deadline_at"]) == (at(60), None)
        run = await run_row(conn, run_id)
        assert (run["attempt_deadline_at"], run["run_deadline_at"]) == (None, None)

    async def test_the_deployments_attempt_timeout_caps_the_lease_at_the_deadline(self, conn):
        await set_timeouts(conn, 30)
        run_id = await enqueue(conn)
        [row] = await claim_start(conn, 0)
        assert (row["lease_expires_at"], row["deadline_at"]) == (at(30), at(30))
        assert (await run_row(conn, run_id))["attempt_deadline_at"] == at(30)

    async def test_a_runs_own_timeout_wins_over_the_deployments(self, conn):
        await set_timeouts(conn, 30)
        run_id = await enqueue(conn, attempt_timeout_seconds=5, run_timeout_seconds=50)
        [row] = await claim_start(conn, 0)
        assert (row["lease_expires_at"], row["deadline_at"]) == (at(5), at(5))
        run = await run_row(conn, run_id)
        assert (run["attempt_deadline_at"], run["run_deadline_at"]) == (at(5), at(50))

    async def test_the_first_claim_fixes_the_run_deadline_and_a_later_one_keeps_it(self, conn):
        await set_timeouts(conn, 10, 100)
        run_id = await enqueue(conn)
        await claim_start(conn, 0)
        assert await sweep(conn, 11) == []  # lapsed at its attempt deadline: retried
        run = await run_row(conn, run_id)
        assert run["status"] == "pending"
        [second] = await claim_start(conn, 90)
        assert second["deadline_at"] == at(100)  # the run's, earlier than 90 + 10
        run = await run_row(conn, run_id)
        assert (run["attempt_deadline_at"], run["run_deadline_at"],
                run["lease_expires_at"]) == (at(100), at(100), at(100))


class TestRenewalNeverPassesTheDeadline:
    async def test_a_renewal_is_capped_at_the_attempt_deadline(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running", lease_seconds=10)
        assert await renew(conn, lease.run_id, lease.generation, 5)
        run = await run_row(conn, lease.run_id)
        assert (run["lease_expires_at"], run["attempt_deadline_at"]) == (at(30), at(30))

    async def test_a_renewal_past_the_deadline_raises_deadline_passed(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running")
        with pytest.raises(asyncpg.PostgresError) as raised:
            async with conn.transaction():
                await renew(conn, lease.run_id, lease.generation, 31)
        assert raised.value.sqlstate == "ZP013"
        assert (await run_row(conn, lease.run_id))["lease_expires_at"] == at(30)

    async def test_renew_leases_reports_the_deadline_per_run_and_renews_the_others(self, conn):
        run_a = await enqueue(conn, attempt_timeout_seconds=30)
        run_b = await enqueue(conn)
        await claim_start(conn, 0)
        rows = await conn.fetch(
            """SELECT * FROM zeroth_test.renew_leases(worker_id => $1, run_ids => $2,
                   generations => '{1,1}', lease_seconds => 60, now_override => $3)""",
            WORKER, [run_a, run_b], at(31))
        assert [(r["run_id"], r["renewed"], r["sqlstate"]) for r in rows] == [
            (run_a, False, "ZP013"), (run_b, True, None)]

    async def test_another_worker_learns_nothing_about_the_deadline(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running")
        assert await conn.fetchval(
            """SELECT zeroth_test.renew_lease(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, OTHER, lease.generation, at(31)) is False


class TestTheSweepEndsARunPastItsDeadline:
    async def test_a_lease_lapsed_at_the_attempt_deadline_is_retried_as_a_timeout(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running")
        assert await sweep(conn, 31) == []  # ended, not re-leased
        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["attempts"], run["lease_worker_id"]) == ("pending", 1, None)
        assert run["run_after"] >= at(30)
        assert error_of(run)["stop_reason"] == "attempt_timeout"
        assert await attempts_of(conn, lease.run_id) == [(1, WORKER, "timed_out", at(30))]

    async def test_with_no_attempt_left_the_timeout_dead_letters_the_run(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running", max_attempts=1)
        await sweep(conn, 31)
        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["dead_lettered_at"]) == ("failed", at(30))
        assert error_of(run)["stop_reason"] == "attempt_timeout"

    async def test_a_run_past_its_run_deadline_fails_for_good(self, conn):
        await set_timeouts(conn, None, 20)
        lease = await make_run(conn, "running")  # lease 60, capped at the run deadline
        await sweep(conn, 21)
        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["dead_lettered_at"], run["finished_at"]) == (
            "failed", None, at(20))
        assert error_of(run)["stop_reason"] == "run_timeout"

    async def test_a_worker_that_died_before_the_deadline_is_recovered_with_a_new_one(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running", lease_seconds=10)  # lapses at 10, deadline 30
        [row] = await sweep(conn, 11)
        assert (row["run_id"], row["deadline_at"]) == (lease.run_id, at(41))
        assert (await run_row(conn, lease.run_id))["attempts"] == 2

    async def test_a_run_without_a_timeout_is_recovered_as_before(self, conn):
        lease = await make_run(conn, "running")
        [row] = await sweep(conn, 61)
        assert (row["run_id"], row["deadline_at"]) == (lease.run_id, None)


class TestTheHolderSettlesItsTimeout:
    async def settle(self, conn, lease, now: float) -> asyncpg.Record:
        return await conn.fetchrow(  # type: ignore[no-any-return]
            """SELECT * FROM zeroth_test.settle_runs(worker_id => $1, run_ids => ARRAY[$2]::uuid[],
                   generations => ARRAY[$3]::bigint[], outcomes => '{timeout}',
                   errors => ARRAY['{"handler": "stopped"}']::jsonb[], now_override => $4)""",
            WORKER, lease.run_id, lease.generation, at(now))

    async def test_a_timeout_before_the_deadline_passes_is_retried(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running")
        settled = await self.settle(conn, lease, 29.5)
        assert (settled["outcome"], settled["sqlstate"]) == ("timed_out", None)
        run = await run_row(conn, lease.run_id)
        assert run["status"] == "pending"
        error = error_of(run)
        assert (error["stop_reason"], error["previous_error"]) == (
            "attempt_timeout", {"handler": "stopped"})

    async def test_a_timeout_past_the_run_deadline_ends_the_run(self, conn):
        await set_timeouts(conn, None, 20)
        lease = await make_run(conn, "running")
        settled = await self.settle(conn, lease, 20)
        assert settled["outcome"] == "run_timed_out"
        assert (await run_row(conn, lease.run_id))["status"] == "failed"

    async def test_a_timeout_stopped_at_the_run_deadline_ends_the_run_before_it_passes(self,
                                                                                     conn):
        await set_timeouts(conn, 30, 20)  # the run's deadline (20) comes first
        lease = await make_run(conn, "running")
        settled = await self.settle(conn, lease, 19.5)
        assert settled["outcome"] == "run_timed_out"
        assert error_of(await run_row(conn, lease.run_id))["stop_reason"] == "run_timeout"

    async def test_an_attempt_deadline_before_the_run_deadline_is_retried(self, conn):
        await set_timeouts(conn, 10, 20)
        lease = await make_run(conn, "running")
        settled = await self.settle(conn, lease, 9.5)
        assert settled["outcome"] == "timed_out"

    async def test_a_timeout_after_the_lease_lapsed_is_fenced_out(self, conn):
        await set_timeouts(conn, 30)
        lease = await make_run(conn, "running")
        settled = await self.settle(conn, lease, 30.5)
        assert (settled["outcome"], settled["sqlstate"]) == (None, "ZP002")
        assert (await run_row(conn, lease.run_id))["status"] == "running"


class TestAClaimNeverStartsARunPastItsDeadline:
    async def test_a_pending_run_past_its_run_deadline_is_failed_not_started(self, conn):
        await set_timeouts(conn, 10, 100)
        run_id = await enqueue(conn)
        await claim_start(conn, 0)
        await sweep(conn, 11)  # attempt timed out: pending again, run deadline 100
        assert (await run_row(conn, run_id))["status"] == "pending"
        assert await claim_start(conn, 101) == []
        run = await run_row(conn, run_id)
        assert (run["status"], run["finished_at"], run["attempts"]) == ("failed", at(101), 1)
        assert error_of(run)["stop_reason"] == "run_timeout"

    async def test_redrive_clears_the_deadlines_and_the_next_claim_fixes_new_ones(self, conn):
        await set_timeouts(conn, None, 20)
        lease = await make_run(conn, "running")
        await sweep(conn, 21)
        assert await conn.fetchval(
            "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)", lease.run_id,
            at(50))
        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["run_deadline_at"]) == ("pending", None)
        [row] = await claim_start(conn, 60)
        assert row["deadline_at"] == at(80)


class TestTheTransitionsAreListed:
    async def test_each_timeout_end_is_an_edge_of_the_state_machine(self, conn):
        edges = await conn.fetch(
            """SELECT from_status::text, outcome, to_status::text FROM zeroth.run_transitions
                WHERE outcome IN ('timed_out', 'run_timed_out') ORDER BY edge_no""")
        assert [tuple(e) for e in edges] == [
            ("running", "timed_out", "pending"), ("running", "run_timed_out", "failed"),
            ("pending", "run_timed_out", "failed"), ("waiting", "run_timed_out", "failed")]


class TestOneBadLateRunNeverStopsTheSweep:
    async def test_a_late_run_whose_end_raises_is_dead_lettered_alone(self, conn):
        from test_orphan_recovery_isolation import POISON  # the test's own raising trigger

        await set_timeouts(conn, 30)
        bad = await make_run(conn, "running", payload={"poison": "soft"})
        good = await make_run(conn, "running")
        await conn.execute(POISON)
        assert await sweep(conn, 31) == []
        bad_row, good_row = await run_row(conn, bad.run_id), await run_row(conn, good.run_id)
        assert (bad_row["status"], error_of(bad_row)["stop_reason"]) == (
            "failed", "recovery_failed")
        assert (good_row["status"], error_of(good_row)["stop_reason"]) == (
            "pending", "attempt_timeout")
