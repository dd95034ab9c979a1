"""zeroth.settle_runs: one worker ends a mixed batch of its runs (completions, failures, cancels,
hand-backs) in one call — each row fenced and checked against zeroth.run_transitions on its
own, a refused row reported (ZP002, ZP012) without stopping the others, the ended attempts
recorded by the settling statement, one wakeup per deployment. (The fence cases common to every
fenced function are in test_fenced_conformance.py.)"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest
from helpers import WORKER, at, listen, make_run, next_payload, run_row, wakeup_key
from test_complete_runs import drain, table_state

OTHER = "worker-b"

SETTLE_RUNS = """SELECT run_id, outcome, sqlstate FROM zeroth_test.settle_runs(worker_id => $1,
    run_ids => $2::uuid[], generations => $3::bigint[], outcomes => $4::text[],
    outputs => $5::text[]::jsonb[], errors => $6::text[]::jsonb[], tenant_id => $7,
    now_override => $8)"""


async def settle(conn: asyncpg.Connection, items: list[tuple[Any, ...]], *,
                 worker_id: str | None = WORKER, tenant_id: str | None = None,
                 now: Any = None) -> list[tuple[Any, str | None, str | None]]:
    """items: (run_id, generation, outcome[, output[, error]])."""
    outputs = [json.dumps(i[3]) if len(i) > 3 and i[3] is not None else None for i in items]
    errors = [json.dumps(i[4]) if len(i) > 4 and i[4] is not None else None for i in items]
    rows = await conn.fetch(
        SETTLE_RUNS, worker_id, [i[0] for i in items], [i[1] for i in items],
        [i[2] for i in items], outputs if any(outputs) else None,
        errors if any(errors) else None, tenant_id, now or at(5))
    return [(r["run_id"], r["outcome"], r["sqlstate"]) for r in rows]


async def history(conn: asyncpg.Connection, run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in await conn.fetch(
        "SELECT lease_generation, worker_id, outcome, error IS NOT NULL FROM zeroth.run_attempts "
        "WHERE run_id = $1 ORDER BY ended_at, lease_generation", run_id)]


class TestMixedBatch:
    async def test_each_run_ends_as_asked_in_one_call(self, conn):
        done, retry, fail, cancel, back = [await make_run(conn, "running") for _ in range(5)]

        result = await settle(conn, [
            (done.run_id, 1, "complete", {"n": 1}),
            (retry.run_id, 1, "retry", None, {"message": "again"}),
            (fail.run_id, 1, "fail", None, {"message": "no"}),
            (cancel.run_id, 1, "cancel"),
            (back.run_id, 1, "hand_back"),
        ])

        assert result == [(done.run_id, "completed", None),
                          (retry.run_id, "retry_scheduled", None),
                          (fail.run_id, "failed", None),
                          (cancel.run_id, "cancelled", None),
                          (back.run_id, "handed_back", None)]
        rows = {le.run_id: await run_row(conn, le.run_id)
                for le in (done, retry, fail, cancel, back)}
        assert [rows[le.run_id]["status"] for le in (done, retry, fail, cancel, back)] == [
            "completed", "pending", "failed", "cancelled", "pending"]
        assert json.loads(rows[done.run_id]["output"]) == {"n": 1}
        assert json.loads(rows[retry.run_id]["error"]) == {"message": "again"}
        assert rows[retry.run_id]["run_after"] > at(5)
        assert json.loads(rows[fail.run_id]["error"]) == {"message": "no"}
        assert rows[fail.run_id]["dead_lettered_at"] is None
        assert rows[cancel.run_id]["cancel_action"] == "cancel"
        assert rows[back.run_id]["hand_backs"] == 1
        for row in rows.values():
            assert (row["lease_worker_id"], row["lease_expires_at"], row["admission_slot"]) == (
                None, None, None)
        # One history row per end, written by the settle itself (the trigger adds none).
        assert [await history(conn, le.run_id) for le in (done, retry, fail, cancel, back)] == [
            [(1, WORKER, "completed", False)], [(1, WORKER, "failed", True)],
            [(1, WORKER, "failed", True)], [(1, WORKER, "cancelled", False)],
            [(1, WORKER, "handed_back", False)]]

    async def test_a_retry_with_no_attempt_left_is_dead_lettered(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)

        assert await settle(conn, [(lease.run_id, 1, "retry", None, {"m": 1})]) == [
            (lease.run_id, "dead_lettered", None)]
        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["dead_lettered_at"]) == ("failed", at(5))
        assert await history(conn, lease.run_id) == [(1, WORKER, "dead_lettered", True)]

    async def test_a_refused_row_is_reported_and_never_stops_the_others(self, conn):
        live = await make_run(conn, "running")
        others = await make_run(conn, "running", worker_id=OTHER)
        claimed = await make_run(conn, "claimed")  # held, but not running: no such edge
        unknown = uuid.uuid4()
        before = {le.run_id: dict(await run_row(conn, le.run_id)) for le in (others, claimed)}

        result = await settle(conn, [(others.run_id, 1, "complete"),
                                     (claimed.run_id, 1, "complete"),
                                     (unknown, 1, "fail"),
                                     (live.run_id, 1, "complete")])

        assert result == [(others.run_id, None, "ZP002"), (claimed.run_id, None, "ZP012"),
                          (unknown, None, "ZP002"), (live.run_id, "completed", None)]
        for run_id, row in before.items():
            assert dict(await run_row(conn, run_id)) == row
            assert await history(conn, run_id) == []
        assert (await run_row(conn, live.run_id))["status"] == "completed"

    async def test_an_expired_lease_or_another_scope_is_fenced_out(self, conn):
        lease = await make_run(conn, "running", tenant_id="t1")
        assert await settle(conn, [(lease.run_id, 1, "complete")], tenant_id="t2") == [
            (lease.run_id, None, "ZP002")]
        assert await settle(conn, [(lease.run_id, 1, "complete")], tenant_id="t1",
                            now=at(61)) == [(lease.run_id, None, "ZP002")]
        assert await settle(conn, [(lease.run_id, 2, "complete")], tenant_id="t1") == [
            (lease.run_id, None, "ZP002")]
        assert (await run_row(conn, lease.run_id, tenant_id="t1"))["status"] == "running"

    async def test_a_claim_not_started_can_be_cancelled(self, conn):
        claimed = await make_run(conn, "claimed")
        assert await settle(conn, [(claimed.run_id, 1, "cancel")]) == [
            (claimed.run_id, "cancelled", None)]
        assert await history(conn, claimed.run_id) == [(1, WORKER, "cancelled", False)]

    async def test_an_empty_batch_settles_nothing(self, conn):
        assert await settle(conn, []) == []


class TestTransitionTable:
    async def test_an_outcome_whose_edge_is_not_listed_changes_nothing(self, conn):
        """The settle path reads its edges from zeroth.run_transitions: without the edge
        running → completed, a completion is refused (ZP012 here, ZP003 from complete_run)."""
        first, second = await make_run(conn, "running"), await make_run(conn, "running")
        await conn.execute("DELETE FROM zeroth.run_transitions WHERE outcome = 'completed'")
        before = await table_state(conn)

        assert await settle(conn, [(first.run_id, 1, "complete"),
                                   (second.run_id, 1, "cancel")]) == [
            (first.run_id, None, "ZP012"), (second.run_id, "cancelled", None)]
        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await conn.fetchval(
                    "SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, "
                    "generation => 1, now_override => $3)", first.run_id, WORKER, at(5))
        assert info.value.sqlstate == "ZP003"
        after = await table_state(conn)
        assert [r for r in after[0] if r["run_id"] == first.run_id] == [
            r for r in before[0] if r["run_id"] == first.run_id]


class TestWakeup:
    async def test_one_wakeup_per_deployment_for_a_mixed_batch(self, connect):
        conn = await connect()  # autocommit: NOTIFY is delivered at commit
        first, second = (f"settle-{uuid.uuid4().hex[:8]}" for _ in range(2))
        queue = await listen(await connect(), "zeroth_wakeup",
                             ((first, "t1", None), (second, "t1", None)))
        leases = [await make_run(conn, "running", tenant_id="t1", max_concurrency=5,
                                 deployment_ref=first) for _ in range(3)]
        leases.append(await make_run(conn, "running", tenant_id="t1", max_concurrency=5,
                                     deployment_ref=second))
        await drain(conn, queue)  # the enqueues' own wakeups

        result = await settle(conn, [(leases[0].run_id, 1, "complete"),
                                     (leases[1].run_id, 1, "fail"),
                                     (leases[2].run_id, 1, "hand_back"),
                                     (leases[3].run_id, 1, "cancel")], tenant_id="t1")

        assert all(outcome is not None for _, outcome, _ in result)
        await conn.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")
        payloads = [await next_payload(queue) for _ in range(3)]
        assert sorted(payloads[:2]) == sorted([await wakeup_key(conn, first, "t1"),
                                               await wakeup_key(conn, second, "t1")])
        assert payloads[2] == "sentinel"


class TestRejectedArguments:
    @pytest.mark.parametrize("case", [
        "null-worker", "empty-worker", "null-outcomes", "outcomes-length", "unknown-outcome",
        "null-outcome", "output-for-a-failure", "error-for-a-completion", "repeated-run",
        "length-mismatch", "outcomes-from-zero", "retry-bounds", "retry-too-long",
        "retry-base-without-cap", "retry-cap-without-base"])
    async def test_bad_argument_raises_zp008_and_changes_nothing(self, conn, case):
        lease = await make_run(conn, "running")
        other = await make_run(conn, "running")
        worker: str | None = WORKER
        run_ids: Any = [lease.run_id, other.run_id]
        generations: Any = [1, 1]
        outcomes: Any = ["complete", "complete"]
        outputs: Any = None
        errors: Any = None
        base, top = 1.0, 300.0
        if case == "null-worker":
            worker = None
        elif case == "empty-worker":
            worker = ""
        elif case == "null-outcomes":
            outcomes = None
        elif case == "outcomes-length":
            outcomes = ["complete"]
        elif case == "unknown-outcome":
            outcomes = ["complete", "sleep"]
        elif case == "null-outcome":
            outcomes = ["complete", None]
        elif case == "output-for-a-failure":
            outcomes, outputs = ["complete", "fail"], [None, "1"]
        elif case == "error-for-a-completion":
            errors = ['{"m": 1}', None]
        elif case == "repeated-run":
            run_ids = [lease.run_id, lease.run_id]
        elif case == "length-mismatch":
            generations = [1]
        elif case == "retry-bounds":
            base, top = 10.0, 1.0
        elif case == "retry-too-long":
            top = 86400 * 31.0
        elif case == "retry-base-without-cap":
            top = None
        elif case == "retry-cap-without-base":
            base = None
        before = await table_state(conn)
        query = ("SELECT * FROM zeroth_test.settle_runs(worker_id => $1, run_ids => $2::uuid[], "
                 "generations => $3::bigint[], outcomes => {}, outputs => $5::text[]::jsonb[], "
                 "errors => $6::text[]::jsonb[], retry_base_seconds => $7, "
                 "retry_max_seconds => $8, now_override => $9)")
        outcomes_sql = ("('[0:1]={' || array_to_string($4::text[], ',') || '}')::text[]"
                        if case == "outcomes-from-zero" else "$4::text[]")
        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await conn.fetch(query.format(outcomes_sql), worker, run_ids, generations,
                                 outcomes, outputs, errors, base, top, at(5))
        assert info.value.sqlstate == "ZP008", info.value
        assert await table_state(conn) == before


class TestRetryPolicy:
    """A retry's first delay is base * 2^0 with equal jitter: in [base / 2, base]."""

    @staticmethod
    async def first_delay(conn: asyncpg.Connection, run_id: Any, base: float | None,
                          cap: float | None) -> float:
        rows = await conn.fetch(
            "SELECT outcome FROM zeroth_test.settle_runs(worker_id => $1, run_ids => $2::uuid[], "
            "generations => '{1}', outcomes => '{retry}', retry_base_seconds => $3, "
            "retry_max_seconds => $4, now_override => $5)", WORKER, [run_id], base, cap, at(5))
        assert [r["outcome"] for r in rows] == ["retry_scheduled"]
        return float(((await run_row(conn, run_id))["run_after"] - at(5)).total_seconds())

    async def test_without_a_policy_each_run_takes_its_deployments_registered_one(self, conn):
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'slow', "
                           "max_attempts => 3, priority => 0, retry_base_seconds => 100, "
                           "retry_max_seconds => 200)")
        slow = await make_run(conn, "running", deployment_ref="slow", lease_seconds=3600)
        plain = await make_run(conn, "running", deployment_ref="unregistered", lease_seconds=3600)
        assert 50 <= await self.first_delay(conn, slow.run_id, None, None) <= 100
        assert 0.5 <= await self.first_delay(conn, plain.run_id, None, None) <= 1

    async def test_a_policy_given_wins_over_the_registered_one(self, conn):
        await conn.execute("SELECT zeroth.register_deployment(deployment_ref => 'slow', "
                           "max_attempts => 3, priority => 0, retry_base_seconds => 100, "
                           "retry_max_seconds => 200)")
        slow = await make_run(conn, "running", deployment_ref="slow", lease_seconds=3600)
        assert 5 <= await self.first_delay(conn, slow.run_id, 10, 20) <= 10


class TestErrorDocumentsBounded:
    async def test_a_huge_or_deep_error_is_stored_bounded_and_the_batch_settles(self, conn):
        huge, deep, small = [await make_run(conn, "running") for _ in range(3)]
        nested: Any = "x"
        for _ in range(300):
            nested = {"n": nested}
        result = await settle(conn, [
            (huge.run_id, 1, "fail", None, {"message": "m" * 3_000_000, "type": "Boom"}),
            (deep.run_id, 1, "retry", None, {"message": "deep", "detail": nested}),
            (small.run_id, 1, "fail", None, {"message": "small"}),
        ])
        assert [r[1:] for r in result] == [("failed", None), ("retry_scheduled", None),
                                           ("failed", None)]
        for lease in (huge, deep):
            size, limit = await conn.fetchrow(
                "SELECT pg_column_size(error), zeroth._error_document_bytes() FROM zeroth.runs "
                "WHERE run_id = $1", lease.run_id)
            assert size <= limit
        stored = json.loads((await run_row(conn, huge.run_id))["error"])
        assert stored["truncated"] is True
        assert len(stored["message"]) < 3_000_000
        assert json.loads((await run_row(conn, small.run_id))["error"]) == {"message": "small"}
        # The attempt history carries the same bounded document.
        assert await conn.fetchval(
            "SELECT a.error = r.error FROM zeroth.run_attempts a JOIN zeroth.runs r USING (run_id) "
            "WHERE a.run_id = $1", huge.run_id)
