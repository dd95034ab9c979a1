"""A run nobody holds is ended at its run deadline by the sweep (issue 34 item 2, the gap 0021
left): zeroth.wake_due_waits, run by every RunWorker's orphan sweep, fails every waiting run
(paused, waiting for an event or its children) and every pending one (sleeping, in backoff) with no
live lease whose run deadline passed, through the one settle path (zeroth._settle kind deadline:
edge run_timed_out, stop_reason run_timeout, an END stored for a run with events), each alone (one
whose end raises is left as it was with a WARNING and the others are ended). The claims' end of a
pending run past its deadline goes through the same settle path.

Test clock: each call is placed at its time with ``now_override`` (zeroth_test wrappers)."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from child_calls import start_child, wait_children
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row
from test_timeouts import claim_start, set_timeouts, sweep

WAKE = """SELECT zeroth_test.wake_due_waits(deployment_refs => $1::text[], batch_size => $2,
              now_override => $3)"""
WAIT = """SELECT outcome FROM zeroth_test.wait_for_event(run_id => $1, worker_id => $2,
              generation => $3, step_key => 'approve', name => $4, timeout_seconds => $5,
              now_override => $6)"""
EMIT = """SELECT emitted, woken FROM zeroth_test.emit_event(name => $1, payload => '{}',
              now_override => $2)"""
SLEEP = """SELECT outcome FROM zeroth_test.sleep_run(run_id => $1, worker_id => $2,
               generation => $3, resume_at => $4, now_override => $5)"""
APPEND = """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => $3,
                name => 'token', data => '1', now_override => $4)"""


async def wake(conn: asyncpg.Connection, now: float, batch_size: int = 100,
               deployments: list[str] | None = None) -> int:
    return await conn.fetchval(WAKE, deployments, batch_size, at(now))  # type: ignore[no-any-return]


def stop_reason(row: asyncpg.Record) -> Any:
    error = row["error"]
    return None if error is None else json.loads(error).get("stop_reason")


async def ended_attempts(conn: asyncpg.Connection, run_id: UUID) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await conn.fetch(
        "SELECT attempt, lease_generation, outcome FROM zeroth.run_attempts WHERE run_id = $1 "
        "ORDER BY lease_generation", run_id)]


async def waiting_for_event(conn: asyncpg.Connection, name: str = "approved",
                            wait_seconds: float | None = None, **kwargs: Any) -> UUID:
    lease = await make_run(conn, "running", **kwargs)
    assert await conn.fetchval(WAIT, lease.run_id, WORKER, lease.generation, name, wait_seconds,
                               at(1)) == "waiting"
    return lease.run_id


class TestTheSweepEndsAWaitingRunAtItsRunDeadline:
    async def test_a_paused_run_past_its_run_deadline_is_failed_for_good(self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "waiting")  # claimed at T0 (run deadline 100), paused
        assert await wake(conn, 99) == 0
        assert (await run_row(conn, lease.run_id))["status"] == "waiting"

        assert await wake(conn, 101) == 1

        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["finished_at"], run["wait_reason"],
                run["dead_lettered_at"]) == ("failed", at(101), None, None)
        assert stop_reason(run) == "run_timeout"
        assert "while it was waiting (approval)" in json.loads(run["error"])["message"]
        # No attempt ends (its pause gave it back): the history keeps the paused one only.
        assert run["attempts"] == 0
        assert await ended_attempts(conn, lease.run_id) == [(1, 1, "paused")]

    async def test_a_run_waiting_for_an_event_is_ended_and_a_later_emit_wakes_nothing(
            self, conn):
        await set_timeouts(conn, None, 100)
        run_id = await waiting_for_event(conn, wait_seconds=3600)  # the wait's own deadline: later
        assert await wake(conn, 101) == 1
        assert (await run_row(conn, run_id))["status"] == "failed"
        assert tuple(await conn.fetchrow(EMIT, "approved", at(102))) == (True, 0)
        assert (await run_row(conn, run_id))["status"] == "failed"

    async def test_a_parent_waiting_for_its_children_is_ended(self, conn):
        await set_timeouts(conn, None, 100)
        parent = await make_run(conn, "running")
        child = await start_child(conn, parent.run_id, parent.generation, "c1", now=at(1))
        outcome, _ = await wait_children(conn, parent.run_id, parent.generation, "wait",
                                         [child["child_run_id"]], now=at(2))
        assert outcome == "waiting"
        assert await wake(conn, 101) == 1
        run = await run_row(conn, parent.run_id)
        assert (run["status"], stop_reason(run)) == ("failed", "run_timeout")
        # Its child is not the parent's end: it goes on (a failed parent cancels nothing).
        assert (await run_row(conn, child["child_run_id"]))["status"] == "pending"

    async def test_a_sleeping_run_past_its_run_deadline_is_failed_before_it_is_due(self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "running")
        assert await conn.fetchval(SLEEP, lease.run_id, WORKER, lease.generation, at(5000),
                                   at(2)) == "sleeping"
        assert await wake(conn, 101) == 1
        run = await run_row(conn, lease.run_id)
        assert (run["status"], stop_reason(run)) == ("failed", "run_timeout")
        assert "before it could start again" in json.loads(run["error"])["message"]

    async def test_runs_without_a_run_deadline_or_before_it_are_left_alone(self, conn):
        await set_timeouts(conn, 30, None)  # an attempt timeout only: no run deadline
        paused = await make_run(conn, "waiting")
        waiting = await waiting_for_event(conn, wait_seconds=None)
        await set_timeouts(conn, None, 1000)
        later = await make_run(conn, "waiting")
        assert await wake(conn, 500) == 0
        for run_id in (paused.run_id, waiting, later.run_id):
            assert (await run_row(conn, run_id))["status"] == "waiting"

    async def test_the_end_is_an_edge_of_the_state_machine_and_a_removed_edge_ends_nothing(
            self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "waiting")
        await conn.execute("DELETE FROM zeroth.run_transitions WHERE from_status = 'waiting' "
                           "AND outcome = 'run_timed_out'")
        assert await wake(conn, 101) == 0
        assert (await run_row(conn, lease.run_id))["status"] == "waiting"

    async def test_the_sweep_takes_only_the_deployments_it_is_given_and_at_most_a_batch(
            self, conn):
        await set_timeouts(conn, None, 100)
        ours = [(await make_run(conn, "waiting")).run_id for _ in range(3)]
        await conn.execute("SELECT zeroth.set_deployment_defaults(deployment_ref => 'other', "
                           "run_timeout_seconds => 100)")
        theirs = await make_run(conn, "waiting", deployment_ref="other")
        assert await wake(conn, 101, batch_size=2, deployments=[DEPLOYMENT]) == 2
        assert await wake(conn, 101, batch_size=2, deployments=[DEPLOYMENT]) == 1
        assert await wake(conn, 101, batch_size=2, deployments=[DEPLOYMENT]) == 0
        assert [(await run_row(conn, r))["status"] for r in ours] == ["failed"] * 3
        assert (await run_row(conn, theirs.run_id))["status"] == "waiting"
        assert await wake(conn, 101) == 1  # NULL: every deployment
        assert (await run_row(conn, theirs.run_id))["status"] == "failed"


class TestOneSettlePath:
    async def test_the_sweeps_end_of_a_waiting_run_stores_its_end_event(self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "running")
        assert await conn.fetchval(APPEND, lease.run_id, WORKER, lease.generation, at(1))
        assert await conn.fetchval(WAIT, lease.run_id, WORKER, lease.generation, "go", None,
                                   at(2)) == "waiting"
        await wake(conn, 101)
        stored = [tuple(r) for r in await conn.fetch(
            "SELECT event_id, kind, data::text FROM zeroth.run_events WHERE run_id = $1 "
            "ORDER BY event_id", lease.run_id)]
        assert stored == [(1, "event", "1"),
                          (2, "end", '{"status": "failed", "outcome": "failed"}')]

    async def test_a_claims_end_of_a_pending_run_past_its_deadline_stores_its_end_event(
            self, conn):
        # The claim's end went around zeroth._settle: a run with events got no END row.
        await set_timeouts(conn, 10, 100)
        lease = await make_run(conn, "running")
        assert await conn.fetchval(APPEND, lease.run_id, WORKER, lease.generation, at(1))
        await sweep(conn, 11)  # its attempt timed out: pending again
        assert await claim_start(conn, 101) == []
        stored = [tuple(r) for r in await conn.fetch(
            "SELECT event_id, kind FROM zeroth.run_events WHERE run_id = $1 ORDER BY event_id",
            lease.run_id)]
        assert stored == [(1, "event"), (2, "end")]
        assert stop_reason(await run_row(conn, lease.run_id)) == "run_timeout"

    async def test_a_lapsed_claim_ended_at_the_deadline_counts_and_records_one_attempt(
            self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "claimed", lease_seconds=30)  # never started; lapses at 30
        assert await wake(conn, 101) == 1
        run = await run_row(conn, lease.run_id)
        assert (run["status"], run["attempts"], run["lease_worker_id"],
                run["admission_slot"]) == ("failed", 1, None, None)
        assert await ended_attempts(conn, lease.run_id) == [(1, 1, "expired")]

    async def test_a_claim_with_a_live_lease_is_left_to_its_holder(self, conn):
        await set_timeouts(conn, None, 100)
        lease = await make_run(conn, "claimed", lease_seconds=30)
        # A DBA moved the deadline behind the live lease: the sweep still leaves the holder be.
        await conn.execute("UPDATE zeroth.runs SET run_deadline_at = $2 WHERE run_id = $1",
                           lease.run_id, at(10))
        assert await wake(conn, 20) == 0
        assert (await run_row(conn, lease.run_id))["status"] == "pending"


POISON = """
CREATE FUNCTION pg_temp.poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.payload ? 'poison' AND NEW.status = 'failed' THEN
        RAISE EXCEPTION 'poisoned run %', OLD.run_id USING ERRCODE = 'XX001';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER zz_test_poison BEFORE UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION pg_temp.poison();
"""


class TestOneBadRunNeverStopsTheOthers:
    async def test_a_waiting_run_whose_end_raises_is_left_with_a_warning_and_the_rest_ended(
            self, conn):
        await set_timeouts(conn, None, 100)
        bad = [(await make_run(conn, "waiting", payload={"poison": 1})).run_id for _ in range(3)]
        good = (await make_run(conn, "waiting", now=at(5))).run_id  # the latest deadline
        await conn.execute(POISON)
        warnings: list[str] = []
        conn.add_log_listener(lambda _c, message: warnings.append(message.message))

        assert await wake(conn, 200, batch_size=2) == 1

        assert (await run_row(conn, good))["status"] == "failed"
        assert [(await run_row(conn, r))["status"] for r in bad] == ["waiting"] * 3
        assert sum("past its run deadline raised XX001" in w for w in warnings) == 3

    async def test_a_claim_meeting_a_pending_run_whose_end_raises_goes_on(self, conn):
        await set_timeouts(conn, 10, 100)
        bad = await make_run(conn, "running", payload={"poison": 1})
        await sweep(conn, 11)  # its attempt timed out: pending again, run deadline 100
        await conn.execute(POISON)
        fresh = (await make_run(conn, "pending", now=at(50))).run_id
        warnings: list[str] = []
        conn.add_log_listener(lambda _c, message: warnings.append(message.message))

        claimed = await claim_start(conn, 101)

        assert [r["run_id"] for r in claimed] == [fresh]
        assert (await run_row(conn, bad.run_id))["status"] == "pending"
        assert any("past its run deadline raised XX001" in w for w in warnings)


class TestGenericPlans:
    @pytest.mark.parametrize("kind", ["event", "children"])
    async def test_a_generic_plan_over_a_table_with_statistics_wakes_at_most_batch_size(
            self, conn, kind):
        # A long-lived session (a pooled connection) runs wake_due_waits on a generic plan. Its
        # batch is locked in a CTE and joined by the UPDATE: a plan that evaluated the LIMIT ...
        # FOR UPDATE SKIP LOCKED batch again per row (as prune_runs' DELETE ... IN (SELECT ...)
        # did) would skip the rows already woken and go on past batch_size.
        parents = []
        for i in range(30):
            lease = await make_run(conn, "running")
            if kind == "event":
                assert await conn.fetchval(WAIT, lease.run_id, WORKER, lease.generation,
                                           f"e{i}", 10, at(1)) == "waiting"
            else:
                child = await start_child(conn, lease.run_id, lease.generation, "c", now=at(1))
                assert (await wait_children(conn, lease.run_id, lease.generation, "w",
                                            [child["child_run_id"]], now=at(1)))[0] == "waiting"
                # The child's end met the wait while the parent's row was held: only marked.
                await conn.execute("UPDATE zeroth.child_waits SET met_at = $2 "
                                   "WHERE parent_run_id = $1", lease.run_id, at(2))
            parents.append(lease.run_id)
        # Statistics of tables that are mostly dead rows (what a busy table looks like between
        # two vacuums): the plan that caught prune_runs.
        aborted = conn.transaction()
        await aborted.start()
        await conn.execute(
            "SELECT count(*) FROM zeroth.enqueue_runs(deployment_ref => $1, runs => ("
            "SELECT jsonb_agg(jsonb_build_object('payload', jsonb_build_object('n', g))) "
            "FROM generate_series(1, 2000) g))", DEPLOYMENT)
        await aborted.rollback()
        await conn.execute("ANALYZE zeroth.runs; ANALYZE zeroth.event_waits; "
                           "ANALYZE zeroth.child_waits")
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        try:
            for done in range(1, 6):
                assert await wake(conn, 100, batch_size=2) == 2
                assert await conn.fetchval(
                    "SELECT count(*) FROM zeroth.runs WHERE run_id = ANY ($1) "
                    "AND status = 'pending'", parents) == 2 * done
        finally:
            await conn.execute("RESET plan_cache_mode")


class TestTheEndsLockBound:
    async def test_a_claims_end_of_a_run_past_its_deadline_leaves_the_callers_lock_timeout(
            self, conn):
        # The end waits at most 2 s for a lock, set for that call only: a claim that ended a run
        # past its run deadline leaves its caller's transaction with the lock_timeout it had.
        await set_timeouts(conn, 10, 100)
        late = await make_run(conn, "running")
        await sweep(conn, 11)  # its attempt timed out: pending again, run deadline 100
        async with conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = '7s'")
            await claim_start(conn, 101)
            assert await conn.fetchval("SHOW lock_timeout") == "7s"
        assert (await run_row(conn, late.run_id))["status"] == "failed"
