"""zeroth.complete_run: running → completed for the live lease holder; the lease and its
admission slot are given up in the same call."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import (
    DEPLOYMENT,
    WORKER,
    at,
    claim,
    enqueue,
    make_run,
    run_row,
    wakeup_key,
    wakeup_listener,
)

OTHER = "worker-b"
SOON = at(1)

COMPLETE = """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                  output => $4::text::jsonb, now_override => $5)"""


async def complete(conn: asyncpg.Connection, run_id: UUID | None, output: Any = None, *,
                   worker_id: str | None = WORKER, generation: int | None = 1,
                   now: datetime = SOON, raw: bool = False) -> bool:
    text = output if raw or output is None else json.dumps(output)
    return await conn.fetchval(  # type: ignore[no-any-return]
        COMPLETE, run_id, worker_id, generation, text, now)


async def slots(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return await conn.fetch(  # type: ignore[no-any-return]
        """SELECT s.slot_no, s.run_id, s.lease_worker_id, s.lease_generation, s.lease_expires_at
             FROM zeroth_test.slot_leases s WHERE s.deployment_ref = $1 ORDER BY s.slot_no""",
        DEPLOYMENT)


class TestComplete:
    async def test_running_run_completes_with_output_and_gives_up_its_lease(self, conn):
        lease = await make_run(conn, "running")
        before = await run_row(conn, lease.run_id)

        assert await complete(conn, lease.run_id, {"answer": 42}, now=at(5)) is True

        row = await run_row(conn, lease.run_id)
        assert row["status"] == "completed"
        assert json.loads(row["output"]) == {"answer": 42}
        assert (row["finished_at"], row["updated_at"]) == (at(5), at(5))
        assert [row[c] for c in ("lease_worker_id", "lease_acquired_at", "lease_expires_at",
                                 "admission_slot", "recovery_checkpoint_id")] == [None] * 5
        # The generation is a fencing token: giving a lease up never resets it.
        assert row["lease_generation"] == before["lease_generation"]
        assert (row["attempts"], row["started_at"]) == (before["attempts"], before["started_at"])
        assert row["dead_lettered_at"] is None

    @pytest.mark.parametrize("output", [None, "null"], ids=["sql-null", "json-null"])
    async def test_missing_or_json_null_output_stores_sql_null(self, conn, output):
        lease = await make_run(conn, "running")

        assert await complete(conn, lease.run_id, output, raw=True) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["output"]) == ("completed", None)

    async def test_expiry_exactly_equal_to_now_still_completes(self, conn):
        lease = await make_run(conn, "running")

        assert await complete(conn, lease.run_id, {"ok": True}, now=at(60)) is True

        assert (await run_row(conn, lease.run_id))["status"] == "completed"

    async def test_recovered_run_is_completed_by_its_new_owner(self, conn):
        lease = await make_run(conn, "running")
        taken = await conn.fetch(
            """SELECT run_id FROM zeroth_test.claim_orphaned(deployment_ref => $1,
                   worker_id => $2, now_override => $3)""", DEPLOYMENT, OTHER, at(61))
        assert [r["run_id"] for r in taken] == [lease.run_id]

        assert await complete(conn, lease.run_id, {"ok": True}, worker_id=OTHER, generation=2,
                              now=at(62)) is True

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["recovery_checkpoint_id"]) == ("completed", None)


class TestAdmissionSlot:
    async def test_completion_frees_the_slot_for_the_next_claim(self, conn):
        a = await make_run(conn, "running", max_concurrency=1)
        b = await enqueue(conn)
        assert await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(2)) == []

        assert await complete(conn, a.run_id, {"ok": True}, now=at(3)) is True

        assert [tuple(s) for s in await slots(conn)] == [(1, None, None, None, None)]
        taken = await claim(conn, worker_id=OTHER, max_concurrency=1, now=at(3))
        assert [r["run_id"] for r in taken] == [b]
        assert [(s["run_id"], s["lease_worker_id"]) for s in await slots(conn)] == [(b, OTHER)]


class TestWakeup:
    """Committed sessions on a fresh database: NOTIFY is delivered only at commit."""

    SENTINEL = "sentinel"

    async def listen(self, connect: Any) -> asyncio.Queue[str]:
        """A listener that waits for work of the default scope like an idle worker."""
        return await wakeup_listener(connect)

    async def next_payload(self, received: asyncio.Queue[str]) -> str:
        # The guard only stops a hung test; nothing here is a timing assertion.
        return await asyncio.wait_for(received.get(), timeout=30)

    async def test_completion_that_frees_a_slot_notifies_a_wakeup(self, connect):
        worker = await connect()
        lease = await make_run(worker, "running", max_concurrency=1)
        received = await self.listen(connect)

        assert await complete(worker, lease.run_id, {"ok": True}) is True
        await worker.execute("SELECT pg_notify('zeroth_wakeup', $1)", self.SENTINEL)

        key = await wakeup_key(worker, DEPLOYMENT, "default", None)
        assert await self.next_payload(received) == key
        assert await self.next_payload(received) == self.SENTINEL

    async def test_completion_without_a_slot_sends_no_wakeup(self, connect):
        worker = await connect()
        lease = await make_run(worker, "running")
        received = await self.listen(connect)

        assert await complete(worker, lease.run_id, {"ok": True}) is True
        # Notifications arrive in commit order: the sentinel comes first only if none was sent.
        await worker.execute("SELECT pg_notify('zeroth_wakeup', $1)", self.SENTINEL)

        assert await self.next_payload(received) == self.SENTINEL

    async def test_refused_completion_sends_no_wakeup(self, connect):
        worker = await connect()
        lease = await make_run(worker, "running", max_concurrency=1)
        received = await self.listen(connect)

        assert await complete(worker, lease.run_id, {"x": 1}, worker_id=OTHER) is False
        await worker.execute("SELECT pg_notify('zeroth_wakeup', $1)", self.SENTINEL)

        assert await self.next_payload(received) == self.SENTINEL


class TestCompletionKeepsCommittedOutput:
    async def test_completing_without_output_keeps_what_commit_fenced_wrote(self, conn):
        lease = await make_run(conn, "running")
        assert await conn.fetchval(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                   columns => '{"output": {"streamed": 3}}', now_override => $4)""",
            lease.run_id, lease.worker_id, lease.generation, at(1))

        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, lease.worker_id, lease.generation, at(2))

        row = await run_row(conn, lease.run_id)
        assert (row["status"], row["output"]) == ("completed", '{"streamed": 3}')

    async def test_completing_with_json_null_clears_the_output(self, conn):
        lease = await make_run(conn, "running")
        await conn.fetchval(
            """SELECT zeroth_test.commit_fenced(run_id => $1, worker_id => $2, generation => $3,
                   columns => '{"output": {"streamed": 3}}', now_override => $4)""",
            lease.run_id, lease.worker_id, lease.generation, at(1))

        assert await conn.fetchval(
            """SELECT zeroth_test.complete_run(run_id => $1, worker_id => $2, generation => $3,
                   output => 'null', now_override => $4)""",
            lease.run_id, lease.worker_id, lease.generation, at(2))

        assert (await run_row(conn, lease.run_id))["output"] is None
