"""The run event stream under attack: a worker event named like END, and the
stream of a run redriven after it ended (the old END, the END number a reader was given)."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import WORKER, at, claim, make_run
from test_run_events import append, fenced, ids, read

REDRIVE = "SELECT zeroth_test.redrive_run(run_id => $1, now_override => $2)"


class TestEndCannotBeForged:
    async def test_a_worker_event_named_end_is_refused(self, conn):
        # The SSE endpoint writes `event: <name>`; END is `event: end`. A handler's event named
        # `end` would close the operator's EventSource as if the run had ended.
        lease = await make_run(conn, "running")

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await append(conn, lease.run_id, "end", {"status": "completed"})

        assert info.value.sqlstate == "ZP008"


class TestRedrivenStream:
    async def test_a_redriven_run_reads_no_end_before_it_ends_again(self, conn):
        lease = await make_run(conn, "running")
        await append(conn, lease.run_id)
        assert await fenced(conn, "fail_run", lease.run_id, WORKER, 1, now=at(9),
                            error={"e": 1}, retryable=False) == "failed"
        assert ids(await read(conn, lease.run_id)) == [(1, "event"), (2, "end")]

        await conn.execute(REDRIVE, lease.run_id, at(10))

        # pending again: a subscriber from the start must not be told the run ended
        assert "end" not in [kind for _, kind in ids(await read(conn, lease.run_id))]

    async def test_an_end_number_a_reader_was_given_is_never_reused(self, conn):
        lease = await make_run(conn, "failed")  # emitted nothing: END made from the status
        end = await read(conn, lease.run_id)
        assert ids(end) == [(1, "end")]

        await conn.execute(REDRIVE, lease.run_id, at(10))
        rows = await claim(conn, now=at(11))
        assert [r["run_id"] for r in rows] == [lease.run_id]
        generation = rows[0]["lease_generation"]
        assert await conn.fetchval(
            """SELECT zeroth_test.start_run(run_id => $1, worker_id => $2, generation => $3,
                   now_override => $4)""", lease.run_id, WORKER, generation, at(11))
        new_id = await append(conn, lease.run_id, generation=generation, now=at(12))

        # A reader that got END 1 and comes back with Last-Event-ID 1 must see the new event.
        assert new_id > end[0]["event_id"]
        assert [e["event_id"] for e in await read(conn, lease.run_id, after=1)] == [new_id]


class TestOneEndVocabulary:
    async def test_a_stored_end_states_its_outcome_as_a_made_one_does(self, conn):
        # Two runs ended alike by the orphan sweep (no attempt left): one emitted an event (END
        # stored by zeroth._settle), one nothing (END made by read_run_events). A subscriber must
        # not get `recovery_exhausted` from one and `dead_lettered` from the other.
        loud = await make_run(conn, "running", max_attempts=1)
        quiet = await make_run(conn, "running", max_attempts=1)
        await append(conn, loud.run_id)

        await conn.fetch(
            """SELECT * FROM zeroth_test.claim_orphaned(deployment_ref => 'deploy-a',
                   worker_id => 'w2', now_override => $1)""", at(400))

        ends = [(await read(conn, r.run_id))[-1] for r in (loud, quiet)]
        assert [e["kind"] for e in ends] == ["end", "end"]
        assert ends[0]["data"] == ends[1]["data"] == {"status": "failed",
                                                       "outcome": "dead_lettered"}


class TestAfterBounds:
    async def test_the_largest_after_for_an_unknown_run_is_zp008_not_an_overflow(self, conn):
        from uuid import uuid4

        with pytest.raises(asyncpg.PostgresError) as info:
            async with conn.transaction():
                await read(conn, uuid4(), after=2**63 - 1)  # END would be numbered after + 1

        assert info.value.sqlstate == "ZP008"
        assert [(e["event_id"], e["data"]["outcome"])
                for e in await read(conn, uuid4(), after=2**63 - 2)] == [(2**63 - 1, "not_found")]
