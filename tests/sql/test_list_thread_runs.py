"""zeroth.list_thread_runs and zeroth.get_thread_run: scoped reads of a thread's runs."""

from __future__ import annotations

import json
import uuid

from helpers import at
from thread_calls import OWNER, THREAD, admit, fenced, own_running

LIST = """SELECT run_id, status::text AS status, queued, wait_reason FROM zeroth.list_thread_runs(
              thread_id => $1, tenant_id => $2, max_runs => $3)"""
GET = """SELECT run_id, thread_id, status::text AS status, queued, lease_worker_id,
                lease_generation, accounting::text AS accounting, resumable
           FROM zeroth.get_thread_run(run_id => $1, tenant_id => $2)"""


class TestListThreadRuns:
    async def test_newest_first_with_status_and_queue_flag(self, conn):
        first = await own_running(conn)
        second = (await admit(conn, strategy="enqueue", now=at(1)))["run_id"]
        third = (await admit(conn, strategy="enqueue", now=at(2)))["run_id"]
        assert await fenced(conn, "complete_run", first, OWNER, 1, now=at(3))

        rows = await conn.fetch(LIST, THREAD, None, 20)

        assert [(r["run_id"], r["status"], r["queued"]) for r in rows] == [
            (third, "waiting", True), (second, "pending", False), (first, "completed", False)]
        assert rows[0]["wait_reason"] == "thread_queue"

    async def test_limit_and_scope(self, conn):
        for n in range(3):
            await admit(conn, strategy="enqueue", now=at(n))
        await admit(conn, tenant_id="acme")

        assert len(await conn.fetch(LIST, THREAD, None, 2)) == 2
        assert len(await conn.fetch(LIST, THREAD, "acme", 20)) == 1
        assert await conn.fetch(LIST, "no-such-thread", None, 20) == []
        assert await conn.fetch(LIST, THREAD, None, 0) == []


class TestGetThreadRun:
    async def test_one_run_with_its_lease_and_accounting(self, conn):
        run_id = await own_running(conn)
        assert await fenced(conn, "update_run_progress", run_id, OWNER, 1, now=at(1),
                            accounting={"total_tokens": 7})

        row = await conn.fetchrow(GET, run_id, None)

        assert (row["thread_id"], row["status"], row["queued"], row["lease_worker_id"],
                row["lease_generation"], row["resumable"]) == (
            THREAD, "running", False, OWNER, 1, False)
        assert json.loads(row["accounting"]) == {"total_tokens": 7}

    async def test_unknown_or_other_scope_is_no_row(self, conn):
        run_id = (await admit(conn, tenant_id="acme"))["run_id"]

        assert await conn.fetch(GET, uuid.uuid4(), None) == []
        assert await conn.fetch(GET, run_id, None) == []
        assert len(await conn.fetch(GET, run_id, "acme")) == 1
