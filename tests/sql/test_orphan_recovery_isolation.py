"""One bad run never stops the recovery of another, and every stored error document is bounded
(the SQL half).

* The sweeps — claim_orphaned (both steps), claim_orphaned_scopes, reconcile_thread_runs,
  claim_for_takeover — end alone a run whose recovery raises: it is rolled back, dead-lettered
  with stop_reason recovery_failed (an operator finds it in zeroth.dead_letters), and the
  innocent orphans beside it are recovered by the same call. A run whose dead-lettering raises
  too is left with a WARNING and the others still go on. The failure is simulated by a trigger
  the test installs (a takeover that raises for a reason nobody foresaw); the two real triggers
  known are tested as themselves: a cancel cascade deeper than the stack, and an error
  document near jsonb's limit.
* The cancel cascade is iterative: a 1,000-generation chain is cancelled by one request_cancel,
  and the attempt history still gets the row of each cancelled running attempt.
* fail_run, commit_fenced and the stop documents store an error document within the bound:
  65,536 characters a top-level string, 1 MiB (1,048,576 bytes of jsonb) the document.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, WORKER, Lease, at, make_run, run_row

TEXT_CHARS = 65_536
DOCUMENT_BYTES = 1_048_576
AFTER_EXPIRY = at(120)  # factories lease until at(60)

POISON = """
CREATE FUNCTION pg_temp.poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A takeover that raises: the end of a running run whose payload says poison, unless it is the
    -- dead-lettering of a recovery that failed (poison "hard": that too).
    IF OLD.payload ->> 'poison' = 'transient' AND OLD.status = 'running'
       AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'could not serialize run %', OLD.run_id USING ERRCODE = '40001';
    END IF;
    IF OLD.payload ? 'poison' AND OLD.status = 'running' AND NEW.status IS DISTINCT FROM OLD.status
       AND (OLD.payload ->> 'poison' = 'hard'
            OR coalesce(NEW.error ->> 'stop_reason', '') <> 'recovery_failed') THEN
        RAISE EXCEPTION 'poisoned run %', OLD.run_id USING ERRCODE = 'XX001';
    END IF;
    -- A re-lease that raises.
    IF OLD.payload ? 'poison_lease' AND OLD.status = 'running'
       AND NEW.lease_generation IS DISTINCT FROM OLD.lease_generation
       AND NEW.lease_worker_id IS NOT NULL THEN
        RAISE EXCEPTION 'poisoned lease of run %', OLD.run_id USING ERRCODE = 'XX001';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER zz_test_poison BEFORE UPDATE ON zeroth.runs
    FOR EACH ROW EXECUTE FUNCTION pg_temp.poison();
"""


@pytest.fixture
async def poison(conn: asyncpg.Connection) -> None:
    """The test's own trigger (superuser set-up; the database is thrown away after the test)."""
    await conn.execute(POISON)


async def orphan(conn: asyncpg.Connection, *, payload: dict[str, Any] | None = None,
                 tenant_id: str | None = None, deployment_ref: str = DEPLOYMENT,
                 resumable: bool = False, max_attempts: int = 3,
                 thread_id: str | None = None) -> Lease:
    """A running run whose lease (until at(60)) its worker stopped renewing. Not resumable by
    default: the sweep's step 1 ends it."""
    extra: dict[str, Any] = {"max_attempts": max_attempts}
    if thread_id is not None:
        extra["thread_id"] = thread_id
    lease = await make_run(conn, "running", payload=payload, tenant_id=tenant_id,
                           deployment_ref=deployment_ref, **extra)
    if not resumable:
        await conn.execute("UPDATE zeroth.runs r SET resumable = false WHERE r.run_id = $1",
                           lease.run_id)
    return lease


async def sweep(conn: asyncpg.Connection, *, tenant_id: str | None = None,
                now: Any = AFTER_EXPIRY) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => 'rescuer',
               tenant_id => $2, grace_seconds => 10, now_override => $3)""",
        DEPLOYMENT, tenant_id, now)


async def status_of(conn: asyncpg.Connection, lease: Lease,
                    tenant_id: str = "default") -> tuple[str, Any]:
    row = await run_row(conn, lease.run_id, tenant_id=tenant_id)
    error = json.loads(row["error"]) if row["error"] is not None else None
    return row["status"], error


def assert_recovery_failed(status: str, error: Any) -> None:
    assert status == "failed"
    assert error["stop_reason"] == "recovery_failed"
    assert "XX001" in error["message"]
    assert "poisoned" in error["message"]


# -- one bad run, the others recovered -------------------------------------------------------


class TestClaimOrphaned:
    async def test_the_innocent_orphan_is_recovered_beside_one_whose_end_raises(self, conn, poison):
        poisoned = await orphan(conn, payload={"poison": True})
        innocent = await orphan(conn)
        resumable = await orphan(conn, resumable=True)

        rows = await sweep(conn)

        assert [r["run_id"] for r in rows if r["run_id"]] == [resumable.run_id]
        status, error = await status_of(conn, innocent)
        assert (status, error["stop_reason"]) == ("failed", "orphan_recovered")
        status, error = await status_of(conn, poisoned)
        assert_recovery_failed(status, error)
        row = await run_row(conn, poisoned.run_id)
        assert row["dead_lettered_at"] == AFTER_EXPIRY
        assert row["lease_worker_id"] is None
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.dead_letters d WHERE d.run_id = $1", poisoned.run_id) == 1
        # The next pass does not meet it again.
        assert [r["run_id"] for r in await sweep(conn, now=at(150)) if r["run_id"]] == []
        assert (await run_row(conn, poisoned.run_id))["updated_at"] == AFTER_EXPIRY

    async def test_a_run_whose_re_lease_raises_is_ended_alone_and_the_others_re_leased(
            self, conn, poison):
        poisoned = await orphan(conn, payload={"poison_lease": True}, resumable=True)
        innocent = await orphan(conn, resumable=True)

        rows = await sweep(conn)

        assert [r["run_id"] for r in rows if r["run_id"]] == [innocent.run_id]
        assert (await run_row(conn, innocent.run_id))["lease_worker_id"] == "rescuer"
        status, error = await status_of(conn, poisoned)
        assert status == "failed"
        assert error["stop_reason"] == "recovery_failed"
        assert "poisoned lease" in error["message"]

    async def test_a_run_whose_dead_lettering_raises_too_is_left_and_the_others_recovered(
            self, conn, poison):
        poisoned = await orphan(conn, payload={"poison": "hard"})
        innocent = await orphan(conn)
        notices: list[Any] = []
        conn.add_log_listener(lambda _conn, message: notices.append(message))

        await sweep(conn)  # the call itself succeeds

        assert (await status_of(conn, innocent))[0] == "failed"
        row = await run_row(conn, poisoned.run_id)
        assert (row["status"], row["lease_worker_id"]) == ("running", WORKER)
        assert any(f"the recovery of run {poisoned.run_id} raised XX001" in n.message
                   for n in notices)
        # ... and the next pass still recovers the others.
        later = await orphan(conn)
        await sweep(conn, now=at(200))
        assert (await status_of(conn, later))[0] == "failed"

    async def test_a_passing_error_fails_the_pass_and_ends_no_run(self, conn, poison):
        # A serialization failure, a deadlock, a lock timeout, out of memory: nothing to do with
        # the run. The pass fails as before (the caller retries it); no run is dead-lettered.
        poisoned = await orphan(conn, payload={"poison": "transient"})
        innocent = await orphan(conn)

        with pytest.raises(asyncpg.SerializationError):
            async with conn.transaction():  # a savepoint: the test's connection goes on
                await sweep(conn)

        assert (await status_of(conn, poisoned))[0] == "running"
        assert (await status_of(conn, innocent))[0] == "running"
        with pytest.raises(asyncpg.SerializationError):
            async with conn.transaction():
                await conn.fetch(
                    """SELECT * FROM zeroth_test.claim_for_takeover(run_id => $1,
                           grace_seconds => 10, now_override => $2)""",
                    poisoned.run_id, AFTER_EXPIRY)

    async def test_a_cancel_requested_orphan_over_a_deep_chain_stops_no_other_recovery(
            self, conn):
        # The review's first trigger, as itself: the orphan's takeover cancels it, and the cancel
        # cascades into 400 generations of children waiting for each other.
        root = await orphan(conn, max_attempts=1, resumable=True)
        await build_chain(conn, parent=root, depth=400)
        await conn.execute("SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
                           root.run_id, at(1))
        innocent = await orphan(conn)

        await sweep(conn)

        assert (await status_of(conn, innocent))[0] == "failed"
        assert (await status_of(conn, root))[0] == "cancelled"
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.runs r WHERE r.deployment_ref = 'chain'") == 400
        assert await conn.fetchval(
            """SELECT count(*) FROM zeroth.runs r
                WHERE r.deployment_ref = 'chain' AND r.status <> 'cancelled'""") == 0


class TestTheOtherSweeps:
    async def test_claim_orphaned_scopes_recovers_every_other_scope_and_run(self, conn, poison):
        poisoned = await orphan(conn, payload={"poison": True}, tenant_id="acme")
        same_scope = await orphan(conn, tenant_id="acme")
        other_scope = await orphan(conn, tenant_id="globex")
        resumable = await orphan(conn, tenant_id="globex", resumable=True)

        rows = await conn.fetch(
            """SELECT * FROM zeroth_test.claim_orphaned_scopes(deployment_refs => $1,
                   worker_id => 'rescuer', grace_seconds => 10, now_override => $2)""",
            [DEPLOYMENT], AFTER_EXPIRY)

        assert [(r["tenant_id"], r["run_id"]) for r in rows if r["run_id"]] == [
            ("globex", resumable.run_id)]
        assert (await status_of(conn, same_scope, "acme"))[0] == "failed"
        assert (await status_of(conn, other_scope, "globex"))[0] == "failed"
        assert_recovery_failed(*await status_of(conn, poisoned, "acme"))

    async def test_reconcile_thread_runs_takes_over_the_others(self, conn, poison):
        poisoned = await orphan(conn, payload={"poison": True}, thread_id="t-1")
        innocent = await orphan(conn, thread_id="t-2")

        rows = await conn.fetch(
            """SELECT * FROM zeroth_test.reconcile_thread_runs(deployment_ref => $1,
                   grace_seconds => 10, now_override => $2)""", DEPLOYMENT, AFTER_EXPIRY)

        assert sorted((r["thread_id"], r["outcome"]) for r in rows) == [
            ("t-1", "dead_lettered"), ("t-2", "failed")]
        assert (await status_of(conn, innocent))[0] == "failed"
        assert_recovery_failed(*await status_of(conn, poisoned))

    async def test_claim_for_takeover_ends_a_run_whose_takeover_raises(self, conn, poison):
        poisoned = await orphan(conn, payload={"poison": True})

        rows = await conn.fetch(
            """SELECT * FROM zeroth_test.claim_for_takeover(run_id => $1, grace_seconds => 10,
                   now_override => $2)""", poisoned.run_id, AFTER_EXPIRY)

        assert [(r["outcome"], r["status"], r["previous_generation"]) for r in rows] == [
            ("dead_lettered", "failed", poisoned.generation)]
        assert_recovery_failed(*await status_of(conn, poisoned))


# -- the cancel cascade ----------------------------------------------------------------------


async def build_chain(conn: asyncpg.Connection, *, parent: Lease, depth: int,
                      leaf_lease_seconds: float = 60) -> None:
    """``depth`` generations under ``parent`` (which keeps running), deployment 'chain': each
    generation is claimed, starts one child and waits for it; the last is left running (leased
    for leaf_lease_seconds from at(0)). Through the API, in one DO block."""
    await conn.execute(f"""
        DO $$
        DECLARE
            v_run   uuid := '{parent.run_id}';
            v_gen   bigint := {parent.generation};
            v_child uuid;
            v_at    timestamptz := '{at(0).isoformat()}';
        BEGIN
            FOR i IN 1 .. {depth} LOOP
                SELECT s.child_run_id INTO v_child FROM zeroth_test.start_child_run(
                    run_id => v_run, worker_id => '{parent.worker_id}', generation => v_gen,
                    step_key => 'child', deployment_ref => 'chain', now_override => v_at) AS s;
                IF v_run <> '{parent.run_id}' THEN
                    PERFORM zeroth_test.wait_for_children(
                        run_id => v_run, worker_id => '{parent.worker_id}', generation => v_gen,
                        step_key => 'wait', child_run_ids => ARRAY[v_child], now_override => v_at);
                END IF;
                SELECT c.run_id, c.lease_generation INTO v_run, v_gen
                  FROM zeroth_test.claim_and_start(deployment_ref => 'chain',
                           worker_id => '{parent.worker_id}',
                           lease_seconds => CASE WHEN i = {depth} THEN {leaf_lease_seconds}
                                                 ELSE 60 END,
                           now_override => v_at) AS c
                 WHERE c.run_id IS NOT NULL;
                IF v_run IS DISTINCT FROM v_child THEN
                    RAISE EXCEPTION 'generation % claimed %, not its child %', i, v_run, v_child;
                END IF;
            END LOOP;
        END
        $$""")


class TestCancelCascade:
    async def test_a_thousand_generation_chain_is_cancelled_by_one_request(self, conn):
        root = await make_run(conn, "running")
        await build_chain(conn, parent=root, depth=1000, leaf_lease_seconds=1)
        counts = dict(await conn.fetch(
            "SELECT r.status::text, count(*) FROM zeroth.runs r GROUP BY r.status"))
        assert counts == {"running": 2, "waiting": 999}

        # The leaf's lease (1 s from at(0)) ran out: it is cancelled too (taken over), not asked.
        outcome = await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            root.run_id, at(30))

        assert outcome == "cancel_requested"  # the root's own lease is live: it is asked
        assert dict(await conn.fetch(
            "SELECT r.status::text, count(*) FROM zeroth.runs r GROUP BY r.status")) == {
            "running": 2, "waiting": 999}
        # Its worker cancels it: the whole chain follows, in the same call.
        assert await conn.fetchval(
            """SELECT zeroth_test.cancel_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", root.run_id, root.worker_id, root.generation, at(30))
        assert dict(await conn.fetch(
            "SELECT r.status::text, count(*) FROM zeroth.runs r GROUP BY r.status")) == {
            "cancelled": 1001}
        # Every cancelled running attempt has its row: the root's and the leaf's.
        assert await conn.fetchval(
            """SELECT count(*) FROM zeroth.run_attempts a
                WHERE a.outcome = 'cancelled' AND a.ended_at = $1""", at(30)) == 2
        # Every child's outcome was copied for its parent.
        assert await conn.fetchval(
            "SELECT count(*) FROM zeroth.child_runs c WHERE c.status = 'cancelled'") == 1000

    async def test_a_waiting_root_of_a_deep_chain_is_cancelled_at_once(self, conn):
        root = await make_run(conn, "running")
        await build_chain(conn, parent=root, depth=500)
        child = await conn.fetchval(
            "SELECT c.child_run_id FROM zeroth.child_runs c WHERE c.parent_run_id = $1",
            root.run_id)
        await conn.execute(
            """SELECT zeroth_test.wait_for_children(run_id => $1, worker_id => $2,
                   generation => $3, step_key => 'wait', child_run_ids => ARRAY[$4::uuid],
                   now_override => $5)""",
            root.run_id, root.worker_id, root.generation, child, at(1))

        assert await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            root.run_id, at(2)) == "cancelled"

        # The leaf's lease is live: it is asked to cancel; everything above it is cancelled.
        assert dict(await conn.fetch(
            "SELECT r.status::text, count(*) FROM zeroth.runs r GROUP BY r.status")) == {
            "cancelled": 500, "running": 1}
        leaf = await conn.fetchrow(
            "SELECT r.* FROM zeroth.runs r WHERE r.status = 'running'")
        assert leaf["cancel_requested_at"] == at(2)


# -- the error document bound ----------------------------------------------------------------


async def fail(conn: asyncpg.Connection, lease: Lease, error_sql: str, *,
               retryable: bool = False) -> str:
    return await conn.fetchval(  # type: ignore[no-any-return]
        f"""SELECT zeroth_test.fail_run(run_id => $1, worker_id => $2, generation => $3,
                error => {error_sql}, retryable => $4, retry_base_seconds => 0,
                now_override => $5)""",
        lease.run_id, lease.worker_id, lease.generation, retryable, at(1))


async def stored_error(conn: asyncpg.Connection, lease: Lease) -> tuple[int, Any]:
    size, error = await conn.fetchrow(
        "SELECT pg_column_size(r.error #> '{}'), r.error FROM zeroth.runs r WHERE r.run_id = $1",
        lease.run_id)
    return size, json.loads(error)


class TestErrorDocumentBound:
    async def test_a_document_within_the_bound_is_stored_as_given(self, conn):
        lease = await make_run(conn, "running")
        given = {"type": "ValueError", "message": "é" * 20_000, "traceback": "x" * 60_000,
                 "nested": {"deep": ["a", 1, None]}, "n": 1.5}
        assert await fail(conn, lease, f"'{json.dumps(given)}'::jsonb") == "failed"
        assert (await stored_error(conn, lease))[1] == given

    async def test_fail_run_cuts_a_longer_text_and_says_so(self, conn):
        lease = await make_run(conn, "running")
        outcome = await fail(conn, lease, """jsonb_build_object('type', 'ValueError',
            'message', repeat('m', 100000), 'traceback', repeat('t', 4000))""")
        assert outcome == "failed"  # the attempt still ends
        _, error = await stored_error(conn, lease)
        assert error == {"type": "ValueError", "message": "m" * TEXT_CHARS,
                         "traceback": "t" * 4000, "truncated": True}

    async def test_fail_run_summarises_a_document_too_large_even_cut(self, conn):
        lease = await make_run(conn, "running")
        outcome = await fail(conn, lease, """jsonb_build_object('type', 'ValueError',
            'message', 'boom', 'worker_id', 'w', 'lease_generation', 1,
            'frames', (SELECT jsonb_agg(repeat('f', 1000)) FROM generate_series(1, 3000)))""",
                             retryable=True)
        assert outcome == "retry_scheduled"
        size, error = await stored_error(conn, lease)
        assert size <= DOCUMENT_BYTES
        assert error.pop("original_bytes") > 3_000_000
        assert error == {"truncated": True, "type": "ValueError", "message": "boom",
                         "worker_id": "w", "lease_generation": 1}

    async def test_a_document_from_a_table_is_measured_uncompressed(self, conn):
        # A caller's own temporary table hands over a compressed value; its compressed size
        # (a few KB) must not pass for its size.
        lease = await make_run(conn, "running")
        await conn.execute("""CREATE TEMP TABLE given AS
            SELECT jsonb_build_object('message', 'boom',
                                      'frames', jsonb_build_array(repeat('z', 5000000))) AS e""")
        await fail(conn, lease, "(SELECT g.e FROM given g)")
        size, error = await stored_error(conn, lease)
        assert size <= DOCUMENT_BYTES
        assert error["truncated"] is True
        assert error["message"] == "boom"

    async def test_a_string_document_is_cut_into_a_summary(self, conn):
        lease = await make_run(conn, "running")
        await fail(conn, lease, "to_jsonb(repeat('s', 200000))")
        _, error = await stored_error(conn, lease)
        assert error.pop("original_bytes") > 200_000
        assert error == {"truncated": True, "message": "s" * TEXT_CHARS}

    async def test_commit_fenced_stores_an_error_bounded(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                   columns => jsonb_build_object('error', jsonb_build_object(
                       'message', repeat('c', 70000))), now_override => $4)""",
            lease.run_id, lease.worker_id, lease.generation, at(1))
        _, error = await stored_error(conn, lease)
        assert error == {"message": "c" * TEXT_CHARS, "truncated": True}

    async def test_a_stop_document_stays_bounded_whatever_the_previous_error(self, conn):
        # A previous error larger than the bound (stored before it existed, or by a DBA).
        lease = await orphan(conn, resumable=True, max_attempts=1)
        await conn.execute(
            """UPDATE zeroth.runs r SET error = jsonb_build_object('type', 'E', 'message', 'old',
                   'frames', (SELECT jsonb_agg(repeat('p', 1000)) FROM generate_series(1, 3000)))
                WHERE r.run_id = $1""", lease.run_id)

        await sweep(conn)

        size, error = await stored_error(conn, lease)
        assert size <= DOCUMENT_BYTES
        assert error["stop_reason"] == "attempts_exhausted"
        previous = error["previous_error"]
        assert previous["truncated"] is True
        assert previous["message"] == "old"

    async def test_a_takeover_message_is_cut(self, conn):
        lease = await orphan(conn)
        rows = await conn.fetch(
            """SELECT * FROM zeroth_test.claim_for_takeover(run_id => $1, grace_seconds => 10,
                   message => repeat('q', 100000), now_override => $2)""",
            lease.run_id, AFTER_EXPIRY)
        assert [r["outcome"] for r in rows] == ["failed"]
        _, error = await stored_error(conn, lease)
        assert error["message"] == "q" * TEXT_CHARS

    @pytest.mark.slow
    async def test_an_error_near_the_jsonb_limit_stops_no_recovery(self, conn):
        # The review's second trigger, as itself: an error string of 268,435,400 bytes stored
        # (before the bound, or by a DBA); its dead-lettering wrapped it past jsonb's limit.
        poisoned = await orphan(conn, resumable=True, max_attempts=1)
        await conn.execute(
            """UPDATE zeroth.runs r
                  SET error = jsonb_build_object('message', repeat('x', 268435400))
                WHERE r.run_id = $1""", poisoned.run_id)
        innocent = await orphan(conn)

        await sweep(conn)

        assert (await status_of(conn, innocent))[0] == "failed"
        size, error = await stored_error(conn, poisoned)
        assert size <= DOCUMENT_BYTES
        assert error["stop_reason"] == "attempts_exhausted"
        assert error["previous_error"]["truncated"] is True
        assert error["previous_error"]["message"] == "x" * TEXT_CHARS
