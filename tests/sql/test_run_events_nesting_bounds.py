"""An event whose JSON nests deeper than a Python reader can decode.
Any language may append through SQL; the Python readers (LeaseManager.stream, the SSE endpoint)
decode every event with json.loads, so one such event would stop every subscriber of the run
at it, for ever (each re-read meets it again)."""

from __future__ import annotations

import asyncpg
import pytest
from helpers import WORKER, at, make_run

from zeroth_pg import streams


@pytest.mark.parametrize("depth", [257, 5000])
async def test_an_event_nested_deeper_than_a_reader_can_decode_is_refused(conn, depth):
    lease = await make_run(conn, "running")
    deep = "[" * depth + "]" * depth

    # Stored, it would stop every reader of the run (Python's json.loads refuses the depth).
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with conn.transaction():
            await conn.fetchval(
                """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2,
                       generation => 1, name => 'deep', data => $3::text::jsonb,
                       now_override => $4)""", lease.run_id, WORKER, deep, at(5))
    assert refused.value.sqlstate == "ZP008"


async def test_an_event_nested_256_levels_is_stored_and_read(conn):
    lease = await make_run(conn, "running")
    deep = "[" * 256 + "]" * 256

    assert await conn.fetchval(
        """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => 1,
               name => 'deep', data => $3::text::jsonb, now_override => $4)""",
        lease.run_id, WORKER, deep, at(5)) == 1
    rows = await conn.fetch(
        """SELECT event_id, kind, name, data::text AS data, lease_generation, created_at
             FROM zeroth.read_run_events(run_id => $1)""", lease.run_id)
    assert [streams.run_event(r).event_id for r in rows] == [1]


@pytest.mark.parametrize("number", ["1" + "0" * 5000, "1e5000", "-1e400"])
async def test_a_number_no_reader_can_decode_is_refused(conn, number):
    # PostgreSQL prints 1e5000 as its 5001 digits; Python's json.loads refuses an integer of more
    # than 4,300 digits (ValueError), and no double holds it: every subscriber would stop there.
    lease = await make_run(conn, "running")

    with pytest.raises(asyncpg.PostgresError) as info:
        async with conn.transaction():
            await conn.fetchval(
                """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2,
                       generation => 1, name => 'big', data => $3::text::jsonb,
                       now_override => $4)""", lease.run_id, WORKER, f"[{number}]", at(5))

    assert info.value.sqlstate == "ZP008"


async def test_a_double_sized_number_is_stored_and_read(conn):
    lease = await make_run(conn, "running")
    await conn.fetchval(
        """SELECT zeroth_test.append_run_event(run_id => $1, worker_id => $2, generation => 1,
               name => 'big', data => '[1e300, -1e300, 123456789012345678901234567890]'::jsonb,
               now_override => $3)""", lease.run_id, WORKER, at(5))
    rows = await conn.fetch(
        """SELECT event_id, kind, name, data::text AS data, lease_generation, created_at
             FROM zeroth.read_run_events(run_id => $1)""", lease.run_id)
    assert streams.run_event(rows[0]).data[2] == 123456789012345678901234567890
