"""The run event stream (issue 34, item 1): zeroth.append_run_event, zeroth.read_run_events,
zeroth.run_events_key and the END the settle path writes.

The fence cases of append_run_event (another worker or generation, expired, taken over, cleared,
no live lease, another scope, bad fence arguments, roles) are its row of
tests/sql/test_fenced_conformance.py; this module tests what is particular to the stream:
numbering, bounds, END by every path that ends a run, the NOTIFY hint, and the ordering of two
appenders (a reader never sees a later number commit before an earlier one).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from uuid import UUID

import asyncpg
import pytest
from helpers import WORKER, at, make_run, run_row, wait_until
from thread_calls import OWNER, fenced, own_running, take_over

READ = """SELECT event_id, kind, name, data::text AS data, lease_generation, created_at
            FROM zeroth.read_run_events(run_id => $1, after => $2, max_events => $3,
                                        tenant_id => $4, workspace_id => $5)"""


async def append(conn: asyncpg.Connection, run_id: UUID, name: str = "token", data: Any = 1, *,
                 worker: str = WORKER, generation: int = 1, now: Any = None,
                 **kwargs: Any) -> Any:
    return await conn.fetchval(
        """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => $3,
               name => $4, data => $5::text::jsonb, tenant_id => $6, workspace_id => $7,
               notify => $8, now_override => $9)""",
        run_id, worker, generation, name, None if data is None else json.dumps(data),
        kwargs.get("tenant_id"), kwargs.get("workspace_id"), kwargs.get("notify", True),
        now or at(5))


async def read(conn: asyncpg.Connection, run_id: UUID, after: int = 0, max_events: int = 100,
               *, tenant_id: str | None = None, workspace_id: str | None = None
               ) -> list[dict[str, Any]]:
    rows = await conn.fetch(READ, run_id, after, max_events, tenant_id, workspace_id)
    return [{**dict(r), "data": json.loads(r["data"])} for r in rows]


def ids(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["event_id"], e["kind"]) for e in events]


async def stored(conn: asyncpg.Connection, run_id: UUID) -> list[tuple[int, str]]:
    return [(r["event_id"], r["kind"]) for r in await conn.fetch(
        "SELECT e.event_id, e.kind FROM zeroth.run_events e WHERE e.run_id = $1 "
        "ORDER BY e.event_id", run_id)]


class TestAppend:
    async def test_events_are_numbered_per_run_from_one_in_order(self, conn):
        a = await make_run(conn, "running")
        b = await make_run(conn, "running")

        got = [await append(conn, a.run_id, "token", {"t": "he"}),
               await append(conn, b.run_id, "token", {"t": "x"}),
               await append(conn, a.run_id, "tool_call", [1, 2], now=at(6)),
               await append(conn, a.run_id, "token", 0)]

        assert got == [1, 1, 2, 3]
        events = await read(conn, a.run_id)
        assert [(e["event_id"], e["name"], e["data"]) for e in events] == [
            (1, "token", {"t": "he"}), (2, "tool_call", [1, 2]), (3, "token", 0)]
        assert {e["kind"] for e in events} == {"event"}
        assert [e["lease_generation"] for e in events] == [1, 1, 1]
        assert [e["created_at"] for e in events] == [at(5), at(6), at(5)]

    # The holder of a claim not started gets ZP003 and appends nothing:
    # test_fenced_conformance.py (the holder in a state the function does not take).

    async def test_an_old_holders_append_after_a_takeover_lands_nothing(self, conn):
        run_id = await own_running(conn, worker_id=OWNER)
        assert await append(conn, run_id, worker=OWNER) == 1
        # The lease lapses past the grace; claim_for_takeover ends the thread run.
        taken = await take_over(conn, run_id, now=at(400))
        assert taken
        assert taken[0]["run_id"] == run_id

        assert await append(conn, run_id, worker=OWNER, now=at(401)) is None

        # (the takeover ended the run through zeroth._settle, which stores its END)
        assert await stored(conn, run_id) == [(1, "event"), (2, "end")]

    @pytest.mark.parametrize(("name", "data"), [
        (None, 1), ("", 1), ("x" * 201, 1), ("line\nbreak", 1), ("tab\tbed", 1),
        ("token", None), ("token", {"big": "x" * 65536})])
    async def test_a_bad_name_or_data_raises_zp008_and_appends_nothing(self, conn, name, data):
        lease = await make_run(conn, "running")
        before = dict(await run_row(conn, lease.run_id))

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await append(conn, lease.run_id, name, data)

        assert info.value.sqlstate == "ZP008"
        assert await stored(conn, lease.run_id) == []
        assert dict(await run_row(conn, lease.run_id)) == before

    async def test_notify_null_raises_zp008(self, conn):
        lease = await make_run(conn, "running")

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await append(conn, lease.run_id, notify=None)

        assert info.value.sqlstate == "ZP008"
        assert await stored(conn, lease.run_id) == []

    async def test_the_largest_data_allowed_is_stored(self, conn):
        lease = await make_run(conn, "running")
        data = "x" * (65536 - 2)  # its JSON text: the quotes make 64 kB exactly

        assert await append(conn, lease.run_id, "big", data) == 1


class TestRead:
    async def test_after_and_max_events_page_through_the_stream(self, conn):
        lease = await make_run(conn, "running")
        for i in range(5):
            await append(conn, lease.run_id, "token", i)

        assert ids(await read(conn, lease.run_id, 0, 2)) == [(1, "event"), (2, "event")]
        assert ids(await read(conn, lease.run_id, 2, 2)) == [(3, "event"), (4, "event")]
        assert ids(await read(conn, lease.run_id, 4, 2)) == [(5, "event")]
        assert await read(conn, lease.run_id, 5) == []

    @pytest.mark.parametrize(("after", "max_events"), [(None, 10), (-1, 10), (0, 0), (0, 1001),
                                                       (0, None)])
    async def test_bad_after_or_max_events_raise_zp008(self, conn, after, max_events):
        lease = await make_run(conn, "running")

        with pytest.raises(asyncpg.PostgresError) as info:
            await read(conn, lease.run_id, after, max_events)

        assert info.value.sqlstate == "ZP008"

    async def test_a_workspace_without_a_tenant_raises_zp006(self, conn):
        lease = await make_run(conn, "running")

        with pytest.raises(asyncpg.PostgresError) as info:
            await read(conn, lease.run_id, workspace_id="w")

        assert info.value.sqlstate == "ZP006"

    async def test_another_scopes_run_reads_as_not_found(self, conn):
        lease = await make_run(conn, "running", tenant_id="acme")
        await append(conn, lease.run_id, "secret", {"s": 1}, tenant_id="acme")

        for scope in ({}, {"tenant_id": "other"}, {"tenant_id": "acme", "workspace_id": "w"}):
            events = await read(conn, lease.run_id, **scope)
            assert [(e["kind"], e["data"]) for e in events] == [
                ("end", {"status": None, "outcome": "not_found"})]
        assert ids(await read(conn, lease.run_id, tenant_id="acme")) == [(1, "event")]

    async def test_a_running_run_without_events_reads_nothing(self, conn):
        lease = await make_run(conn, "running")

        assert await read(conn, lease.run_id) == []


class TestEnd:
    """END reaches a reader by every path that ends a run: stored by the settle path for a run
    that has events, made by read_run_events from the status otherwise."""

    async def ended(self, conn, run_id, after=0):
        events = await read(conn, run_id, after)
        assert events, events
        assert events[-1]["kind"] == "end", events
        assert [e for e in events if e["kind"] == "end"] == events[-1:]
        return events

    @pytest.mark.parametrize(("call", "kwargs", "outcome"), [
        ("complete_run", {"output": {"ok": True}}, "completed"),
        ("fail_run", {"error": {"e": 1}, "retryable": False}, "failed"),
        ("cancel_run", {}, "cancelled"),
    ])
    async def test_the_settle_path_stores_end_after_the_last_event(self, conn, call, kwargs,
                                                                   outcome):
        lease = await make_run(conn, "running")
        await append(conn, lease.run_id, "token", "a")
        await append(conn, lease.run_id, "token", "b")

        assert await fenced(conn, call, lease.run_id, WORKER, 1, now=at(9), **kwargs)

        status = {"completed": "completed", "failed": "failed", "cancelled": "cancelled"}[outcome]
        assert await stored(conn, lease.run_id) == [(1, "event"), (2, "event"), (3, "end")]
        events = await self.ended(conn, lease.run_id)
        assert events[-1]["data"] == {"status": status, "outcome": outcome}
        assert (events[-1]["event_id"], events[-1]["lease_generation"],
                events[-1]["created_at"]) == (3, 1, at(9))

    async def test_a_dead_letter_stores_end_with_its_outcome(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)
        await append(conn, lease.run_id)

        assert await fenced(conn, "fail_run", lease.run_id, WORKER, 1, now=at(9),
                            error={"e": 1}, retryable=True) == "dead_lettered"

        events = await self.ended(conn, lease.run_id)
        assert events[-1]["data"] == {"status": "failed", "outcome": "dead_lettered"}
        assert await stored(conn, lease.run_id) == [(1, "event"), (2, "end")]

    async def test_a_retry_is_no_end(self, conn):
        lease = await make_run(conn, "running", max_attempts=3)
        await append(conn, lease.run_id)

        assert await fenced(conn, "fail_run", lease.run_id, WORKER, 1, now=at(9),
                            error={"e": 1}, retryable=True) == "retry_scheduled"

        assert ids(await read(conn, lease.run_id)) == [(1, "event")]
        assert await stored(conn, lease.run_id) == [(1, "event")]

    @pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
    async def test_a_run_that_emitted_nothing_gets_no_row_and_reads_end(self, conn, status):
        lease = await make_run(conn, status)

        assert await stored(conn, lease.run_id) == []
        events = await self.ended(conn, lease.run_id)
        assert ids(events) == [(1, "end")]
        assert events[0]["data"]["status"] == status

    async def test_a_cancel_of_a_pending_run_reads_end(self, conn):
        lease = await make_run(conn, "pending")

        assert await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(3)) == "cancelled"

        events = await self.ended(conn, lease.run_id)
        assert events[-1]["data"] == {"status": "cancelled", "outcome": "cancelled"}

    async def test_a_cancel_request_of_a_running_run_whose_lease_lapsed_reads_end(self, conn):
        lease = await make_run(conn, "running")
        await append(conn, lease.run_id)

        outcome = await conn.fetchval(
            "SELECT zeroth_test.request_cancel(run_id => $1, now_override => $2)",
            lease.run_id, at(300))

        assert outcome == "cancelled"
        events = await self.ended(conn, lease.run_id)
        assert ids(events) == [(1, "event"), (2, "end")]

    async def test_a_takeover_that_ends_a_run_reads_end_after_its_events(self, conn):
        run_id = await own_running(conn, worker_id=OWNER)
        await append(conn, run_id, worker=OWNER)

        taken = await take_over(conn, run_id, now=at(400))

        assert taken[0]["status"] in ("failed", "cancelled")
        events = await self.ended(conn, run_id)
        assert ids(events) == [(1, "event"), (2, "end")]
        assert events[-1]["data"]["status"] == taken[0]["status"]

    async def test_orphan_recovery_that_dead_letters_a_run_reads_end(self, conn):
        lease = await make_run(conn, "running", max_attempts=1)
        await append(conn, lease.run_id)

        await conn.fetch(
            """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => $1, worker_id => 'w2',
                   now_override => $2)""", (await run_row(conn, lease.run_id))["deployment_ref"],
            at(400))

        events = await self.ended(conn, lease.run_id)
        assert ids(events) == [(1, "event"), (2, "end")]
        assert events[-1]["data"] == {"status": "failed", "outcome": "dead_lettered"}

    async def test_orphan_recovery_that_resumes_a_run_is_no_end(self, conn):
        lease = await make_run(conn, "running", max_attempts=3)
        await append(conn, lease.run_id)

        rows = await conn.fetch(
            """SELECT run_id, lease_generation FROM zeroth_test.claim_orphaned(
                   deployment_ref => $1, worker_id => 'w2', now_override => $2)""",
            (await run_row(conn, lease.run_id))["deployment_ref"], at(400))

        assert [r["run_id"] for r in rows if r["run_id"]] == [lease.run_id]
        assert ids(await read(conn, lease.run_id)) == [(1, "event")]
        # The new holder numbers on; the old one is fenced out.
        assert await append(conn, lease.run_id, worker="w2", generation=2, now=at(401)) == 2
        assert await append(conn, lease.run_id, generation=1, now=at(401)) is None

    async def test_a_pruned_run_reads_as_not_found_and_its_events_are_gone(self, conn):
        lease = await make_run(conn, "running")
        await append(conn, lease.run_id)
        assert await fenced(conn, "complete_run", lease.run_id, WORKER, 1, now=at(9))

        assert await conn.fetchval(
            "SELECT zeroth_test.prune_runs(older_than => '1 second', now_override => $1)",
            at(100)) >= 1

        assert await stored(conn, lease.run_id) == []
        events = await read(conn, lease.run_id, after=2)
        assert [(e["event_id"], e["kind"], e["data"]) for e in events] == [
            (3, "end", {"status": None, "outcome": "not_found"})]

    async def test_a_reader_past_the_end_gets_the_end_again(self, conn):
        lease = await make_run(conn, "running")
        await append(conn, lease.run_id)
        assert await fenced(conn, "complete_run", lease.run_id, WORKER, 1, now=at(9))
        quiet = await make_run(conn, "completed")

        assert ids(await read(conn, lease.run_id, after=2)) == [(2, "end")]
        assert ids(await read(conn, lease.run_id, after=7)) == [(2, "end")]
        assert ids(await read(conn, quiet.run_id, after=1)) == [(1, "end")]

    async def test_end_waits_for_the_page_that_reaches_the_last_event(self, conn):
        lease = await make_run(conn, "running")
        for _ in range(3):
            await append(conn, lease.run_id)
        await fenced(conn, "cancel_run", lease.run_id, WORKER, 1, now=at(9))

        assert ids(await read(conn, lease.run_id, 0, 2)) == [(1, "event"), (2, "event")]
        assert ids(await read(conn, lease.run_id, 2, 2)) == [(3, "event"), (4, "end")]

    async def test_a_batch_completion_stores_end_only_for_runs_with_events(self, conn):
        loud = await make_run(conn, "running")
        quiet = await make_run(conn, "running")
        await append(conn, loud.run_id)

        rows = await conn.fetch(
            """SELECT run_id, completed FROM zeroth_test.complete_runs(worker_id => $1,
                   run_ids => $2::uuid[], generations => ARRAY[1, 1]::bigint[],
                   now_override => $3)""", WORKER, [loud.run_id, quiet.run_id], at(9))

        assert all(r["completed"] for r in rows)
        assert await stored(conn, loud.run_id) == [(1, "event"), (2, "end")]
        assert await stored(conn, quiet.run_id) == []


class TestNotify:
    """NOTIFY zeroth_run_events with the run's opaque key: on an append (unless notify =>
    false) and on the END of a run with events; never for a run that emitted nothing."""

    async def listen(self, connect) -> tuple[asyncpg.Connection, asyncio.Queue[str]]:
        listener = await connect()
        heard: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("zeroth_run_events", lambda *a: heard.put_nowait(a[3]))
        return listener, heard

    async def drained(self, listener: asyncpg.Connection, heard: asyncio.Queue[str]) -> list[str]:
        await listener.execute("SELECT 1")  # a round trip: what was sent before has arrived
        out = []
        while not heard.empty():
            out.append(heard.get_nowait())
        return out

    async def test_an_append_and_the_end_notify_the_runs_key(self, connect):
        conn = await connect()
        listener, heard = await self.listen(connect)
        lease = await make_run(conn, "running")
        quiet = await make_run(conn, "running")
        key = await conn.fetchval("SELECT zeroth.run_events_key(run_id => $1)", lease.run_id)
        assert len(key) == 32
        assert str(lease.run_id) not in key

        await append(conn, lease.run_id)
        await append(conn, lease.run_id, notify=False)
        assert await self.drained(listener, heard) == [key]

        await fenced(conn, "complete_run", quiet.run_id, WORKER, 1, now=at(9))
        assert await self.drained(listener, heard) == []

        await fenced(conn, "complete_run", lease.run_id, WORKER, 1, now=at(9))
        assert await self.drained(listener, heard) == [key]

    async def test_the_key_differs_per_run_and_scope(self, conn):
        lease = await make_run(conn, "running")
        keys = {await conn.fetchval(
            "SELECT zeroth.run_events_key(run_id => $1, tenant_id => $2, workspace_id => $3)",
            run_id, tenant, workspace)
            for run_id in (lease.run_id, UUID(int=1))
            for tenant, workspace in ((None, None), ("acme", None), ("acme", "w"))}
        assert len(keys) == 6


class TestTwoAppenders:
    """Numbers are taken under the run's row lock: an append waits for an uncommitted one, so
    a reader never sees number N commit while a smaller number is still to come."""

    async def blocked(self, watcher: asyncpg.Connection, pid: int) -> None:
        async def waits() -> bool:
            return await watcher.fetchval(
                "SELECT a.wait_event_type FROM pg_stat_activity a WHERE a.pid = $1",
                pid) == "Lock"
        await wait_until(waits, "the second append to queue behind the first", within=60)

    @pytest.mark.parametrize("first_commits", [True, False])
    async def test_a_second_append_waits_for_the_first_and_numbers_after_it(
            self, connect, first_commits):
        setup = await connect()
        first, second, reader = await connect(), await connect(), await connect()
        lease = await make_run(setup, "running")

        tx = first.transaction()
        await tx.start()
        assert await append(first, lease.run_id, "a") == 1
        later = asyncio.create_task(append(second, lease.run_id, "b"))
        await self.blocked(reader, second.get_server_pid())

        assert await read(reader, lease.run_id) == []
        if first_commits:
            await tx.commit()
        else:
            await tx.rollback()

        number = await later
        events = await read(reader, lease.run_id)
        if first_commits:
            assert number == 2
            assert [(e["event_id"], e["name"]) for e in events] == [(1, "a"), (2, "b")]
        else:
            assert number == 1
            assert [(e["event_id"], e["name"]) for e in events] == [(1, "b")]
