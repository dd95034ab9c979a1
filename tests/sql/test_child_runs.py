"""zeroth.start_child_run / wait_for_children (child runs) and the triggers that report a child's
end to its parent and cancel a cancelled parent's children, on the test clock.

A parent's live lease holder starts a child once per step key (the lease fence of both
functions: tests/sql/test_fenced_conformance.py) (a replay gets the same child); it
waits for all or any of them: already ended → the outcomes are recorded as the step result;
otherwise the parent leaves its worker (waiting, no lease, no slot) until the children's ends make
it pending, and its replay returns the recorded outcomes.
"""

from __future__ import annotations

import json

import asyncpg
import pytest
from child_calls import CHILD, claim_start, finish, start_child, status, wait_children
from helpers import DEPLOYMENT, WORKER, at, make_run, run_row

OTHER = "worker-b"
ORPHANED = """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                  deployment_ref => $1, worker_id => $2, now_override => $3)
               WHERE run_id IS NOT NULL"""
WAKE = """SELECT zeroth_test.wake_due_waits(deployment_refs => $1::text[], batch_size => $2,
              now_override => $3)"""


async def sqlstate(conn, make_call):
    """The SQLSTATE a call raises, inside a savepoint (the test's transaction goes on)."""
    with pytest.raises(asyncpg.PostgresError) as err:
        async with conn.transaction():
            await make_call()
    return err.value.sqlstate


async def reclaim(conn, run_id, *, now, worker=WORKER):
    taken = await claim_start(conn, DEPLOYMENT, worker=worker, now=now)
    assert run_id in taken, f"{run_id} was not claimable at {now}"
    return taken[run_id]


async def parent_with_children(conn, n, **kwargs):
    lease = await make_run(conn, "running")
    children = []
    for i in range(n):
        row = await start_child(conn, lease.run_id, lease.generation, f"child:{i + 1}",
                                payload={"i": i}, now=at(1), **kwargs)
        assert row["created"] is True
        children.append(row["child_run_id"])
    return lease, children


# -- start_child_run ----------------------------------------------------------------------------

class TestStart:
    async def test_child_is_pending_in_the_parents_scope(self, clock_conn):
        lease = await make_run(clock_conn, "running", tenant_id="acme", workspace_id="w1")
        row = await start_child(clock_conn, lease.run_id, lease.generation, "child:1",
                                payload={"q": 1}, tenant="acme", workspace="w1", now=at(1))
        child = await run_row(clock_conn, row["child_run_id"], tenant_id="acme",
                              workspace_id="w1")
        assert (child["status"], child["deployment_ref"], child["parent_run_id"],
                child["run_after"]) == ("pending", CHILD, lease.run_id, at(1))
        assert child["payload"] == '{"q": 1}'
        step = await clock_conn.fetchrow(
            "SELECT result FROM zeroth.run_steps WHERE run_id = $1", lease.run_id)
        assert json.loads(step["result"]) == {"child_run_id": str(row["child_run_id"]),
                                              "deployment_ref": CHILD}

    async def test_replay_returns_the_same_child(self, clock_conn):
        lease = await make_run(clock_conn, "running", lease_seconds=60)
        first = await start_child(clock_conn, lease.run_id, lease.generation, "k", now=at(1))
        again = await start_child(clock_conn, lease.run_id, lease.generation, "k", now=at(2))
        assert (again["child_run_id"], again["created"]) == (first["child_run_id"], False)
        # A later attempt (the lease was taken over) gets the same child back too.
        taken = await clock_conn.fetch(ORPHANED, DEPLOYMENT, OTHER, at(200))
        generation = taken[0]["lease_generation"]
        replay = await start_child(clock_conn, lease.run_id, generation, "k", worker=OTHER,
                                   now=at(201))
        assert (replay["child_run_id"], replay["created"]) == (first["child_run_id"], False)
        assert await clock_conn.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE parent_run_id = $1", lease.run_id) == 1

    @pytest.mark.parametrize("change", [{"deployment": "other-d"}, {"payload": {"x": 2}},
                                        {"detached": True}])
    async def test_same_key_with_another_child_is_zp010(self, clock_conn, change):
        lease = await make_run(clock_conn, "running")
        await start_child(clock_conn, lease.run_id, lease.generation, "k", payload={"x": 1},
                          now=at(1))
        kwargs = {"payload": {"x": 1}, **change}
        assert await sqlstate(clock_conn, lambda: start_child(
            clock_conn, lease.run_id, lease.generation, "k", now=at(2), **kwargs)) == "ZP010"
        assert await clock_conn.fetchval(
            "SELECT count(*) FROM zeroth.runs WHERE parent_run_id = $1", lease.run_id) == 1

    async def test_key_of_another_kind_of_step_is_zp010(self, clock_conn):
        lease = await make_run(clock_conn, "running")
        await clock_conn.execute(
            """SELECT zeroth_test.record_step(run_id => $1, worker_id => $2, generation => $3,
                   step_key => 'k', result => '1', now_override => $4)""",
            lease.run_id, WORKER, lease.generation, at(1))
        assert await sqlstate(clock_conn, lambda: start_child(
            clock_conn, lease.run_id, lease.generation, "k", now=at(2))) == "ZP010"

    @pytest.mark.parametrize("argument", ["step_key => ''", "deployment_ref => ''",
                                          "payload => '[1]'", "metadata => 'null'",
                                          "max_attempts => 0", "detached => NULL"])
    async def test_bad_arguments_are_zp008(self, clock_conn, argument):
        lease = await make_run(clock_conn, "running")
        defaults = {"step_key": "'k'", "deployment_ref": "'d'", "generation": "$3"}
        name = argument.split(" =>")[0]
        defaults.pop(name, None)
        args = ", ".join([f"{k} => {v}" for k, v in defaults.items()] + [argument])
        assert await sqlstate(clock_conn, lambda: clock_conn.fetchrow(
            f"""SELECT * FROM zeroth_test.start_child_run(run_id => $1, worker_id => $2, {args},
                    now_override => $4)""",
            lease.run_id, WORKER, lease.generation, at(1))) == "ZP008"
        assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.child_runs") == 0

    async def test_workspace_without_tenant_is_zp006(self, clock_conn):
        lease = await make_run(clock_conn, "running")
        assert await sqlstate(clock_conn, lambda: clock_conn.fetchrow(
            """SELECT * FROM zeroth_test.start_child_run(run_id => $1, worker_id => $2,
                   generation => $3, step_key => 'k', deployment_ref => 'd',
                   tenant_id => NULL, workspace_id => 'w', now_override => $4)""",
            lease.run_id, WORKER, lease.generation, at(1))) == "ZP006"


# -- wait_for_children ----------------------------------------------------------------------------

class TestWait:
    async def test_wait_all_then_resume_with_the_outcomes(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        outcome, _ = await wait_children(clock_conn, lease.run_id, lease.generation, "join",
                                         [a, b], now=at(2))
        assert outcome == "waiting"
        row = await run_row(clock_conn, lease.run_id)
        assert (row["status"], row["wait_reason"], row["lease_worker_id"], row["attempts"]) == (
            "waiting", "children:join", None, 0)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        await finish(clock_conn, a, taken[a], "complete", value={"r": "a"}, worker=OTHER,
                     now=at(4))
        assert await status(clock_conn, lease.run_id) == ("waiting", "children:join")
        await finish(clock_conn, b, taken[b], "fail", value={"e": "b"}, worker=OTHER, now=at(5))
        row = await run_row(clock_conn, lease.run_id)
        assert (row["status"], row["wait_reason"], row["run_after"]) == ("pending", None, at(5))
        generation = await reclaim(clock_conn, lease.run_id, now=at(6))
        outcome, children = await wait_children(clock_conn, lease.run_id, generation, "join",
                                                [a, b], now=at(7))
        assert outcome == "ready"
        assert [(c["run_id"], c["status"], c["output"], c["error"], c["dead_lettered"])
                for c in children] == [(str(a), "completed", {"r": "a"}, None, False),
                                       (str(b), "failed", None, {"e": "b"}, False)]
        assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.child_waits") == 0
        # Replay: the recorded outcomes, whatever happens to the children since.
        await clock_conn.execute("DELETE FROM zeroth.runs WHERE run_id = ANY($1::uuid[])", [a, b])
        again = await wait_children(clock_conn, lease.run_id, generation, "join", [a, b],
                                    now=at(8))
        assert again == (outcome, children)

    async def test_an_end_while_the_parent_is_resumed_by_hand_is_recounted(self, clock_conn):
        """resume_run takes a waiting parent out of its wait: a child that ends meanwhile is
        not counted down (the parent is not waiting), and the replay's wait counts it."""
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b], now=at(2))
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.resume_run(run_id => $1, now_override => $2)",
            lease.run_id, at(3)) is True
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(4))
        await finish(clock_conn, a, taken[a], "complete", value=1, worker=OTHER, now=at(5))
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 2
        generation = await reclaim(clock_conn, lease.run_id, now=at(6))
        outcome, _ = await wait_children(clock_conn, lease.run_id, generation, "j", [a, b],
                                         now=at(7))
        assert outcome == "waiting"
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 1
        await finish(clock_conn, b, taken[b], "complete", value=2, worker=OTHER, now=at(8))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"

    async def test_a_redriven_child_ending_again_is_counted_once(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "fail", value="x", worker=OTHER, now=at(3))
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b], now=at(4))
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 1
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)", a, at(5))
        again = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(6))
        await finish(clock_conn, a, again[a], "complete", value="ok", worker=OTHER, now=at(7))
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 1
        assert (await status(clock_conn, lease.run_id))[0] == "waiting"  # b has not ended
        await finish(clock_conn, b, taken[b], "complete", worker=OTHER, now=at(8))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"

    async def test_wait_any_wakes_on_the_first_end(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        outcome, _ = await wait_children(clock_conn, lease.run_id, lease.generation, "first",
                                         [a, b], mode="any", now=at(2))
        assert outcome == "waiting"
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        await finish(clock_conn, b, taken[b], "complete", value=2, worker=OTHER, now=at(4))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        generation = await reclaim(clock_conn, lease.run_id, now=at(5))
        outcome, children = await wait_children(clock_conn, lease.run_id, generation, "first",
                                                [a, b], mode="any", now=at(6))
        assert outcome == "ready"
        assert [(c["run_id"], c["status"]) for c in children] == [(str(a), None),
                                                                  (str(b), "completed")]
        # a ends later: the recorded step keeps the snapshot, the parent is not woken again.
        await finish(clock_conn, a, taken[a], "complete", value=1, worker=OTHER, now=at(7))
        assert (await status(clock_conn, lease.run_id))[0] == "running"
        replay = await wait_children(clock_conn, lease.run_id, generation, "first", [a, b],
                                     mode="any", now=at(8))
        assert replay == (outcome, children)

    async def test_already_ended_children_return_at_once(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "complete", value="A", worker=OTHER, now=at(3))
        await finish(clock_conn, b, taken[b], "cancel", worker=OTHER, now=at(3))
        outcome, children = await wait_children(clock_conn, lease.run_id, lease.generation,
                                                "join", [b, a], now=at(4))
        assert outcome == "ready"
        assert [(c["run_id"], c["status"], c["output"]) for c in children] == [
            (str(b), "cancelled", None), (str(a), "completed", "A")]
        assert (await status(clock_conn, lease.run_id))[0] == "running"
        step = await clock_conn.fetchrow(
            "SELECT result, attempt FROM zeroth.run_steps WHERE run_id = $1 AND step_key = 'join'",
            lease.run_id)
        assert json.loads(step["result"]) == {"outcome": "ready", "mode": "all",
                                              "children": children}

    async def test_any_with_one_ended_returns_at_once(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "complete", worker=OTHER, now=at(3))
        outcome, children = await wait_children(clock_conn, lease.run_id, lease.generation,
                                                "any", [a, b], mode="any", now=at(4))
        assert outcome == "ready"
        assert [c["status"] for c in children] == ["completed", None]

    async def test_dead_lettered_child_is_an_outcome(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1, max_attempts=1)
        outcome, _ = await wait_children(clock_conn, lease.run_id, lease.generation, "join", [a],
                                         now=at(2))
        assert outcome == "waiting"
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        assert await finish(clock_conn, a, taken[a], "dead_letter", value={"why": "x"},
                            worker=OTHER, now=at(4)) == "dead_lettered"
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        generation = await reclaim(clock_conn, lease.run_id, now=at(5))
        outcome, children = await wait_children(clock_conn, lease.run_id, generation, "join", [a],
                                                now=at(6))
        assert outcome == "ready"
        assert (children[0]["status"], children[0]["dead_lettered"], children[0]["error"]) == (
            "failed", True, {"why": "x"})

    async def test_a_retried_child_is_not_an_end(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        await wait_children(clock_conn, lease.run_id, lease.generation, "join", [a], now=at(2))
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        assert await finish(clock_conn, a, taken[a], "dead_letter", worker=OTHER,
                            now=at(4)) == "retry_scheduled"
        assert await status(clock_conn, lease.run_id) == ("waiting", "children:join")

    async def test_not_a_child_is_zp008_and_changes_nothing(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        stranger = (await make_run(clock_conn, "pending", deployment_ref=CHILD)).run_id
        _, (theirs,) = await parent_with_children(clock_conn, 1)
        for ids in ([stranger], [a, theirs], [lease.run_id]):
            assert await sqlstate(clock_conn, lambda ids=ids: wait_children(
                clock_conn, lease.run_id, lease.generation, "join", ids, now=at(2))) == "ZP008"
        assert (await status(clock_conn, lease.run_id))[0] == "running"

    @pytest.mark.parametrize("bad", ["empty", "null", "repeat", "mode", "key"])
    async def test_bad_arguments_are_zp008(self, clock_conn, bad):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        ids, mode, key = {"empty": ([], "all", "j"), "null": ([a, None], "all", "j"),
                          "repeat": ([a, a], "all", "j"), "mode": ([a], "some", "j"),
                          "key": ([a], "all", "")}[bad]
        assert await sqlstate(clock_conn, lambda: wait_children(
            clock_conn, lease.run_id, lease.generation, key, ids, mode=mode,
            now=at(2))) == "ZP008"

    async def test_key_of_another_kind_of_step_is_zp010(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        # child:1 is the start step of a: not a wait.
        assert await sqlstate(clock_conn, lambda: wait_children(
            clock_conn, lease.run_id, lease.generation, "child:1", [a], now=at(2))) == "ZP010"

    async def test_a_parent_naming_another_scopes_child_is_zp008(self, clock_conn):
        lease = await make_run(clock_conn, "running", tenant_id="acme")
        a = (await start_child(clock_conn, lease.run_id, lease.generation, "c", tenant="acme",
                               now=at(1)))["child_run_id"]
        theirs = await make_run(clock_conn, "running", tenant_id="globex")
        assert await sqlstate(clock_conn, lambda: wait_children(
            clock_conn, theirs.run_id, theirs.generation, "j", [a], tenant="globex",
            now=at(2))) == "ZP008"

    async def test_pending_cancel_request_wins_over_waiting(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(2)) == "cancel_requested"
        outcome, _ = await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a],
                                         now=at(3))
        assert outcome == "cancelled"
        assert (await status(clock_conn, lease.run_id))[0] == "cancelled"
        assert (await status(clock_conn, a))[0] == "cancelled"  # cascaded

    async def test_wait_frees_the_admission_slot(self, clock_conn):
        lease = await make_run(clock_conn, "running", max_concurrency=1)
        a = (await start_child(clock_conn, lease.run_id, lease.generation, "c",
                               now=at(1)))["child_run_id"]
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a], now=at(2))
        slots = await clock_conn.fetch("SELECT run_id FROM zeroth.admission_slots")
        assert [s["run_id"] for s in slots] == [None]

    async def test_skipped_wake_up_is_made_by_wake_due_waits(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a], now=at(2))
        assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(3)) == 0  # not met
        # As if the child's trigger had found the parent's row locked: its outcome is copied,
        # the wait marked met, the parent still waits (tests/races: the real lock).
        await clock_conn.execute(
            """UPDATE zeroth.child_runs SET status = 'completed', finished_at = $2
                WHERE child_run_id = $1""", a, at(3))
        await clock_conn.execute("UPDATE zeroth.child_waits SET met_at = $1", at(3))
        assert await status(clock_conn, lease.run_id) == ("waiting", "children:j")
        assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(4)) == 1
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        assert await clock_conn.fetchval(WAKE, [DEPLOYMENT], 100, at(5)) == 0


# -- a child redriven or deleted ------------------------------------------------------------------

REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"
COPY = "SELECT status::text FROM zeroth.child_runs WHERE child_run_id = $1"


class TestRedriveAndDelete:
    """A child that ended and is redriven is a child that has not ended (its outcome copy is
    cleared, its parent's unrecorded waits recounted); a recorded wait keeps what it recorded.
    A child deleted before it ended is an end its parent sees (cancelled, with an error), not a
    wait that never ends."""

    async def test_a_wait_after_a_childs_redrive_waits_for_its_new_end(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1, max_attempts=1)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        assert await finish(clock_conn, a, taken[a], "dead_letter", value="boom", worker=OTHER,
                            now=at(3)) == "dead_lettered"
        assert await clock_conn.fetchval(COPY, a) == "failed"
        assert await clock_conn.fetchval(REDRIVE, a, at(4)) is True
        assert await clock_conn.fetchval(COPY, a) is None
        outcome, _ = await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a],
                                         now=at(5))
        assert outcome == "waiting"
        again = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(6))
        await finish(clock_conn, a, again[a], "complete", value="ok", worker=OTHER, now=at(7))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        generation = await reclaim(clock_conn, lease.run_id, now=at(8))
        outcome, children = await wait_children(clock_conn, lease.run_id, generation, "j", [a],
                                                now=at(9))
        assert outcome == "ready"
        assert [(c["status"], c["output"], c["error"], c["dead_lettered"]) for c in children] == [
            ("completed", "ok", None, False)]

    async def test_a_redrive_while_the_parent_waits_is_recounted(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b], now=at(2))
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        await finish(clock_conn, a, taken[a], "fail", value="x", worker=OTHER, now=at(4))
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 1
        assert await clock_conn.fetchval(REDRIVE, a, at(5)) is True
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 2
        await finish(clock_conn, b, taken[b], "complete", worker=OTHER, now=at(6))
        assert await status(clock_conn, lease.run_id) == ("waiting", "children:j")
        again = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(7))
        await finish(clock_conn, a, again[a], "complete", value="second", worker=OTHER,
                     now=at(8))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        generation = await reclaim(clock_conn, lease.run_id, now=at(9))
        _, children = await wait_children(clock_conn, lease.run_id, generation, "j", [a, b],
                                          now=at(10))
        assert [(c["status"], c["output"]) for c in children] == [("completed", "second"),
                                                                  ("completed", None)]

    async def test_an_any_wait_met_then_redriven_before_the_replay_waits_again(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b], mode="any",
                            now=at(2))
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        await finish(clock_conn, a, taken[a], "fail", value="x", worker=OTHER, now=at(4))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        assert await clock_conn.fetchval(REDRIVE, a, at(5)) is True
        # The parent is not waiting: its wait row is recounted by its replay, not the redrive.
        generation = await reclaim(clock_conn, lease.run_id, now=at(6))
        outcome, _ = await wait_children(clock_conn, lease.run_id, generation, "j", [a, b],
                                         mode="any", now=at(7))
        assert outcome == "waiting"
        assert await clock_conn.fetchval("SELECT remaining FROM zeroth.child_waits") == 2
        await finish(clock_conn, b, taken[b], "complete", value="b", worker=OTHER, now=at(8))
        assert (await status(clock_conn, lease.run_id))[0] == "pending"

    async def test_a_recorded_wait_keeps_its_outcome_after_a_redrive(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "fail", value="first", worker=OTHER, now=at(3))
        outcome, recorded = await wait_children(clock_conn, lease.run_id, lease.generation, "j",
                                                [a], now=at(4))
        assert outcome == "ready"
        assert recorded[0]["error"] == "first"
        assert await clock_conn.fetchval(REDRIVE, a, at(5)) is True
        again = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(6))
        await finish(clock_conn, a, again[a], "complete", value="later", worker=OTHER, now=at(7))
        assert (await status(clock_conn, lease.run_id))[0] == "running"  # not woken again
        replay = await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a],
                                     now=at(8))
        assert replay == (outcome, recorded)

    async def test_a_deleted_child_ends_the_wait_as_cancelled(self, clock_conn):
        lease, (a, b) = await parent_with_children(clock_conn, 2)
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b], now=at(2))
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(3))
        await finish(clock_conn, b, taken[b], "complete", value="b", worker=OTHER, now=at(4))
        await clock_conn.execute("DELETE FROM zeroth.runs WHERE run_id = $1", a)
        assert (await status(clock_conn, lease.run_id))[0] == "pending"
        generation = await reclaim(clock_conn, lease.run_id, now=at(5))
        outcome, children = await wait_children(clock_conn, lease.run_id, generation, "j", [a, b],
                                                now=at(6))
        assert outcome == "ready"
        assert (children[0]["status"], children[0]["error"]) == (
            "cancelled", {"message": "the child run was deleted before it ended",
                          "deleted_status": "running"})
        assert children[1]["status"] == "completed"

    async def test_a_child_deleted_before_the_wait_reads_as_ended(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        await clock_conn.execute("DELETE FROM zeroth.runs WHERE run_id = $1", a)
        outcome, children = await wait_children(clock_conn, lease.run_id, lease.generation, "j",
                                                [a], now=at(2))
        assert outcome == "ready"
        assert (children[0]["status"], children[0]["error"]["deleted_status"]) == (
            "cancelled", "pending")

    async def test_deleting_an_ended_child_keeps_its_outcome(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "complete", value=5, worker=OTHER, now=at(3))
        await clock_conn.execute("DELETE FROM zeroth.runs WHERE run_id = $1", a)
        _, children = await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a],
                                          now=at(4))
        assert (children[0]["status"], children[0]["output"]) == ("completed", 5)


# -- cancel ---------------------------------------------------------------------------------------

class TestCancel:
    async def test_cancelling_a_waiting_parent_cancels_its_unfinished_children(self, clock_conn):
        lease, (a, b, c) = await parent_with_children(clock_conn, 3)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        await finish(clock_conn, a, taken[a], "complete", worker=OTHER, now=at(3))
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [a, b, c],
                            now=at(4))
        # c goes back to pending (its claim handed back); b stays running with a live lease.
        assert await clock_conn.fetchval(
            """SELECT zeroth_test.hand_back_to_pending(run_id => $1, worker_id => $2,
                   generation => $3, now_override => $4)""", c, OTHER, taken[c], at(4))
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(5)) == "cancelled"
        assert (await status(clock_conn, a))[0] == "completed"  # ended before: untouched
        assert (await status(clock_conn, c))[0] == "cancelled"
        child_b = await run_row(clock_conn, b)
        assert (child_b["status"], child_b["cancel_requested_at"]) == ("running", at(5))
        # b's worker sees the request and cancels: it is recorded as b's outcome.
        await finish(clock_conn, b, taken[b], "cancel", worker=OTHER, now=at(6))
        outcomes = await clock_conn.fetch(
            "SELECT child_run_id, status::text FROM zeroth.child_runs ORDER BY step_key")
        assert [o["status"] for o in outcomes] == ["completed", "cancelled", "cancelled"]

    async def test_detached_children_are_kept(self, clock_conn):
        lease = await make_run(clock_conn, "running")
        kept = (await start_child(clock_conn, lease.run_id, lease.generation, "kept",
                                  detached=True, now=at(1)))["child_run_id"]
        gone = (await start_child(clock_conn, lease.run_id, lease.generation, "gone",
                                  now=at(1)))["child_run_id"]
        await finish(clock_conn, lease.run_id, lease.generation, "cancel", now=at(2))
        assert (await status(clock_conn, kept))[0] == "pending"
        assert (await status(clock_conn, gone))[0] == "cancelled"

    async def test_cancel_cascades_to_grandchildren(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(2))
        grandchild = (await start_child(clock_conn, a, taken[a], "g", deployment="grand-d",
                                        worker=OTHER, now=at(3)))["child_run_id"]
        await wait_children(clock_conn, a, taken[a], "j", [grandchild], worker=OTHER, now=at(4))
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(5)) == "cancel_requested"
        await finish(clock_conn, lease.run_id, lease.generation, "cancel", now=at(6))
        assert (await status(clock_conn, a))[0] == "cancelled"
        assert (await status(clock_conn, grandchild))[0] == "cancelled"

    async def test_completed_parent_leaves_its_children_running(self, clock_conn):
        lease, (a,) = await parent_with_children(clock_conn, 1)
        await finish(clock_conn, lease.run_id, lease.generation, "complete", now=at(2))
        assert (await status(clock_conn, a))[0] == "pending"

    async def test_prune_deletes_the_links_and_waits_with_the_parent(self, clock_conn):
        lease, (b,) = await parent_with_children(clock_conn, 1)
        a = (await start_child(clock_conn, lease.run_id, lease.generation, "kept", detached=True,
                               now=at(1)))["child_run_id"]
        await wait_children(clock_conn, lease.run_id, lease.generation, "j", [b], now=at(2))
        assert await clock_conn.fetchval(  # a waiting parent cancelled: its wait stays till prune
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(3)) == "cancelled"
        assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.child_waits") == 1
        assert await clock_conn.fetchval(
            "SELECT zeroth_test.prune_runs(older_than => interval '1 second', now_override => $1)",
            at(100)) == 2  # the parent and its cancelled child b
        assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.child_runs") == 0
        assert await clock_conn.fetchval("SELECT count(*) FROM zeroth.child_waits") == 0
        # The orphaned child still ends normally.
        taken = await claim_start(clock_conn, CHILD, worker=OTHER, now=at(101))
        assert await finish(clock_conn, a, taken[a], "complete", worker=OTHER, now=at(102))
