"""zeroth.complete_and_claim: complete_runs and claim_and_start in one call and one transaction.
The completions are complete_runs' (each fenced on its own), the claim is claim_and_start's, a
slot the completions freed is claimable by the same call, and an error anywhere leaves both
undone."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest
from helpers import DEPLOYMENT, LEASE, WORKER, at, enqueue, make_run, run_row

COMPLETE_AND_CLAIM = """SELECT x.completed, (x.claimed).run_id, (x.claimed).lease_generation,
    (x.claimed).status::text AS status, (x.claimed).attempts,
    (x.claimed).concurrency_saturated, (x.claimed).active_count
    FROM zeroth_test.complete_and_claim(deployment_ref => $1, worker_id => $2,
    run_ids => $3::uuid[], generations => $4::bigint[], outputs => $5::text[]::jsonb[],
    tenant_id => $6, max_concurrency => $7, batch_size => $8, lease_seconds => $9,
    now_override => $10) AS x"""


async def complete_and_claim(
        conn: asyncpg.Connection, pairs: list[tuple[Any, Any]], *,
        deployment_ref: str = DEPLOYMENT, worker_id: str | None = WORKER,
        outputs: list[Any] | None = None, tenant_id: str | None = None,
        max_concurrency: int | None = None, batch_size: int | None = 1,
        now: Any = None) -> list[asyncpg.Record]:
    texts = None if outputs is None else [json.dumps(value) for value in outputs]
    return await conn.fetch(  # type: ignore[no-any-return]
        COMPLETE_AND_CLAIM, deployment_ref, worker_id, [p[0] for p in pairs],
        [p[1] for p in pairs], texts, tenant_id, max_concurrency, batch_size, LEASE,
        now or at(1))


async def table_state(conn: asyncpg.Connection) -> list[list[dict[str, Any]]]:
    return [[dict(r) for r in await conn.fetch(sql)] for sql in (
        "SELECT * FROM zeroth.runs ORDER BY run_id",
        "SELECT * FROM zeroth.admission_slots ORDER BY deployment_ref, slot_no")]


class TestOneCall:
    async def test_completes_the_finished_run_and_starts_the_next(self, conn):
        done = await make_run(conn, "running")
        following = await enqueue(conn)

        rows = await complete_and_claim(conn, [(done.run_id, done.generation)],
                                        outputs=[{"ok": 1}], now=at(5))

        assert [(r["completed"], r["run_id"], r["status"], r["attempts"]) for r in rows] == [
            ([True], following, "running", 1)]
        finished = await run_row(conn, done.run_id)
        assert (finished["status"], json.loads(finished["output"]), finished["finished_at"]) == (
            "completed", {"ok": 1}, at(5))
        started = await run_row(conn, following)
        assert (started["lease_worker_id"], started["started_at"]) == (WORKER, at(5))

    async def test_the_slot_a_completion_frees_is_claimed_by_the_same_call(self, conn):
        done = await make_run(conn, "running", max_concurrency=1)
        following = await enqueue(conn)

        rows = await complete_and_claim(conn, [(done.run_id, done.generation)],
                                        max_concurrency=1)

        assert [(r["completed"], r["run_id"]) for r in rows] == [([True], following)]
        slots = await conn.fetch("SELECT run_id FROM zeroth.admission_slots")
        assert [s["run_id"] for s in slots] == [following]

    async def test_a_refused_completion_is_false_and_the_claim_still_happens(self, conn):
        stale = await make_run(conn, "running")
        following = await enqueue(conn)

        rows = await complete_and_claim(conn, [(stale.run_id, stale.generation + 1)])

        assert [(r["completed"], r["run_id"]) for r in rows] == [([False], following)]
        assert (await run_row(conn, stale.run_id))["status"] == "running"

    async def test_nothing_to_claim_gives_the_marker_row_with_the_completions(self, conn):
        first, second = await make_run(conn, "running"), await make_run(conn, "running")

        rows = await complete_and_claim(
            conn, [(second.run_id, second.generation), (first.run_id, 99)], batch_size=10)

        assert [(r["completed"], r["run_id"]) for r in rows] == [([True, False], None)]

    async def test_a_batch_claims_up_to_its_size(self, conn):
        done = await make_run(conn, "running")
        pending = {await enqueue(conn) for _ in range(5)}

        rows = await complete_and_claim(conn, [(done.run_id, done.generation)], batch_size=3)

        claimed = {r["run_id"] for r in rows}
        assert len(claimed) == 3
        assert claimed <= pending
        assert {r["completed"][0] for r in rows} == {True}


class TestErrorsLeaveBothUndone:
    @pytest.mark.parametrize(("change", "message"), [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": None}, "batch_size"),
        ({"deployment_ref": ""}, "deployment_ref"),
        ({"worker_id": None}, "worker_id"),
    ])
    async def test_a_bad_claim_argument_completes_nothing(self, conn, change, message):
        done = await make_run(conn, "running")
        await enqueue(conn)
        before = await table_state(conn)

        with pytest.raises(asyncpg.PostgresError, match=message) as raised:
            async with conn.transaction():
                await complete_and_claim(conn, [(done.run_id, done.generation)], **change)

        assert raised.value.sqlstate == "ZP008"
        assert await table_state(conn) == before

    # The argument checks of complete_runs and of the claim are one statement each (issue 30,
    # sixth session): still in their order, the first that fails is the one reported.
    @pytest.mark.parametrize(("change", "message"), [
        ({"worker_id": "", "generations": 2}, "worker_id must be"),
        ({"generations": 2, "outputs": 3}, "run_ids and generations must be arrays"),
        ({"outputs": 3, "batch_size": 0}, "outputs must be NULL or as long"),
        ({"deployment_ref": "", "batch_size": 0}, "deployment_ref must be"),
        ({"batch_size": 0, "max_concurrency": 0}, "batch_size must be between"),
    ])
    async def test_the_first_failing_check_is_reported(self, conn, change, message):
        done = await make_run(conn, "running")
        await enqueue(conn)
        before = await table_state(conn)

        with pytest.raises(asyncpg.PostgresError, match=message) as raised:
            async with conn.transaction():
                await conn.fetch(
                    COMPLETE_AND_CLAIM, change.get("deployment_ref", DEPLOYMENT),
                    change.get("worker_id", WORKER), [done.run_id],
                    [done.generation] * change.get("generations", 1),
                    ["{}"] * change["outputs"] if "outputs" in change else None,
                    None, change.get("max_concurrency"), change.get("batch_size", 1), LEASE,
                    at(1))

        assert raised.value.sqlstate == "ZP008"
        assert await table_state(conn) == before

    async def test_a_scope_that_names_no_run_is_refused(self, conn):
        with pytest.raises(asyncpg.PostgresError) as raised:
            await conn.fetch(
                """SELECT * FROM zeroth_test.complete_and_claim(deployment_ref => 'd',
                       worker_id => 'w', run_ids => '{}', generations => '{}',
                       workspace_id => 'ws', max_concurrency => 2)""")
        assert raised.value.sqlstate in ("ZP006", "ZP008")


class TestScope:
    async def test_a_worker_of_another_tenant_completes_and_claims_nothing_there(self, conn):
        theirs = await make_run(conn, "running", tenant_id="globex")
        their_pending = await enqueue(conn, tenant_id="globex")

        rows = await complete_and_claim(conn, [(theirs.run_id, theirs.generation)],
                                        tenant_id="acme")

        assert [(r["completed"], r["run_id"]) for r in rows] == [([False], None)]
        assert (await run_row(conn, theirs.run_id, tenant_id="globex"))["status"] == "running"
        assert (await run_row(conn, their_pending, tenant_id="globex"))["status"] == "pending"
