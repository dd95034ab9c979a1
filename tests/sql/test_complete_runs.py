"""zeroth.complete_runs: complete_run for a batch of one worker's runs — each row fenced on its
own, one result row per requested run, slots freed only for the runs that completed."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest
from helpers import WORKER, at, listen, make_run, next_payload, run_row, wakeup_key

COMPLETE_RUNS = """SELECT run_id, completed FROM zeroth_test.complete_runs(worker_id => $1,
    run_ids => $2::uuid[], generations => $3::bigint[], outputs => $4::text[]::jsonb[],
    tenant_id => $5, now_override => $6)"""


async def complete_runs(conn: asyncpg.Connection, pairs: list[tuple[Any, Any]], *,
                        worker_id: str | None = WORKER, outputs: list[Any] | None = None,
                        tenant_id: str | None = None, now: Any = None) -> list[tuple[Any, bool]]:
    texts = None if outputs is None else [
        None if value is None else json.dumps(value) for value in outputs]
    rows = await conn.fetch(COMPLETE_RUNS, worker_id, [p[0] for p in pairs],
                            [p[1] for p in pairs], texts, tenant_id, now or at(1))
    return [(row["run_id"], row["completed"]) for row in rows]


async def table_state(conn: asyncpg.Connection) -> list[list[dict[str, Any]]]:
    return [[dict(r) for r in await conn.fetch(sql)] for sql in (
        "SELECT * FROM zeroth.runs ORDER BY run_id",
        "SELECT * FROM zeroth.admission_slots ORDER BY deployment_ref, slot_no")]


async def drain(conn: asyncpg.Connection, queue: asyncio.Queue[str]) -> None:
    """Read off the notifications of every commit made so far, up to a sentinel notified after
    them (notifications arrive in commit order). Sleeping 0.2 s and emptying the queue guessed
    they had all come by then: on a loaded machine one arriving later was read as the wakeup
    of the call under test."""
    await conn.execute("SELECT pg_notify('zeroth_wakeup', 'drained')")
    while await next_payload(queue) != "drained":
        pass


class TestBatch:
    async def test_every_live_run_completes_with_its_own_output(self, conn):
        leases = [await make_run(conn, "running") for _ in range(3)]

        result = await complete_runs(
            conn, [(le.run_id, le.generation) for le in leases],
            outputs=[{"n": 0}, {"n": 1}, {"n": 2}], now=at(5))

        assert result == [(le.run_id, True) for le in leases]
        for n, lease in enumerate(leases):
            row = await run_row(conn, lease.run_id)
            assert (row["status"], json.loads(row["output"]), row["finished_at"]) == (
                "completed", {"n": n}, at(5))
            assert (row["lease_worker_id"], row["lease_expires_at"], row["lease_generation"]) == (
                None, None, 1)

    async def test_results_follow_the_input_order(self, conn):
        leases = [await make_run(conn, "running") for _ in range(4)]
        pairs = sorted(((le.run_id, le.generation) for le in leases), key=str, reverse=True)

        result = await complete_runs(conn, pairs)

        assert [run_id for run_id, _ in result] == [run_id for run_id, _ in pairs]

    async def test_no_outputs_keeps_committed_output_and_json_null_clears_it(self, conn):
        kept, cleared = await make_run(conn, "running"), await make_run(conn, "running")
        for lease in (kept, cleared):
            assert await conn.fetchval(
                """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => 1,
                       columns => '{"output": {"partial": true}}', now_override => $3)""",
                lease.run_id, WORKER, at(1))

        await complete_runs(conn, [(kept.run_id, 1), (cleared.run_id, 1)], outputs=[None, None])
        other = await make_run(conn, "running")
        await complete_runs(conn, [(other.run_id, 1)], outputs=[None])

        assert json.loads((await run_row(conn, kept.run_id))["output"]) == {"partial": True}
        assert (await run_row(conn, other.run_id))["output"] is None

    async def test_json_null_output_clears(self, conn):
        lease = await make_run(conn, "running")
        await conn.execute(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => 1,
                   columns => '{"output": 1}', now_override => $3)""", lease.run_id, WORKER, at(1))

        rows = await conn.fetch(
            """SELECT completed FROM zeroth_test.complete_runs(worker_id => $1,
                   run_ids => ARRAY[$2::uuid], generations => '{1}',
                   outputs => ARRAY['null'::jsonb], now_override => $3)""",
            WORKER, lease.run_id, at(2))

        assert [r["completed"] for r in rows] == [True]
        assert (await run_row(conn, lease.run_id))["output"] is None

    async def test_empty_batch_returns_no_rows(self, conn):
        assert await complete_runs(conn, []) == []


class TestSlots:
    async def test_only_completed_runs_free_their_slots(self, conn):
        done = await make_run(conn, "running", tenant_id="t1", max_concurrency=2)
        refused = await make_run(conn, "running", tenant_id="t1", max_concurrency=2)

        await complete_runs(conn, [(done.run_id, 1), (refused.run_id, 9)], tenant_id="t1")

        held = await conn.fetch(
            "SELECT run_id FROM zeroth.admission_slots WHERE run_id IS NOT NULL")
        assert [r["run_id"] for r in held] == [refused.run_id]

    async def test_freed_slots_wake_workers_once_per_deployment(self, connect):
        conn = await connect()  # autocommit: NOTIFY is delivered at commit
        first, second = (f"wake-{uuid.uuid4().hex[:8]}" for _ in range(2))
        queue = await listen(await connect(), "zeroth_wakeup",
                             ((first, "t1", None), (second, "t1", None)))
        leases = [await make_run(conn, "running", tenant_id="t1", max_concurrency=5,
                                 deployment_ref=first) for _ in range(3)]
        leases.append(await make_run(conn, "running", tenant_id="t1", max_concurrency=5,
                                     deployment_ref=second))
        await drain(conn, queue)  # the enqueues' own wakeups

        result = await complete_runs(conn, [(le.run_id, 1) for le in leases], tenant_id="t1")

        assert all(completed for _, completed in result)
        await conn.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")
        payloads = [await next_payload(queue) for _ in range(3)]
        # One per deployment, then the sentinel (notifications arrive in commit order).
        assert sorted(payloads[:2]) == sorted([await wakeup_key(conn, first, "t1"),
                                               await wakeup_key(conn, second, "t1")])
        assert payloads[2] == "sentinel"

    async def test_no_slot_freed_sends_no_wakeup(self, connect):
        conn = await connect()
        queue = await listen(await connect(), "zeroth_wakeup")
        lease = await make_run(conn, "running", deployment_ref="nowake-" + uuid.uuid4().hex[:8])
        await drain(conn, queue)

        assert await complete_runs(conn, [(lease.run_id, 1)]) == [(lease.run_id, True)]
        # Nothing comes before a sentinel notified after the completion committed.
        await conn.execute("SELECT pg_notify('zeroth_wakeup', 'sentinel')")
        assert await next_payload(queue) == "sentinel"


class TestRejectedArguments:
    # The fence and the batch's shape (NULL, unequal, two-dimensional, repeated, over 1000):
    # tests/sql/test_fenced_conformance.py. Here: outputs that cannot pair with the runs.
    @pytest.mark.parametrize("case", ["outputs-length", "outputs-from-zero"])
    async def test_bad_outputs_raise_zp008_and_change_nothing(self, conn, case):
        lease = await make_run(conn, "running")
        if case == "outputs-length":
            sql = COMPLETE_RUNS
            sql_args: tuple[Any, ...] = (WORKER, [lease.run_id], [1],
                                         [json.dumps({"a": 1}), json.dumps({"b": 2})], None,
                                         at(1))
        else:
            # '[0:0]={...}': outputs[i] would pair with the wrong run (an array not from 1).
            sql_args = (WORKER, [lease.run_id], [1], '[0:0]={"{\\"a\\": 1}"}', None, at(1))
            sql = COMPLETE_RUNS.replace("$4::text[]::jsonb[]", "$4::text::jsonb[]")
        before = await table_state(conn)

        async def call() -> None:
            async with conn.transaction():
                await conn.fetch(sql, *sql_args)

        with pytest.raises(asyncpg.PostgresError) as error:
            await call()

        assert error.value.sqlstate == "ZP008"
        assert await table_state(conn) == before
